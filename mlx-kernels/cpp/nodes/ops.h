// mlxcel's kernels as MLX operations (what the bridge calls). Each function
// builds one graph node running our kernel when the default stream is the
// CPU and the inputs are covered, and MLX's own operation otherwise
// (`Path::Auto`); `Path::Kernel` insists on ours (an uncovered input is an
// exception naming why) and `Path::Mlx` always takes MLX's. Nodes met while
// building are fused by the rules of fusion.h.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "mlx/array.h"
#include "mlxcel-mlx/cpp/kernels/kernels.h"

namespace mlxcel::fast {

namespace mx = mlx::core;

/// Whose implementation an operation uses.
enum class Path : uint8_t { Auto = 0, Kernel = 1, Mlx = 2 };

/// The mask of `sdpa`: none, causal, or an array (bool: true attends;
/// float: added to the scores).
enum class MaskMode : uint8_t { None = 0, Causal = 1, Array = 2 };

/// MLX's name of a mask mode (`fast::scaled_dot_product_attention`'s string).
const char* mlx_mask_mode(MaskMode mode);

/// One affine-quantized weight: packed codes, scales and biases.
struct QuantizedWeight {
  mx::array w;
  mx::array scales;
  std::optional<mx::array> biases;
  /// `Rows16` weights run only on mlxcel's kernels: MLX's ops read row-major.
  kern::WeightLayout layout = kern::WeightLayout::RowMajor;
};

/// `x @ Wᵀ` for affine-quantized W (MLX layout).
mx::array quantized_linear(const mx::array& x, const QuantizedWeight& w, int group_size, int bits, Path path);

/// `x @ W_iᵀ` for each weight in one node (one pass over x, one dispatch).
/// heads[i] > 0 returns output i split into heads, `[B, heads, L, N_i/heads]`
/// for x `[B, L, K]`; 0 returns it as `[.., N_i]`.
std::vector<mx::array> quantized_linear_multi(const mx::array& x, const std::vector<QuantizedWeight>& ws,
                                              const std::vector<int>& heads, int group_size, int bits, Path path);

/// `act(x @ Gᵀ) * (x @ Uᵀ)` in one node.
mx::array quantized_gated_linear(kern::Activation act, const mx::array& x, const QuantizedWeight& gate,
                                 const QuantizedWeight& up, int group_size, int bits, Path path);

/// `x @ W_iᵀ` for float weights `W_i [N_i, K]` (f32, f16 or bf16, read as
/// f32) in one node; `heads` as `quantized_linear_multi`'s. MLX's
/// `matmul(x, transpose(W_i))` where the kernel does not cover the inputs.
std::vector<mx::array> linear_multi(const mx::array& x, const std::vector<mx::array>& ws,
                                   const std::vector<int>& heads, Path path);

/// `act(x @ Gᵀ) * (x @ Uᵀ)` for float weights in one node.
mx::array gated_linear(kern::Activation act, const mx::array& x, const mx::array& gate, const mx::array& up,
                       Path path);

/// Rows `ids` of affine-quantized W, dequantized and multiplied by `scale`:
/// `[..ids, K]`.
mx::array quantized_gather(const mx::array& ids, const QuantizedWeight& w, int group_size, int bits, float scale,
                           Path path);

/// Rows `ids` of a float table `[N, K]` (f32, f16 or bf16) as f32, multiplied
/// by `scale` (an f32 multiply after the exact widening): `[..ids, K]`.
mx::array gather_rows(const mx::array& ids, const mx::array& table, float scale, Path path);

mx::array rms_norm(const mx::array& x, const std::optional<mx::array>& weight, float eps, Path path);

/// `a + b`; a residual added to a pending product or norm of ours is folded
/// into it (fusion.h `fold_residual`). MLX's `add` otherwise (and always on
/// Path::Mlx).
mx::array add(const mx::array& a, const mx::array& b, Path path);

/// A rotary embedding's parameters, as `rope` takes them.
struct RopeSpec {
  int dims;
  bool traditional;
  float base;  // unused with freqs
  float scale;
  std::optional<mx::array> freqs;
};

mx::array rope(const mx::array& x, const RopeSpec& rope, int offset, Path path);

mx::array sdpa(const mx::array& q, const mx::array& k, const mx::array& v, float scale, MaskMode mask_mode,
               const std::optional<mx::array>& mask, Path path);

/// One sequence of a cached attention step: its cache buffers (`[1, KVH,
/// capacity, D]` and `[.., Dv]`), where its keys and values go and which
/// positions its queries see.
struct CacheRow {
  mx::array keys;
  mx::array values;
  int offset;    // position of the row's first query and key (RoPE)
  int slot;      // first buffer position written
  int visible;   // the queries attend over positions [0, visible)
  bool causal;   // query i sees positions up to visible - L + i (needs slot + L == visible)
};

/// One attention step over the KV caches of a batch, one row per sequence:
/// rotates row b of q `[B, H, L, D]` and k `[B, KVH, L, D]` for positions
/// `rows[b].offset..`, writes its rotated keys and its v into its buffers at
/// `rows[b].slot` and attends its queries over the visible positions.
/// Returns `{out [B, L, H * Dv], keys'_0, values'_0, keys'_1, ...}`. On the
/// CPU one node that updates each buffer in place when nothing else holds
/// it; elsewhere, per row, MLX's rope, slice_update and attention. Either
/// way each row's bits are those of the row alone.
std::vector<mx::array> cached_attention(const mx::array& q, const mx::array& k, const mx::array& v,
                                        const RopeSpec& rope, const std::vector<CacheRow>& rows, float scale,
                                        Path path);

/// `[B, H, L, D]` attention output as `[B, L, H * D]` for the output
/// projection: free (the attention node writes that layout) when `x` is our
/// attention node not yet computed, MLX's transpose and reshape otherwise.
mx::array merge_heads(const mx::array& x, Path path);

/// `act(a) * b`, elementwise.
mx::array gated_activation(kern::Activation act, const mx::array& a, const mx::array& b, Path path);

/// Names of the operations that evaluating `outputs` would run, one per node
/// not yet computed (what a step costs in MLX dispatches).
std::vector<std::string> pending_ops(const std::vector<mx::array>& outputs);

/// Evaluates `outputs` on the calling thread, node after node in dependency
/// order with no MLX stream task, when every node still to compute is one of
/// mlxcel's CPU nodes (and none is traced); returns false, having done
/// nothing, otherwise (the caller then uses MLX's eval).
bool eval_inline(const std::vector<mx::array>& outputs);

}  // namespace mlxcel::fast
