// Nodes of quantized products: several products of one x (q, k, v), the
// gated pair of an MLP (gate and up with the activation), the row gather of
// an embedding table, and the gated activation alone.
#pragma once

#include <optional>
#include <vector>

#include "mlxcel-mlx/cpp/kernels/kernels.h"
#include "mlxcel-mlx/cpp/nodes/node.h"

namespace mlxcel::fast {

/// An affine quantization layout (MLX's): codes of `bits` bits, one scale
/// and bias per `group_size` inputs. `bits == 0`: float weights (`W [N, K]`
/// of f32, f16 or bf16, one input each; kernels/float_impl.h).
struct QuantSpec {
  int group_size = 0;
  int bits = 0;
  /// How the codes, scales and biases are arranged (kern::WeightLayout).
  kern::WeightLayout layout = kern::WeightLayout::RowMajor;
  bool operator==(const QuantSpec&) const = default;

  bool dense() const { return bits == 0; }
  /// Inputs per weight: (codes, scales, biases), or the float matrix.
  int inputs_per_weight() const { return dense() ? 1 : 3; }
};

/// Index of a product node's first weight input: after x and, when the
/// prologue has one, the norm's weight.
inline int first_weight_input(const std::optional<RmsNormParams>& prologue) {
  return 1 + (prologue && prologue->weight ? 1 : 0);
}

/// `x W_iᵀ` for 1 to 8 weights sharing x, in one node. Inputs: x, the
/// prologue's norm weight if it has one, (codes, scales, biases) per
/// quantized weight or the matrix per float weight, then the residual if the
/// epilogue adds one.
struct ProductSpec {
  QuantSpec quant;
  /// Per output: 0 keeps `[.., N_i]`; h > 0 splits it into h heads,
  /// `[B, h, L, N_i / h]` for x `[B, L, K]` (what attention reads).
  std::vector<int> heads;
  /// An RMS norm of x the node applies first (fusion.h `absorb_norm`).
  std::optional<RmsNormParams> prologue;
  /// `AddResidual`: one output in the plain layout, plus the last input.
  Epilogue epilogue = Epilogue::None;
  /// x holds one position per sequence (`[B, 1, K]`, a decode step): every
  /// row is computed as if it were alone, whatever B (kern::QmmArgs).
  bool row_invariant = false;
  bool operator==(const ProductSpec&) const = default;

  /// Index of weight i's codes among the inputs.
  int weight_input(int i) const { return first_weight_input(prologue) + quant.inputs_per_weight() * i; }
  /// One output in the plain layout (what a residual can be folded into).
  bool single_plain() const { return heads.size() == 1 && heads[0] == 0; }
};

/// `act(x Gᵀ) ⊙ (x Uᵀ)`: a gated MLP's gate and up projections and their
/// activation (quantized or float). Inputs as ProductSpec's for the two weights.
struct GatedSpec {
  QuantSpec quant;
  kern::Activation act = kern::Activation::Silu;
  std::optional<RmsNormParams> prologue;
  /// As ProductSpec's.
  bool row_invariant = false;
  bool operator==(const GatedSpec&) const = default;

  /// Index of weight i's codes (0: the gate, 1: up) among the inputs.
  int weight_input(int i) const { return first_weight_input(prologue) + quant.inputs_per_weight() * i; }
};

class QuantizedProduct : public MultiNode {
 public:
  QuantizedProduct(mx::Stream s, ProductSpec spec) : MultiNode(s), spec_(std::move(spec)) {}
  const ProductSpec& spec() const { return spec_; }
  const char* name() const override;
  bool is_equivalent(const mx::Primitive& o) const override {
    return spec_ == static_cast<const QuantizedProduct&>(o).spec_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& in) override { return shapes(in, spec_); }
  static std::vector<mx::Shape> shapes(const std::vector<mx::array>& in, const ProductSpec& spec);
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  /// Quantized weights only (gpu.h).
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;

 private:
  ProductSpec spec_;
};

class QuantizedGatedProduct : public UnaryNode {
 public:
  QuantizedGatedProduct(mx::Stream s, GatedSpec spec) : UnaryNode(s), spec_(spec) {}
  const char* name() const override {
    return spec_.quant.dense() ? "MlxcelGatedLinear" : "MlxcelQuantizedGatedLinear";
  }
  bool is_equivalent(const mx::Primitive& o) const override {
    return spec_ == static_cast<const QuantizedGatedProduct&>(o).spec_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& in) override;
  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  /// Quantized weights only (gpu.h).
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;

 private:
  GatedSpec spec_;
};

/// Rows `ids` of a quantized table, dequantized and multiplied by `scale`
/// (rounded as a multiply after dequantization: Gemma's `sqrt(hidden)`).
/// Inputs: ids (any integer dtype and shape), codes, scales, biases; or, for
/// a float table (`quant.dense()`), ids and the table (f32, f16 or bf16, its
/// rows read as f32, exactly, then multiplied).
class QuantizedGather : public UnaryNode {
 public:
  QuantizedGather(mx::Stream s, QuantSpec quant, float scale) : UnaryNode(s), quant_(quant), scale_(scale) {}
  const char* name() const override { return quant_.dense() ? "MlxcelGather" : "MlxcelQuantizedGather"; }
  bool is_equivalent(const mx::Primitive& o) const override {
    auto& g = static_cast<const QuantizedGather&>(o);
    return quant_ == g.quant_ && scale_ == g.scale_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& in) override;
  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;
  /// Quantized tables only (gpu.h).
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;

 private:
  QuantSpec quant_;
  float scale_;
};

/// `act(a) ⊙ b`, elementwise; rows of a and b may be strided.
class GatedActivation : public UnaryNode {
 public:
  GatedActivation(mx::Stream s, kern::Activation act) : UnaryNode(s), act_(act) {}
  const char* name() const override;
  bool is_equivalent(const mx::Primitive& o) const override {
    return act_ == static_cast<const GatedActivation&>(o).act_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& in) override { return {in[0].shape()}; }
  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override;

 private:
  kern::Activation act_;
};

}  // namespace mlxcel::fast
