// The operations of ops.h: for each, whether our kernel covers the inputs
// (and the device), the node it builds, and MLX's op otherwise. The rewrites
// between nodes are fusion.cc's; this file only calls them.
#include "mlxcel-mlx/cpp/nodes/ops.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>

#include "mlx/fast.h"
#include "mlx/ops.h"
#include "mlx/utils.h"
#include "mlxcel-mlx/cpp/nodes/attention.h"
#include "mlxcel-mlx/cpp/nodes/fusion.h"
#include "mlxcel-mlx/cpp/nodes/gpu.h"
#include "mlxcel-mlx/cpp/nodes/norm_rope.h"
#include "mlxcel-mlx/cpp/nodes/products.h"

namespace mlxcel::fast {
namespace {

using mx::array;

std::string shape_str(const mx::Shape& s) {
  std::ostringstream o;
  o << "[";
  for (size_t i = 0; i < s.size(); ++i) o << (i ? ", " : "") << s[i];
  o << "]";
  return o.str();
}

std::string dtype_str(mx::Dtype d) {
  std::ostringstream o;
  o << d;
  return o.str();
}

const char* kNotCpu = "the default device is not the CPU";

[[noreturn]] void refuse(const char* op, const std::string& why) {
  throw std::invalid_argument(std::string(op) + ": mlxcel's kernel cannot run this: " + why);
}

// Whether to build our node: never on Path::Mlx; on Path::Auto when nothing
// stands against it (`why` empty); on Path::Kernel a reason is an error.
bool use_kernel(Path path, const char* op, const std::string& why) {
  if (path == Path::Mlx) return false;
  if (why.empty()) return true;
  if (path == Path::Auto) return false;
  refuse(op, why);
}

// use_kernel for quantized weights: one in the rows16 layout has no MLX
// fallback, so whatever would send it to MLX's op is an error.
bool use_kernel(Path path, const char* op, const std::string& why, kern::WeightLayout layout) {
  if (layout == kern::WeightLayout::Rows16) {
    if (!why.empty()) refuse(op, why);
    if (path == Path::Mlx)
      throw std::invalid_argument(std::string(op) + ": a weight in the rows16 layout runs only on mlxcel's CPU " +
                                  "kernels, not MLX's ops");
    return true;
  }
  return use_kernel(path, op, why);
}

mx::Stream default_stream() { return mx::default_stream(mx::default_device()); }

// Why our quantized kernels cannot take this weight ("" when they can).
std::string quant_unsupported(const QuantizedWeight& q, int gs, int bits) {
  if (bits < 2 || bits > 8 || bits == 7)
    return "codes must be 2, 3, 4, 5, 6 or 8 bits wide, not " + std::to_string(bits);
  if (gs != 32 && gs != 64 && gs != 128) return "group size must be 32, 64 or 128, not " + std::to_string(gs);
  const auto& w = q.w;
  if (w.dtype() != mx::uint32) return "packed weights must be uint32, not " + dtype_str(w.dtype());
  if (w.ndim() != 2) return "packed weights must be 2-D, not " + shape_str(w.shape());
  if (!q.biases) return "affine quantization needs biases";
  auto sd = q.scales.dtype();
  if ((sd != mx::float32 && sd != mx::float16 && sd != mx::bfloat16) || q.biases->dtype() != sd)
    return "scales and biases must both be float32, float16 or bfloat16, not " + dtype_str(sd) + "/" +
           dtype_str(q.biases->dtype());
  const int K = w.shape(1) * 32 / bits;
  const mx::Shape want{w.shape(0), K / gs};
  if (q.scales.shape() != want || q.biases->shape() != want)
    return "scales and biases must be " + shape_str(want) + " for weights " + shape_str(w.shape()) + ", not " +
           shape_str(q.scales.shape()) + "/" + shape_str(q.biases->shape());
  if (K % gs != 0) return "input features " + std::to_string(K) + " are not a multiple of the group size";
  if (q.layout == kern::WeightLayout::Rows16) {
    if (bits != 4 && bits != 8) return "rows16 weights must have 4- or 8-bit codes, not " + std::to_string(bits);
    if (w.shape(0) % 16 != 0) return "rows16 weights need a multiple of 16 rows, not " + std::to_string(w.shape(0));
  }
  return "";
}

// Why several weights cannot go through one fused product ("" when they can).
std::string multi_unsupported(const array& x, const std::vector<QuantizedWeight>& ws, int gs, int bits) {
  if (ws.empty() || ws.size() > 8) return "between 1 and 8 weights are fused, not " + std::to_string(ws.size());
  if (x.dtype() != mx::float32) return "activations must be float32, not " + dtype_str(x.dtype());
  if (x.ndim() < 1) return "activations must have at least one dimension";
  for (const auto& w : ws) {
    if (auto why = quant_unsupported(w, gs, bits); !why.empty()) return why;
    if (w.layout != ws[0].layout) return "the weights' layouts differ";
    if (w.w.shape(1) * 32 / bits != x.shape(-1))
      return "activations have " + std::to_string(x.shape(-1)) + " features, a weight " +
             std::to_string(w.w.shape(1) * 32 / bits);
  }
  return "";
}

// Why our GPU kernels cannot take these weights ("" when they can): the
// CPU kernels' conditions, then the GPU's own (gpu.h).
std::string gpu_multi_unsupported(const array& x, const std::vector<QuantizedWeight>& ws, int gs, int bits) {
  if (auto why = multi_unsupported(x, ws, gs, bits); !why.empty()) return why;
  return gpu::product_unsupported(bits, ws[0].layout);
}

// Why our rope cannot rotate `x` with these parameters ("" when it can).
std::string rope_unsupported(const array& x, const RopeSpec& rope, int offset) {
  const int dims = rope.dims;
  if (x.dtype() != mx::float32) return "input must be float32, not " + dtype_str(x.dtype());
  if (x.ndim() < 3) return "input must have at least 3 dimensions, not " + shape_str(x.shape());
  if (dims <= 0 || dims % 2 != 0 || dims > x.shape(-1))
    return "dims must be even, positive and at most " + std::to_string(x.shape(-1)) + ", not " + std::to_string(dims);
  if (offset < 0 || static_cast<int64_t>(offset) + x.shape(-2) > (1 << 24))
    return "positions must lie in [0, 2^24), offset is " + std::to_string(offset);
  const auto& freqs = rope.freqs;
  if (freqs && (freqs->dtype() != mx::float32 || freqs->ndim() != 1 || freqs->shape(0) != dims / 2))
    return "freqs must be float32 [" + std::to_string(dims / 2) + "], not " + dtype_str(freqs->dtype()) + " " +
           shape_str(freqs->shape());
  if (!freqs && !(rope.base > 0.0f)) return "base must be positive";
  return "";
}

// `x` as our GPU kernels read it (on stream `s`): row-major. Our own nodes
// write row-major outputs; anything else may be a strided view (q, k and v
// heads split from MLX's quantized matmul are transposed) and is made
// contiguous first, which costs a node but no copy when it already is.
array gpu_rows(const array& x, mx::Stream s) {
  if (x.is_available() && x.flags().row_contiguous) return x;
  if (pending<QuantizedProduct>(x) || pending<QuantizedGatedProduct>(x) || pending<RmsNorm>(x) ||
      pending<CachedAttention>(x) || pending<QuantizedGather>(x))
    return x;
  return mx::contiguous(x, false, s);
}

// Why our norm cannot take x and weight ("" when it can).
std::string norm_unsupported(const array& x, const std::optional<array>& weight) {
  if (x.dtype() != mx::float32) return "input must be float32, not " + dtype_str(x.dtype());
  if (x.ndim() < 1) return "input must have at least one dimension";
  if (weight && weight->dtype() != mx::float32) return "weight must be float32, not " + dtype_str(weight->dtype());
  if (weight && (weight->ndim() != 1 || weight->shape(0) != x.shape(-1)))
    return "weight must be [" + std::to_string(x.shape(-1)) + "], not " + shape_str(weight->shape());
  return "";
}

RopeConfig rope_config(const RopeSpec& rope) {
  return RopeConfig{rope.dims, rope.traditional, rope.base, rope.scale, rope.freqs.has_value()};
}

// Whether x `[B, 1, K]` holds one position per sequence (a decode step of a
// batch): its product must give each row the bits it gets alone.
bool one_position_per_sequence(const array& x) { return x.ndim() == 3 && x.shape(1) == 1; }

// The weight inputs of a product node: (codes, scales, biases) per weight.
std::vector<array> triples(const std::vector<QuantizedWeight>& ws) {
  std::vector<array> inputs;
  for (const auto& w : ws) {
    inputs.push_back(w.w);
    inputs.push_back(w.scales);
    inputs.push_back(*w.biases);
  }
  return inputs;
}

// The inputs of a product node: x [, norm weight], then the weights' inputs.
std::vector<array> product_inputs(const ProductInput& px, const std::vector<array>& weights) {
  std::vector<array> inputs{px.x};
  if (px.norm_weight) inputs.push_back(*px.norm_weight);
  inputs.insert(inputs.end(), weights.begin(), weights.end());
  return inputs;
}

// Head counts must be >= 0, and > 0 only for x [B, L, K] and widths they divide.
void check_heads(const char* op, const array& x, const std::vector<int>& heads, const std::vector<array>& ws) {
  if (heads.size() != ws.size()) throw std::invalid_argument(std::string(op) + ": one head count per weight");
  for (size_t i = 0; i < ws.size(); ++i) {
    if (heads[i] < 0) throw std::invalid_argument(std::string(op) + ": negative head count");
    if (heads[i] > 0 && (x.ndim() != 3 || ws[i].ndim() != 2 || ws[i].shape(0) % heads[i] != 0))
      throw std::invalid_argument(std::string(op) + ": heads need x [batch, seq, features] and outputs " +
                                  "divisible by the head count");
  }
}

// MLX's op's output `y [B, L, N]` split into `heads` heads (0: as it is).
array split_heads(const array& x, array y, int heads) {
  if (heads <= 0) return y;
  y = mx::reshape(y, {x.shape(0), x.shape(1), heads, y.shape(-1) / heads});
  return mx::transpose(y, {0, 2, 1, 3});
}

// One QuantizedProduct node of x (a pending norm absorbed) and the weights' inputs.
std::vector<array> product_node(mx::Stream s, const array& x, QuantSpec quant, const std::vector<int>& heads,
                                const std::vector<array>& weights) {
  auto px = absorb_norm(x);
  // An absorbed norm's input went through gpu_rows when the norm was built.
  if (s.device != mx::Device::cpu && !px.prologue) px.x = gpu_rows(px.x, s);
  ProductSpec spec{quant, heads, px.prologue, Epilogue::None, one_position_per_sequence(x)};
  auto inputs = product_inputs(px, weights);
  auto shapes = QuantizedProduct::shapes(inputs, spec);
  std::vector<mx::Dtype> dtypes(heads.size(), mx::float32);
  return array::make_arrays(std::move(shapes), dtypes, std::make_shared<QuantizedProduct>(s, std::move(spec)),
                            inputs);
}

// One QuantizedGatedProduct node of x (a pending norm absorbed) and the two weights' inputs.
array gated_node(mx::Stream s, kern::Activation act, const array& x, QuantSpec quant, int width,
                 const std::vector<array>& weights) {
  auto px = absorb_norm(x);
  if (s.device != mx::Device::cpu && !px.prologue) px.x = gpu_rows(px.x, s);
  auto shape = x.shape();
  shape.back() = width;
  GatedSpec spec{quant, act, px.prologue, one_position_per_sequence(x)};
  return array(std::move(shape), mx::float32, std::make_shared<QuantizedGatedProduct>(s, spec),
               product_inputs(px, weights));
}

// Why float weights cannot go through one product node ("" when they can).
std::string dense_unsupported(const array& x, const std::vector<array>& ws) {
  if (ws.empty() || ws.size() > 8) return "between 1 and 8 weights are fused, not " + std::to_string(ws.size());
  if (x.dtype() != mx::float32) return "activations must be float32, not " + dtype_str(x.dtype());
  if (x.ndim() < 1) return "activations must have at least one dimension";
  for (const auto& w : ws) {
    if (w.ndim() != 2) return "weights must be 2-D, not " + shape_str(w.shape());
    if (w.dtype() != mx::float32 && w.dtype() != mx::float16 && w.dtype() != mx::bfloat16)
      return "weights must be float32, float16 or bfloat16, not " + dtype_str(w.dtype());
    if (w.shape(1) != x.shape(-1))
      return "activations have " + std::to_string(x.shape(-1)) + " features, a weight " + std::to_string(w.shape(1));
  }
  return "";
}

}  // namespace

const char* mlx_mask_mode(MaskMode mode) {
  switch (mode) {
    case MaskMode::None: return "";
    case MaskMode::Causal: return "causal";
    case MaskMode::Array: return "array";
  }
  throw std::invalid_argument("unknown mask mode " + std::to_string(static_cast<int>(mode)));
}

mx::array quantized_linear(const mx::array& x, const QuantizedWeight& w, int group_size, int bits, Path path) {
  // One product: the multi-product node with one plain output.
  return quantized_linear_multi(x, {w}, {0}, group_size, bits, path)[0];
}

std::vector<mx::array> quantized_linear_multi(const mx::array& x, const std::vector<QuantizedWeight>& ws,
                                              const std::vector<int>& heads, int group_size, int bits, Path path) {
  std::vector<array> codes;
  for (const auto& w : ws) codes.push_back(w.w);
  check_heads("quantized_linear_multi", x, heads, codes);
  auto s = default_stream();
  auto mlx_op = [&] {
    std::vector<array> outs;
    for (size_t i = 0; i < ws.size(); ++i)
      outs.push_back(split_heads(
          x, mx::quantized_matmul(x, ws[i].w, ws[i].scales, ws[i].biases, true, group_size, bits, "affine"), heads[i]));
    return outs;
  };
  std::string why = s.device == mx::Device::cpu ? multi_unsupported(x, ws, group_size, bits)
                                                : gpu_multi_unsupported(x, ws, group_size, bits);
  if (!use_kernel(path, "quantized_linear_multi", why, ws.empty() ? kern::WeightLayout::RowMajor : ws[0].layout))
    return mlx_op();
  return product_node(s, x, {group_size, bits, ws[0].layout}, heads, triples(ws));
}

std::vector<mx::array> linear_multi(const mx::array& x, const std::vector<mx::array>& ws,
                                   const std::vector<int>& heads, Path path) {
  check_heads("linear_multi", x, heads, ws);
  auto s = default_stream();
  auto mlx_op = [&] {
    std::vector<array> outs;
    for (size_t i = 0; i < ws.size(); ++i) outs.push_back(split_heads(x, mx::matmul(x, mx::transpose(ws[i])), heads[i]));
    return outs;
  };
  std::string why = s.device == mx::Device::cpu ? dense_unsupported(x, ws) : kNotCpu;
  if (!use_kernel(path, "linear_multi", why)) return mlx_op();
  return product_node(s, x, QuantSpec{}, heads, ws);
}

mx::array gated_linear(kern::Activation act, const mx::array& x, const mx::array& gate, const mx::array& up,
                       Path path) {
  auto s = default_stream();
  auto mlx_op = [&] {
    auto g = mx::matmul(x, mx::transpose(gate));
    auto u = mx::matmul(x, mx::transpose(up));
    return gated_activation(act, g, u, Path::Mlx);
  };
  std::string why = s.device == mx::Device::cpu ? dense_unsupported(x, {gate, up}) : kNotCpu;
  if (why.empty() && gate.shape(0) != up.shape(0)) why = "gate and up projections have different widths";
  if (!use_kernel(path, "gated_linear", why)) return mlx_op();
  return gated_node(s, act, x, QuantSpec{}, gate.shape(0), {gate, up});
}

mx::array add(const mx::array& a, const mx::array& b, Path path) {
  // On the GPU only our product nodes exist (gpu.h), and they add residuals too.
  if (path != Path::Mlx && (mx::default_device() == mx::Device::cpu || gpu::loaded())) {
    if (auto fused = fold_residual(a, b)) return *fused;
  }
  return mx::add(a, b);
}

mx::array quantized_gated_linear(kern::Activation act, const mx::array& x, const QuantizedWeight& gate,
                                 const QuantizedWeight& up, int group_size, int bits, Path path) {
  auto s = default_stream();
  auto mlx_op = [&] {
    auto g = mx::quantized_matmul(x, gate.w, gate.scales, gate.biases, true, group_size, bits, "affine");
    auto u = mx::quantized_matmul(x, up.w, up.scales, up.biases, true, group_size, bits, "affine");
    return gated_activation(act, g, u, Path::Mlx);
  };
  std::string why = s.device == mx::Device::cpu ? multi_unsupported(x, {gate, up}, group_size, bits)
                                                : gpu_multi_unsupported(x, {gate, up}, group_size, bits);
  if (why.empty() && gate.w.shape(0) != up.w.shape(0)) why = "gate and up projections have different widths";
  if (!use_kernel(path, "quantized_gated_linear", why, gate.layout)) return mlx_op();
  return gated_node(s, act, x, {group_size, bits, gate.layout}, gate.w.shape(0), triples({gate, up}));
}

mx::array quantized_gather(const mx::array& ids, const QuantizedWeight& w, int group_size, int bits, float scale,
                           Path path) {
  auto s = default_stream();
  auto mlx_op = [&] {
    std::optional<array> b;
    if (w.biases) b = mx::take(*w.biases, ids, 0);
    auto rows = mx::dequantize(mx::take(w.w, ids, 0), mx::take(w.scales, ids, 0), b, group_size, bits, "affine");
    return scale == 1.0f ? rows : mx::multiply(rows, array(scale, rows.dtype()));
  };
  std::string why;
  if (!mx::issubdtype(ids.dtype(), mx::integer)) {
    why = "ids must be integers, not " + dtype_str(ids.dtype());
  } else {
    why = quant_unsupported(w, group_size, bits);
  }
  // On the GPU, our gather when the module has it: a decode step is then
  // all our nodes, which a recorded step graph needs (gpu.h record_step).
  if (why.empty() && s.device != mx::Device::cpu) why = gpu::gather_unsupported(bits, w.layout, ids.dtype(), ids.size());
  if (!use_kernel(path, "quantized_gather", why, w.layout)) return mlx_op();
  auto shape = ids.shape();
  shape.push_back(w.w.shape(1) * 32 / bits);
  return array(std::move(shape), mx::float32,
               std::make_shared<QuantizedGather>(s, QuantSpec{group_size, bits, w.layout}, scale),
               {ids, w.w, w.scales, *w.biases});
}

mx::array gather_rows(const mx::array& ids, const mx::array& table, float scale, Path path) {
  auto s = default_stream();
  auto mlx_op = [&] {
    auto rows = mx::astype(mx::take(table, ids, 0), mx::float32);
    return scale == 1.0f ? rows : mx::multiply(rows, array(scale, mx::float32));
  };
  std::string why;
  if (s.device != mx::Device::cpu) {
    why = kNotCpu;
  } else if (!mx::issubdtype(ids.dtype(), mx::integer)) {
    why = "ids must be integers, not " + dtype_str(ids.dtype());
  } else if (table.ndim() != 2) {
    why = "the table must be 2-D, not " + shape_str(table.shape());
  } else if (table.dtype() != mx::float32 && table.dtype() != mx::float16 && table.dtype() != mx::bfloat16) {
    why = "the table must be float32, float16 or bfloat16, not " + dtype_str(table.dtype());
  }
  if (!use_kernel(path, "gather_rows", why)) return mlx_op();
  auto shape = ids.shape();
  shape.push_back(table.shape(1));
  return array(std::move(shape), mx::float32, std::make_shared<QuantizedGather>(s, QuantSpec{}, scale), {ids, table});
}

mx::array rms_norm(const mx::array& x, const std::optional<mx::array>& weight, float eps, Path path) {
  auto s = default_stream();
  auto mlx_op = [&] { return mx::fast::rms_norm(x, weight, eps); };
  // On the GPU, our node when our kernels are loaded: the products absorb
  // it (fusion.h), and a norm they do not runs our GPU norm (gpu.h).
  std::string why = s.device == mx::Device::cpu ? "" : gpu::norm_unsupported();
  if (why.empty()) why = norm_unsupported(x, weight);
  if (!use_kernel(path, "rms_norm", why)) return mlx_op();
  std::vector<array> inputs{s.device == mx::Device::cpu ? x : gpu_rows(x, s)};
  if (weight) inputs.push_back(*weight);
  NormSpec spec{{eps, weight.has_value()}, Epilogue::None};
  return array(x.shape(), mx::float32, std::make_shared<RmsNorm>(s, spec), std::move(inputs));
}

mx::array rope(const mx::array& x, const RopeSpec& rope, int offset, Path path) {
  auto s = default_stream();
  auto mlx_op = [&] {
    std::optional<float> b = rope.freqs ? std::nullopt : std::optional<float>(rope.base);
    return mx::fast::rope(x, rope.dims, rope.traditional, b, rope.scale, offset, rope.freqs);
  };
  std::string why = s.device == mx::Device::cpu ? rope_unsupported(x, rope, offset) : kNotCpu;
  if (!use_kernel(path, "rope", why)) return mlx_op();
  std::vector<array> inputs{x};
  if (rope.freqs) inputs.push_back(*rope.freqs);
  return array(x.shape(), mx::float32, std::make_shared<Rope>(s, rope_config(rope), offset), std::move(inputs));
}

mx::array sdpa(const mx::array& q, const mx::array& k, const mx::array& v, float scale, MaskMode mask_mode,
               const std::optional<mx::array>& mask, Path path) {
  auto s = default_stream();
  auto mlx_op = [&] { return mx::fast::scaled_dot_product_attention(q, k, v, scale, mlx_mask_mode(mask_mode), mask); };
  std::string why;
  AttentionMask kind = AttentionMask::None;
  if (s.device != mx::Device::cpu) {
    why = kNotCpu;
  } else if (q.dtype() != mx::float32 || k.dtype() != mx::float32 || v.dtype() != mx::float32) {
    why = "q, k and v must be float32";
  } else if (q.ndim() != 4 || k.ndim() != 4 || v.ndim() != 4) {
    why = "q, k and v must be [batch, heads, sequence, dim]";
  } else if (k.shape(0) != q.shape(0) || v.shape(0) != q.shape(0)) {
    why = "batch sizes differ";
  } else if (k.shape(3) != q.shape(3)) {
    why = "queries have dim " + std::to_string(q.shape(3)) + ", keys " + std::to_string(k.shape(3));
  } else if (k.shape(1) != v.shape(1) || k.shape(2) != v.shape(2)) {
    why = "keys " + shape_str(k.shape()) + " and values " + shape_str(v.shape()) + " do not match";
  } else if (k.shape(1) == 0 || q.shape(1) % k.shape(1) != 0) {
    why = "query heads must be a multiple of key/value heads";
  } else if (mask_mode == MaskMode::Causal) {
    kind = AttentionMask::Causal;
    if (mask) why = "a causal mask takes no mask array";
  } else if (mask_mode == MaskMode::Array) {
    if (!mask) {
      why = "mask mode 'array' needs a mask";
    } else if (mask->dtype() == mx::bool_) {
      kind = AttentionMask::Bool;
    } else if (mask->dtype() == mx::float32) {
      kind = AttentionMask::Additive;
    } else {
      why = "masks must be bool or float32, not " + dtype_str(mask->dtype());
    }
    if (why.empty() && mask->ndim() > 4) why = "masks have at most 4 dimensions";
  }
  if (!use_kernel(path, "scaled_dot_product_attention", why)) return mlx_op();
  AttentionSpec spec{scale, kind, HeadLayout::Heads, std::nullopt};
  std::vector<array> inputs{q, k, v};
  if (auto prefix = cache_prefix(k, v)) {
    inputs = {q, prefix->keys, prefix->values};
    spec.key_prefix = prefix->positions;
  }
  if (kind == AttentionMask::Bool || kind == AttentionMask::Additive)
    inputs.push_back(mx::broadcast_to(*mask, {q.shape(0), q.shape(1), q.shape(2), k.shape(2)}));
  auto shape = Attention::shape(inputs, HeadLayout::Heads);
  return array(std::move(shape), mx::float32, std::make_shared<Attention>(s, spec), std::move(inputs));
}

std::vector<mx::array> cached_attention(const mx::array& q, const mx::array& k, const mx::array& v,
                                        const RopeSpec& rope, const std::vector<CacheRow>& rows, float scale,
                                        Path path) {
  // Shapes are checked on every path: a mismatch is a caller's bug, not a
  // case for MLX's ops.
  auto fail = [](const std::string& why) { throw std::invalid_argument("cached_attention: " + why); };
  if (q.ndim() != 4 || k.ndim() != 4 || v.ndim() != 4) fail("q, k and v must be [batch, heads, positions, dim]");
  const int B = q.shape(0), H = q.shape(1), L = q.shape(2), D = q.shape(3), KVH = k.shape(1), Dv = v.shape(3);
  if (k.shape() != mx::Shape{B, KVH, L, D} || v.shape(0) != B || v.shape(1) != KVH || v.shape(2) != L)
    fail("queries " + shape_str(q.shape()) + ", keys " + shape_str(k.shape()) + " and values " +
         shape_str(v.shape()) + " do not match");
  if (KVH == 0 || H % KVH != 0) fail("query heads must be a multiple of key/value heads");
  if (rows.empty() || static_cast<int>(rows.size()) != B)
    fail(std::to_string(rows.size()) + " cache rows for a batch of " + std::to_string(B));
  for (const auto& row : rows) {
    const auto &kc = row.keys, &vc = row.values;
    if (kc.ndim() != 4 || vc.ndim() != 4) fail("the cache buffers must be [1, heads, positions, dim]");
    const int C = kc.shape(2);
    if (kc.shape() != mx::Shape{1, KVH, C, D} || vc.shape() != mx::Shape{1, KVH, C, Dv})
      fail("cache buffers " + shape_str(kc.shape()) + "/" + shape_str(vc.shape()) + " do not hold a row of keys " +
           shape_str(k.shape()) + " and values " + shape_str(v.shape()));
    if (row.slot < 0 || row.slot + L > C)
      fail("positions " + std::to_string(row.slot) + ".." + std::to_string(row.slot + L) +
           " do not fit a buffer of " + std::to_string(C));
    if (row.visible < 1 || row.visible > C)
      fail(std::to_string(row.visible) + " visible positions in a buffer of " + std::to_string(C));
    if (row.causal && row.slot + L != row.visible) fail("a causal step must write the last of the visible positions");
  }

  auto s = default_stream();
  // MLX's ops, row by row (a slice of the batch, unless it is one row).
  auto unfused = [&](Path parts) {
    const mx::Shape origin{0, 0, 0, 0};
    auto row_of = [&](const array& a, int b) {
      if (B == 1) return a;
      return mx::slice(a, {b, 0, 0, 0}, {b + 1, a.shape(1), a.shape(2), a.shape(3)});
    };
    std::vector<array> outs, result{q};  // result[0] is replaced by the output
    for (int b = 0; b < B; ++b) {
      const auto& row = rows[b];
      auto qr = fast::rope(row_of(q, b), rope, row.offset, parts);
      auto kr = fast::rope(row_of(k, b), rope, row.offset, parts);
      const int end = row.slot + L;
      const mx::Shape at{0, 0, row.slot, 0};
      auto kc2 = mx::slice_update(row.keys, kr, at, mx::Shape{1, KVH, end, D});
      auto vc2 = mx::slice_update(row.values, row_of(v, b), at, mx::Shape{1, KVH, end, Dv});
      auto ks = mx::slice(kc2, origin, mx::Shape{1, KVH, row.visible, D});
      auto vs = mx::slice(vc2, origin, mx::Shape{1, KVH, row.visible, Dv});
      auto o = sdpa(qr, ks, vs, scale, row.causal ? MaskMode::Causal : MaskMode::None, std::nullopt, parts);
      outs.push_back(merge_heads(o, parts));
      result.push_back(kc2);
      result.push_back(vc2);
    }
    result[0] = B == 1 ? outs[0] : mx::concatenate(outs, 0);
    return result;
  };
  std::string why;
  auto f32 = [](const array& a) { return a.dtype() == mx::float32; };
  // On the GPU, our kernels when loaded and the step is one they take (gpu.h).
  if (s.device != mx::Device::cpu) why = gpu::attention_unsupported(B, L, D, Dv);
  const bool all_f32 = f32(q) && f32(k) && f32(v) &&
                       std::all_of(rows.begin(), rows.end(), [&](const CacheRow& r) { return f32(r.keys) && f32(r.values); });
  if (why.empty() && !all_f32) why = "q, k, v and the cache buffers must be float32";
  for (const auto& row : rows)
    if (why.empty()) why = rope_unsupported(q, rope, row.offset);
  if (!use_kernel(path, "cached_attention", why)) return unfused(path);
  auto row_major = [&](const array& a) { return s.device == mx::Device::cpu ? a : gpu_rows(a, s); };
  std::vector<array> inputs{row_major(q), row_major(k), row_major(v)};
  CachedAttentionSpec spec{rope_config(rope), {}, scale};
  for (const auto& row : rows) {
    inputs.push_back(row.keys);
    inputs.push_back(row.values);
    spec.rows.push_back(CacheStep{row.offset, row.slot, row.visible, row.causal});
  }
  if (rope.freqs) inputs.push_back(*rope.freqs);
  auto shapes = CachedAttention::shapes(inputs, B);
  std::vector<mx::Dtype> dtypes(shapes.size(), mx::float32);
  return array::make_arrays(std::move(shapes), dtypes, std::make_shared<CachedAttention>(s, std::move(spec)),
                            std::move(inputs));
}

mx::array merge_heads(const mx::array& x, Path path) {
  if (x.ndim() != 4)
    throw std::invalid_argument("merge_heads: expected [batch, heads, seq, dim], not " + shape_str(x.shape()));
  if (path != Path::Mlx) {
    if (auto merged = merge_into_attention(x)) return *merged;
  }
  if (path == Path::Kernel) refuse("merge_heads", "the input is not an attention node of mlxcel's kernel");
  return mx::reshape(mx::transpose(x, {0, 2, 1, 3}), {x.shape(0), x.shape(2), x.shape(1) * x.shape(3)});
}

mx::array gated_activation(kern::Activation act, const mx::array& a, const mx::array& b, Path path) {
  auto s = default_stream();
  const bool silu = act == kern::Activation::Silu;
  auto mlx_op = [&] {
    if (silu) return mx::multiply(mx::multiply(a, mx::sigmoid(a)), b);
    // (x/2)(1 + tanh(sqrt(2/pi) (x + 0.044715 x³))), as mlxcel's Array::gelu_approx.
    auto scalar = [&](float v) { return mx::full({}, mx::array(v, mx::float32), a.dtype()); };
    auto cube = mx::multiply(mx::square(a), a);
    auto inner = mx::multiply(mx::add(a, mx::multiply(cube, scalar(0.044715f))),
                              scalar(std::sqrt(2.0f / static_cast<float>(M_PI))));
    auto activated = mx::multiply(mx::multiply(a, scalar(0.5f)), mx::add(mx::tanh(inner), scalar(1.0f)));
    return mx::multiply(activated, b);
  };
  std::string why;
  if (s.device != mx::Device::cpu) {
    why = kNotCpu;
  } else if (a.dtype() != mx::float32 || b.dtype() != mx::float32) {
    why = "inputs must be float32";
  } else if (a.shape() != b.shape()) {
    why = "inputs must have the same shape, not " + shape_str(a.shape()) + " and " + shape_str(b.shape());
  } else if (a.ndim() < 1) {
    why = "inputs must have at least one dimension";
  }
  if (!use_kernel(path, silu ? "silu_mul" : "gelu_approx_mul", why)) return mlx_op();
  return array(a.shape(), mx::float32, std::make_shared<GatedActivation>(s, act), {a, b});
}

}  // namespace mlxcel::fast
