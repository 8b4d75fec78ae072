// The CUDA driver calls of our GPU code (gpu.cc, gpu_graph.cc), looked up
// in the libcuda.so.1 that MLX's libmlx has loaded: nothing here links
// against the driver, which exists only on GPU hosts. Built with the `cuda`
// feature only.
#pragma once

#include <cuda.h>

#include <string>

namespace mlxcel::fast::gpu {

struct Driver {
  CUresult (*load)(CUmodule*, const void*) = nullptr;
  CUresult (*function)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*error)(CUresult, const char**) = nullptr;
  CUresult (*alloc_async)(CUdeviceptr*, size_t, CUstream) = nullptr;
  CUresult (*free_async)(CUdeviceptr, CUstream) = nullptr;
  CUresult (*free)(CUdeviceptr) = nullptr;
  CUresult (*alloc_host)(void**, size_t) = nullptr;
  CUresult (*free_host)(void*) = nullptr;
  CUresult (*to_host)(void*, CUdeviceptr, size_t) = nullptr;
  // Step graphs (gpu_graph.cc).
  CUresult (*graph_create)(CUgraph*, unsigned) = nullptr;
  CUresult (*graph_add_kernel)(CUgraphNode*, CUgraph, const CUgraphNode*, size_t,
                               const CUDA_KERNEL_NODE_PARAMS*) = nullptr;
  CUresult (*graph_instantiate)(CUgraphExec*, CUgraph, unsigned long long) = nullptr;
  CUresult (*graph_launch)(CUgraphExec, CUstream) = nullptr;
  CUresult (*graph_exec_destroy)(CUgraphExec) = nullptr;
  CUresult (*graph_destroy)(CUgraph) = nullptr;
  CUresult (*to_device_async)(CUdeviceptr, const void*, size_t, CUstream) = nullptr;
  CUresult (*to_host_async)(void*, CUdeviceptr, size_t, CUstream) = nullptr;
  CUresult (*synchronize)(CUstream) = nullptr;
};

/// The driver's calls (loaded at the first use; throws when libcuda.so.1
/// or one of the calls is missing).
const Driver& driver();

/// Throws "mlxcel GPU kernels: WHAT: REASON" unless `r` is CUDA_SUCCESS.
void check(CUresult r, const std::string& what);

}  // namespace mlxcel::fast::gpu
