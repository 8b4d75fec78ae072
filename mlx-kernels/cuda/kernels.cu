// mlxcel's CUDA kernels, one module (`mlxcel_kernels`): the quantized
// products of a decode step (products.cuh) and of a prompt (prompt.cuh), a
// decode step's attention over the KV cache (attention.cuh), the RMS norm
// (norm.cuh) and the token embeddings (gather.cuh).
//
// Compiled ahead of time with NVRTC by `mlxcel-compile --target cuda-smXY`
// (compiler/src/cuda; the .cuh files and gpu_args.h are handed to NVRTC as
// in-memory headers), stored in the bundle, and loaded by the runtime before
// the first step; cpp/nodes/gpu.cc launches the kernels as nodes of MLX's
// CUDA command encoder. No MLX header is included: gpu_args.h is the one
// definition of the arguments both sides share.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "gpu_args.h"
#include "products.cuh"
#include "prompt.cuh"
#include "attention.cuh"
#include "norm.cuh"
#include "gather.cuh"
