// Attention nodes: plain scaled-dot-product attention, and one step over a
// layer's KV cache (rotation, cache write and attention in one node).
#pragma once

#include <functional>
#include <optional>

#include "mlxcel-mlx/cpp/nodes/node.h"
#include "mlxcel-mlx/cpp/nodes/norm_rope.h"

namespace mlxcel::fast {

/// Which scores attention masks.
enum class AttentionMask : uint8_t {
  None,
  /// Query i of Lq sees keys up to Lk - Lq + i.
  Causal,
  /// A bool input (broadcast to [B, H, Lq, Lk]): true attends.
  Bool,
  /// An f32 input (broadcast likewise) added to the scores.
  Additive,
};

/// Where attention writes row (b, h, i).
enum class HeadLayout : uint8_t {
  /// `[B, H, Lq, Dv]`, as MLX's attention.
  Heads,
  /// `[B, Lq, H · Dv]`: heads merged for the output projection
  /// (fusion.h `merge_into_attention`).
  Merged,
};

/// A plain attention node. Inputs: q `[B, H, Lq, D]`, k `[B, KVH, Lk, D]`,
/// v `[B, KVH, Lk, Dv]` (any strides with a contiguous last axis) [, the
/// mask broadcast to `[B, H, Lq, Lk]`].
struct AttentionSpec {
  float scale = 1.0f;
  AttentionMask mask = AttentionMask::None;
  HeadLayout layout = HeadLayout::Heads;
  /// Unset: k and v are the keys and values. n: they are whole cache
  /// buffers of which the first n positions are the keys (fusion.h
  /// `cache_prefix`).
  std::optional<int> key_prefix;
  bool operator==(const AttentionSpec&) const = default;
};

class Attention : public UnaryNode {
 public:
  Attention(mx::Stream s, AttentionSpec spec) : UnaryNode(s), spec_(spec) {}
  const AttentionSpec& spec() const { return spec_; }
  const char* name() const override { return "MlxcelAttention"; }
  bool is_equivalent(const mx::Primitive& o) const override {
    return spec_ == static_cast<const Attention&>(o).spec_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& in) override { return {shape(in, spec_.layout)}; }
  static mx::Shape shape(const std::vector<mx::array>& in, HeadLayout layout);
  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;

 private:
  AttentionSpec spec_;
};

/// One sequence's part of a cached attention step.
struct CacheStep {
  int offset = 0;   // position of the row's first query and key (RoPE)
  int slot = 0;     // first buffer position written
  int visible = 0;  // buffer positions attended over, [0, visible)
  bool causal = false;  // query i sees up to visible - L + i (slot + L == visible)
  bool operator==(const CacheStep&) const = default;
};

/// One attention step over the KV caches of B sequences. Inputs q
/// `[B, H, L, D]`, k `[B, KVH, L, D]`, v `[B, KVH, L, Dv]` (not yet rotated),
/// then per row b its cache buffers kc_b `[1, KVH, C_b, D]` and vc_b
/// `[1, KVH, C_b, Dv]`, [then the rope wavelengths]; outputs the attention
/// with heads merged, `[B, L, H · Dv]`, then per row its buffers with the
/// row's rotated keys and values written at positions slot..slot+L. Row b
/// attends over positions [0, visible) of its own buffers. What would be,
/// per row, two rope nodes, two slice updates, two slices and an attention
/// node (and the merge) in MLX's graph. Each row runs exactly the kernels it
/// would run alone (batch 1), so its bits do not depend on the other rows.
struct CachedAttentionSpec {
  RopeConfig rope;
  std::vector<CacheStep> rows;
  float scale = 1.0f;
  bool operator==(const CachedAttentionSpec&) const = default;
};

class CachedAttention : public MultiNode {
 public:
  CachedAttention(mx::Stream s, CachedAttentionSpec spec) : MultiNode(s), spec_(std::move(spec)) {}
  const char* name() const override { return "MlxcelCachedAttention"; }
  bool is_equivalent(const mx::Primitive& o) const override {
    return spec_ == static_cast<const CachedAttention&>(o).spec_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& in) override {
    return shapes(in, static_cast<int>(spec_.rows.size()));
  }
  static std::vector<mx::Shape> shapes(const std::vector<mx::array>& in, int rows);
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  /// Up to 32 rows of up to 32 positions (gpu.h).
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;

 private:
  CachedAttentionSpec spec_;
};

/// Memory for a CachedAttention node's outputs, on either device: each
/// cache buffer (outputs 1..) takes over its input's memory when the node
/// holds the only reference to it and it is row-major and dense (written in
/// place, as MLX's SliceUpdate does), else gets fresh memory from
/// `allocate` (the device's) that the kernel copies the buffer into first;
/// the attention (output 0) gets fresh memory. Returns, per buffer, whether
/// it was taken over.
std::vector<bool> claim_cache_buffers(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs,
                                      const std::function<void(mx::array&)>& allocate);

}  // namespace mlxcel::fast
