// mlxcel's CUDA kernels as the GPU side of our product, RMS norm and
// cached attention nodes.
//
// The kernels (mlx-kernels/cuda/kernels.cu) are compiled ahead of time by
// `mlxcel-compile --target cuda-smXY` into the bundle's module
// `mlxcel_kernels`; the runtime hands the module to `load_module` before the
// first step. From then on the graph builder (ops.cc) builds those nodes on
// the GPU for the inputs `product_unsupported`, `norm_unsupported` and
// `attention_unsupported` accept, and their `eval_gpu` adds kernel nodes to MLX's CUDA command
// encoder. Without a loaded module (or in a build without the `cuda`
// feature) the GPU runs MLX's ops only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "mlxcel-mlx/cpp/nodes/attention.h"
#include "mlxcel-mlx/cpp/nodes/norm_rope.h"
#include "mlxcel-mlx/cpp/nodes/products.h"

namespace mlxcel::fast::gpu {

/// At most this many rows of x go to our kernels (a decode step of up to
/// this many sequences), and this many sequences and positions per sequence
/// to our attention; more (a prompt) take MLX's quantized matmul, whose tiles
/// reuse each weight across rows, and MLX's attention.
inline constexpr int kMaxRows = 32;

/// Loads the module's cubin (`names`: its `NAME.txt`, one
/// `name expression \t lowered name` per line) into MLX's CUDA context and
/// registers its kernels; returns how many. Throws with the reason when the
/// cubin does not load (wrong architecture, corrupt) or a kernel is missing.
size_t load_module(const uint8_t* cubin, size_t size, const std::string& names);

/// Whether `load_module` has succeeded in this process.
bool loaded();

/// Why our GPU kernels cannot take a product of `rows` rows of x with
/// `bits`-wide codes in `layout` ("" when they can; the CPU checks of
/// ops.cc, which admit f32, f16 and bf16 scales, all with kernels, apply
/// first).
std::string product_unsupported(int bits, int64_t rows, kern::WeightLayout layout);

/// `eval_gpu` of QuantizedProduct and QuantizedGatedProduct (an RMS norm
/// prologue folded into the product kernels).
void eval_product(mx::Stream s, const ProductSpec& spec, const std::vector<mx::array>& inputs,
                  std::vector<mx::array>& outputs);
void eval_gated(mx::Stream s, const GatedSpec& spec, const std::vector<mx::array>& inputs, mx::array& out);

/// Why our GPU norm cannot run ("" when it can: the module is loaded; the
/// f32 checks of ops.cc apply first). An RMS norm node on the GPU is what a
/// product absorbs (fusion.h), so it exists whenever the products do.
std::string norm_unsupported();

/// `eval_gpu` of RmsNorm (with or without its residual epilogue).
void eval_rms_norm(mx::Stream s, const NormSpec& spec, const std::vector<mx::array>& inputs, mx::array& out);

/// Device memory for the output `a` of one of our nodes on stream `s`
/// (stream-ordered device memory, as MLX's own ops take; gpu.cc says why
/// not MLX's allocator).
void allocate_output(mx::Stream s, mx::array& a);

/// Copies the evaluated, row-contiguous `a` into `dst` (`a.nbytes()`
/// bytes) when its memory is device memory, and returns true; false when
/// it is not (its data is then readable on the host as it is). MLX would
/// move a device buffer into freshly allocated managed memory first
/// (`Buffer::raw_ptr`), and free that later with a device-wide
/// synchronisation: about 0.45 ms for a decode step's logits on the H200,
/// where this copy takes a few microseconds.
bool copy_to_host(const mx::array& a, void* dst);

/// Why our GPU attention cannot take a cached step of `batch` sequences of
/// `seq` positions, head dimensions `dim` and `vdim` ("" when it can; the
/// shape and RoPE checks of ops.cc apply first).
std::string attention_unsupported(int batch, int seq, int dim, int vdim);

/// `eval_gpu` of CachedAttention: its outputs (the attention, then each
/// row's key and value buffers) have memory from `claim_cache_buffers`,
/// which says which buffers were `donated` (the others are copied first).
void eval_cached_attention(mx::Stream s, const CachedAttentionSpec& spec, const std::vector<mx::array>& inputs,
                           std::vector<mx::array>& outputs, const std::vector<bool>& donated);

}  // namespace mlxcel::fast::gpu
