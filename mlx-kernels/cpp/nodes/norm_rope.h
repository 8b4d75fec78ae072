// RMS norm and rotary embedding nodes, and the RoPE tables every rotation
// (here and in a cached attention step) reads.
#pragma once

#include "mlxcel-mlx/cpp/nodes/node.h"

namespace mlxcel::fast {

/// An RMS norm node. Inputs: x, the weight if `norm.weight`, then the
/// residual if the epilogue adds one (`residual + rms_norm(x) · w`, Gemma's
/// post-norms; fusion.h `fold_residual`).
struct NormSpec {
  RmsNormParams norm;
  Epilogue epilogue = Epilogue::None;
  bool operator==(const NormSpec&) const = default;
};

class RmsNorm : public UnaryNode {
 public:
  RmsNorm(mx::Stream s, NormSpec spec) : UnaryNode(s), spec_(spec) {}
  const NormSpec& spec() const { return spec_; }
  const char* name() const override {
    return spec_.epilogue == Epilogue::AddResidual ? "MlxcelRmsNormAdd" : "MlxcelRmsNorm";
  }
  bool is_equivalent(const mx::Primitive& o) const override { return spec_ == static_cast<const RmsNorm&>(o).spec_; }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& in) override { return {in[0].shape()}; }
  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  /// mlxcel's CUDA norm (gpu.h).
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;

 private:
  NormSpec spec_;
};

/// The parameters of a rotation (MLX's `fast::rope`): the first `dims`
/// features of each head, adjacent pairs (`traditional`) or the two halves,
/// wavelengths `base^(2i/dims)` or an input of explicit ones (`has_freqs`),
/// positions multiplied by `scale`.
struct RopeConfig {
  int dims = 0;
  bool traditional = false;
  float base = 0.0f;
  float scale = 1.0f;
  bool has_freqs = false;
  bool operator==(const RopeConfig&) const = default;
};

/// Rotates `x [.., L, D]` for positions `offset..`. Inputs: x [, wavelengths].
class Rope : public UnaryNode {
 public:
  Rope(mx::Stream s, RopeConfig rc, int offset) : UnaryNode(s), rc_(rc), offset_(offset) {}
  const char* name() const override { return "MlxcelRope"; }
  bool is_equivalent(const mx::Primitive& o) const override {
    auto& r = static_cast<const Rope&>(o);
    return rc_ == r.rc_ && offset_ == r.offset_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& in) override { return {in[0].shape()}; }
  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;

 private:
  RopeConfig rc_;
  int offset_;
};

/// A view of rows to rotate: `[A, B, L, D]` from `p` with element strides
/// sa, sb, sl and a contiguous last axis.
struct RopeView {
  const float* p = nullptr;
  int64_t sa = 0, sb = 0, sl = 0;
  int A = 1, B = 1, L = 0, D = 0;
};

/// `x [.., L, D]` (any strides) as a RopeView; copies into `buf` when the
/// last axis is not contiguous or x has more than 4 axes. Runs inside a task.
RopeView rope_view(const mx::array& x, std::vector<float>& buf);

/// Rotates `x` for positions `offset..` into the contiguous `out` of its
/// shape; `freqs` are the wavelengths when the config has them. Runs inside
/// a task.
void rope_into(const RopeConfig& rc, const mx::array* freqs, const RopeView& x, int offset, float* out);

}  // namespace mlxcel::fast
