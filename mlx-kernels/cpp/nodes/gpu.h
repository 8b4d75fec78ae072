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
#include <memory>
#include <string>
#include <vector>

#include "mlxcel-mlx/cpp/nodes/attention.h"
#include "mlxcel-mlx/cpp/nodes/norm_rope.h"
#include "mlxcel-mlx/cpp/nodes/products.h"

namespace mlxcel::fast::gpu {

/// At most this many rows of x go to our decode products (a decode step of
/// up to this many sequences), and this many sequences and positions per
/// sequence to our attention; more (a prompt) take our tiled prompt
/// products, which reuse each weight tile across rows, and MLX's attention.
inline constexpr int kMaxRows = 32;

/// Loads the module's cubin (`names`: its `NAME.txt`, one
/// `name expression \t lowered name` per line) into MLX's CUDA context and
/// registers its kernels; returns how many. Throws with the reason when the
/// cubin does not load (wrong architecture, corrupt) or a kernel is missing.
size_t load_module(const uint8_t* cubin, size_t size, const std::string& names);

/// Whether `load_module` has succeeded in this process.
bool loaded();

/// Why our GPU kernels cannot take a product with `bits`-wide codes in
/// `layout` ("" when they can, for any number of rows of x; the CPU checks
/// of ops.cc, which admit f32, f16 and bf16 scales, all with kernels, apply
/// first).
std::string product_unsupported(int bits, kern::WeightLayout layout);

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

/// Why our GPU row gather cannot take `count` ids of dtype `ids` from a
/// table with `bits`-wide codes in `layout` ("" when it can; the CPU checks
/// of ops.cc apply first). A module compiled before the gather existed has
/// none: such bundles keep MLX's ops for their embeddings.
std::string gather_unsupported(int bits, kern::WeightLayout layout, mx::Dtype ids, size_t count);

/// `eval_gpu` of QuantizedGather (quantized tables only): rows `inputs[0]`
/// of the table `inputs[1..3]`, dequantized and times `scale`.
void eval_gather(mx::Stream s, QuantSpec quant, float scale, const std::vector<mx::array>& inputs, mx::array& out);

/// One sequence's cache in a replayed decode step: its key and value
/// buffers (as the step's cached attention wrote them when it was recorded)
/// and where this step goes (CachedAttention's `CacheRow` numbers).
struct ReplayRow {
  const mx::array* keys;
  const mx::array* values;
  int offset;
  int slot;
  int visible;
  bool causal;
};

/// A decode step recorded as one CUDA graph of mlxcel's kernels, replayed
/// for the next steps of the same sequences without building or
/// evaluating a graph of nodes again (`record_step`).
class StepGraph {
 public:
  virtual ~StepGraph() = default;
  /// Runs the step again for the token ids `tokens` (as many as recorded)
  /// with each cache row at its new position, and copies the logits
  /// (`logits_count` floats, the recorded logits' size) into `logits`.
  /// Returns false, having run nothing, when `rows` are not the recorded
  /// step's cache buffers one for one (a buffer grew or was replaced):
  /// record the step again then.
  virtual bool replay(const uint32_t* tokens, size_t count, const std::vector<ReplayRow>& rows, float* logits,
                      size_t logits_count) = 0;
};

/// Evaluates `outputs` as MLX's eval does and, when every node it computes
/// is one of our GPU nodes, records their kernel launches as a StepGraph
/// whose inputs are `tokens` (an evaluated array of token ids the step's
/// gather reads) and whose output is `logits` (one of `outputs`). Returns
/// null when the step cannot be replayed: `refusal` then says why when
/// that holds for every step of this shape (a node that is not ours), and
/// is empty when only this step could not (a cache buffer was copied).
std::unique_ptr<StepGraph> record_step(const std::vector<mx::array>& outputs, const mx::array& tokens,
                                       const mx::array& logits, std::string& refusal);

}  // namespace mlxcel::fast::gpu
