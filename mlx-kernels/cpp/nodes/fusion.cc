// The graph rewrites (fusion.h), all of them. Every rule below replaces
// nodes not yet computed by one node running the same kernels on the same
// values in the same order, so the fused graph's bits are the unfused
// graph's (tests: `fusion_*` in mlx-kernels/tests/kernels.rs).
#include "mlxcel-mlx/cpp/nodes/fusion.h"

#include <typeinfo>

#include "mlx/ops.h"
#include "mlxcel-mlx/cpp/nodes/attention.h"
#include "mlxcel-mlx/cpp/nodes/norm_rope.h"
#include "mlxcel-mlx/cpp/nodes/products.h"

namespace mlxcel::fast {
namespace {

using mx::array;

// MLX's `Slice` primitive, by type. libmlx does not export the typeinfo of
// its primitives (so neither `dynamic_cast<const mx::Slice*>` nor
// `typeid(mx::Slice)` links), but `typeid` of a live node reads it through
// the object: compare with the type of a slice MLX builds once.
const std::type_info& slice_type() {
  static const std::type_info& type = typeid(mx::slice(mx::zeros({2}), {0}, {1}).primitive());
  return type;
}

// (buffer, n) when `t` is a pending Slice of the first n positions (axis 2)
// of a 4-D f32 buffer, its other axes whole.
std::optional<std::pair<array, int>> prefix_slice(const array& t) {
  if (!t.has_primitive() || t.status() != array::Status::unscheduled || typeid(t.primitive()) != slice_type())
    return std::nullopt;
  if (t.ndim() != 4 || t.inputs().size() != 1) return std::nullopt;
  const auto& [start, stop, strides] = static_cast<const mx::Slice&>(t.primitive()).state();
  const array& buf = t.inputs()[0];
  if (buf.ndim() != 4 || buf.dtype() != mx::float32) return std::nullopt;
  for (int d = 0; d < 4; ++d) {
    if (start[d] != 0 || strides[d] != 1) return std::nullopt;
    if (d != 2 && stop[d] != buf.shape(d)) return std::nullopt;
  }
  return std::make_pair(buf, static_cast<int>(stop[2]));
}

// `p`'s node with `spec`, reading p's inputs and then `residual`.
template <class T, class Spec>
array with_residual(const array& p, Spec spec, const array& residual) {
  std::vector<array> inputs = p.inputs();
  inputs.push_back(residual);
  return array(p.shape(), mx::float32, std::make_shared<T>(p.primitive().stream(), std::move(spec)),
               std::move(inputs));
}

}  // namespace

// Matches: x is the pending output of an RmsNorm node with no epilogue
// (a norm that already adds a residual computes something else, so its
// spec, not its name, keeps it out).
// Exact because: the product node runs the same `rms_norm` kernel on the
// same rows with the same eps and weight into a scratch copy, and its product
// kernels then read those rows exactly as they would read the norm node's
// output (contiguous rows of K floats). On the GPU the product kernels fold
// the norm into their sums instead (cuda/products.cuh): equal to f32
// rounding, not bit for bit, and the same for a row alone or in a batch.
ProductInput absorb_norm(const array& x) {
  if (const auto* norm = pending<RmsNorm>(x); norm && norm->spec().epilogue == Epilogue::None) {
    std::optional<array> weight;
    if (norm->spec().norm.weight) weight = x.inputs()[1];
    return {x.inputs()[0], norm->spec().norm, weight};
  }
  return {x, std::nullopt, std::nullopt};
}

// Matches: one side is the pending output of a QuantizedProduct with one
// output in the plain layout and no epilogue yet (its input may be an
// absorbed norm), or else of an RmsNorm with no epilogue; the other side is
// f32 with exactly its shape (no broadcasting). A product is preferred:
// `h + o_proj(..)` and `h + down_proj(..)` are the residual connections of
// every layer, `h + post_norm(..)` only Gemma's.
// Exact because: the node computes its output as before, then adds the
// residual element by element, one f32 rounding each, as MLX's `add` of the
// two arrays does (IEEE addition is commutative, so the side does not matter).
std::optional<array> fold_residual(const array& a, const array& b) {
  for (const auto& [p, r] : {std::pair{&a, &b}, std::pair{&b, &a}}) {
    const auto* prod = pending<QuantizedProduct>(*p);
    if (!prod || !prod->spec().single_plain() || prod->spec().epilogue != Epilogue::None) continue;
    if (r->dtype() != mx::float32 || r->shape() != p->shape()) continue;
    ProductSpec spec = prod->spec();
    spec.epilogue = Epilogue::AddResidual;
    return with_residual<QuantizedProduct>(*p, std::move(spec), *r);
  }
  for (const auto& [p, r] : {std::pair{&a, &b}, std::pair{&b, &a}}) {
    const auto* norm = pending<RmsNorm>(*p);
    if (!norm || norm->spec().epilogue != Epilogue::None) continue;
    if (r->dtype() != mx::float32 || r->shape() != p->shape()) continue;
    NormSpec spec = norm->spec();
    spec.epilogue = Epilogue::AddResidual;
    return with_residual<RmsNorm>(*p, spec, *r);
  }
  return std::nullopt;
}

// Matches: k and v are both pending MLX `Slice` nodes taking positions
// [0, n) of axis 2 (the same n) of 4-D f32 buffers, every other axis whole,
// unit strides.
// Exact because: such a slice is a view of the buffer (same strides, offset
// 0); the attention kernel reads keys and values through their strides, so
// reading positions [0, n) of the buffers reads the same elements.
std::optional<CachePrefix> cache_prefix(const array& k, const array& v) {
  auto kb = prefix_slice(k), vb = prefix_slice(v);
  if (!kb || !vb || kb->second != vb->second) return std::nullopt;
  return CachePrefix{kb->first, vb->first, kb->second};
}

// Matches: x is the pending output of an Attention node writing the heads
// layout [B, H, L, Dv].
// Exact because: the node computes every output row (b, h, i) as before and
// only writes it elsewhere; MLX's transpose and reshape would move the same
// values there.
std::optional<array> merge_into_attention(const array& x) {
  const auto* att = pending<Attention>(x);
  if (!att || att->spec().layout != HeadLayout::Heads) return std::nullopt;
  AttentionSpec spec = att->spec();
  spec.layout = HeadLayout::Merged;
  const auto& in = x.inputs();
  return array(Attention::shape(in, HeadLayout::Merged), mx::float32,
               std::make_shared<Attention>(x.primitive().stream(), spec), in);
}

}  // namespace mlxcel::fast
