// Attention nodes (attention.h).
#include "mlxcel-mlx/cpp/nodes/attention.h"

#include <cstring>

#include "mlxcel-mlx/cpp/kernels/kernels.h"
#include "mlxcel-mlx/cpp/nodes/gpu.h"
#include "mlxcel-mlx/cpp/nodes/launch.h"

namespace mlxcel::fast {
namespace {

// The strides of `t` [B, H, L, D] as the attention kernel reads them: its
// own when the last axis is contiguous, else a row-major copy in `buf`.
const float* attention_view(const array& t, std::vector<float>& buf, int64_t* st) {
  if (t.strides()[3] == 1 || t.shape(3) <= 1) {
    for (int d = 0; d < 4; ++d) st[d] = t.strides()[d];
    st[3] = 1;
    return t.data<float>();
  }
  const float* p = row_major(t, buf);
  st[3] = 1;
  st[2] = t.shape(3);
  st[1] = st[2] * t.shape(2);
  st[0] = st[1] * t.shape(1);
  return p;
}

// Output strides of row (b, h, i) for `layout`.
void output_strides(kern::AttnArgs& a, HeadLayout layout) {
  if (layout == HeadLayout::Merged) {  // out[b, i, h, :]
    a.os[0] = static_cast<int64_t>(a.Lq) * a.H * a.Dv;
    a.os[1] = a.Dv;
    a.os[2] = static_cast<int64_t>(a.H) * a.Dv;
  } else {  // out[b, h, i, :]
    a.os[0] = static_cast<int64_t>(a.H) * a.Lq * a.Dv;
    a.os[1] = static_cast<int64_t>(a.Lq) * a.Dv;
    a.os[2] = a.Dv;
  }
}

void run_attention(const AttentionSpec& spec, std::vector<array>& in, array& out) {
  if (out.size() == 0) return;
  std::vector<float> qb, kb, vb;
  kern::AttnArgs a{};
  a.q = attention_view(in[0], qb, a.qs);
  a.k = attention_view(in[1], kb, a.ks);
  a.v = attention_view(in[2], vb, a.vs);
  a.out = out.data<float>();
  a.B = in[0].shape(0);
  a.H = in[0].shape(1);
  a.Lq = in[0].shape(2);
  a.D = in[0].shape(3);
  a.KVH = in[1].shape(1);
  a.Lk = spec.key_prefix ? *spec.key_prefix : in[1].shape(2);
  a.Dv = in[2].shape(3);
  a.scale = spec.scale;
  a.causal = spec.mask == AttentionMask::Causal;
  a.mask_kind = spec.mask == AttentionMask::Bool       ? kern::MaskKind::Bool
                : spec.mask == AttentionMask::Additive ? kern::MaskKind::Additive
                                                       : kern::MaskKind::None;
  output_strides(a, spec.layout);
  if (a.mask_kind != kern::MaskKind::None) {
    const array& m = in[3];
    for (int d = 0; d < 4; ++d) a.ms[d] = m.strides()[d];
    a.mask = a.mask_kind == kern::MaskKind::Bool ? static_cast<const void*>(m.data<uint8_t>())
                                                 : static_cast<const void*>(m.data<float>());
  }
  kern::table().attention(a);
}

// Copies `n` positions of `src` [B, KVH, n, W] (row-major) into positions
// at.. of the contiguous buffer `dst` [B, KVH, C, W].
void write_positions(const float* src, float* dst, int groups, int n, int W, int C, int at) {
  for (int g = 0; g < groups; ++g)
    std::memcpy(dst + (static_cast<int64_t>(g) * C + at) * W, src + static_cast<int64_t>(g) * n * W,
                static_cast<size_t>(n) * W * sizeof(float));
}

// Runs a cached attention step. `keep[i]`: input buffer i (row i / 2, keys
// or values) was donated to its output, which already holds its contents.
void run_cached(const CachedAttentionSpec& spec, const std::vector<bool>& keep, std::vector<array>& in,
                std::vector<array>& out) {
  const array &q = in[0], &k = in[1], &v = in[2];
  const int H = q.shape(1), L = q.shape(2), D = q.shape(3);
  const int KVH = k.shape(1), Dv = v.shape(3);
  const int rows = static_cast<int>(spec.rows.size());
  const array* freqs = spec.rope.has_freqs ? &in[3 + 2 * rows] : nullptr;
  // q and k as [B, heads, L, D] views (a copy when the last axis is strided,
  // made once for all rows), v row-major.
  std::vector<float> qb, kb, vb, tmp;
  kern::AttnArgs whole{};
  const float* qp = q.size() > 0 ? attention_view(q, qb, whole.qs) : nullptr;
  const float* kp = k.size() > 0 ? attention_view(k, kb, whole.ks) : nullptr;
  const float* vp = row_major(v, vb);
  const int64_t q_row = static_cast<int64_t>(H) * L * D, k_row = static_cast<int64_t>(KVH) * L * D;
  // Row b's rotated keys and queries, contiguous, in one scratch buffer.
  float* kr = kern::scratch(kern::kScratchStep, k_row + q_row);
  float* qr = kr + k_row;
  for (int b = 0; b < rows; ++b) {
    const CacheStep& step = spec.rows[b];
    const array &kin = in[3 + 2 * b], &vin = in[4 + 2 * b];
    array &kout = out[1 + 2 * b], &vout = out[2 + 2 * b];
    const int C = kin.shape(2);
    float* kc = kout.data<float>();
    float* vc = vout.data<float>();
    if (!keep[2 * b]) std::memcpy(kc, row_major(kin, tmp), kout.nbytes());
    if (!keep[2 * b + 1]) std::memcpy(vc, row_major(vin, tmp), vout.nbytes());
    // The row alone, as [1, heads, L, D]: the calls a batch of one makes.
    auto row = [&](const float* base, const int64_t* st, int heads) {
      RopeView view;
      view.p = base + b * st[0];
      view.sb = st[1];
      view.sl = st[2];
      view.B = heads;
      view.L = L;
      view.D = D;
      return view;
    };
    if (k_row > 0) rope_into(spec.rope, freqs, row(kp, whole.ks, KVH), step.offset, kr);
    write_positions(kr, kc, KVH, L, D, C, step.slot);
    write_positions(vp + b * static_cast<int64_t>(KVH) * L * Dv, vc, KVH, L, Dv, C, step.slot);
    if (q_row > 0) rope_into(spec.rope, freqs, row(qp, whole.qs, H), step.offset, qr);
    if (static_cast<int64_t>(L) * H * Dv == 0) continue;
    kern::AttnArgs a{};
    a.q = qr;
    a.qs[3] = 1;
    a.qs[2] = D;
    a.qs[1] = static_cast<int64_t>(L) * D;
    a.qs[0] = a.qs[1] * H;
    a.k = kc;
    a.ks[3] = 1;
    a.ks[2] = D;
    a.ks[1] = static_cast<int64_t>(C) * D;
    a.ks[0] = a.ks[1] * KVH;
    a.v = vc;
    a.vs[3] = 1;
    a.vs[2] = Dv;
    a.vs[1] = static_cast<int64_t>(C) * Dv;
    a.vs[0] = a.vs[1] * KVH;
    a.B = 1;
    a.H = H;
    a.KVH = KVH;
    a.Lq = L;
    a.Lk = step.visible;
    a.D = D;
    a.Dv = Dv;
    a.scale = spec.scale;
    a.causal = step.causal;
    a.mask_kind = kern::MaskKind::None;
    output_strides(a, HeadLayout::Merged);
    a.out = out[0].data<float>() + b * a.os[0];
    kern::table().attention(a);
  }
}

}  // namespace

mx::Shape Attention::shape(const std::vector<array>& in, HeadLayout layout) {
  const auto& q = in[0];
  if (layout == HeadLayout::Merged) return {q.shape(0), q.shape(2), q.shape(1) * in[2].shape(3)};
  return {q.shape(0), q.shape(1), q.shape(2), in[2].shape(3)};
}

void Attention::eval_cpu(const std::vector<array>& inputs, array& out) {
  launch(*this, inputs, out,
         [spec = spec_](std::vector<array>& in, array& out) { run_attention(spec, in, out); });
}

std::vector<mx::Shape> CachedAttention::shapes(const std::vector<array>& in, int rows) {
  const array &q = in[0], &v = in[2];
  std::vector<mx::Shape> out{{q.shape(0), q.shape(2), q.shape(1) * v.shape(3)}};
  for (int i = 0; i < 2 * rows; ++i) out.push_back(in[3 + i].shape());
  return out;
}

std::vector<bool> claim_cache_buffers(const std::vector<array>& inputs, std::vector<array>& outputs,
                                      const std::function<void(array&)>& allocate) {
  // Every output of a multi-output node holds its own copy of the inputs
  // (array::make_arrays), so each cache buffer has one reference per output
  // here and is never donatable. MLX drops the siblings' copies right after
  // the node runs (array::detach, unless the node is traced); dropping them
  // now lets a buffer nothing else holds be written in place.
  if (!outputs[0].is_tracer()) {
    for (auto& out : outputs)
      if (&out.inputs() != &inputs) out.inputs().clear();
  }
  const size_t buffers = outputs.size() - 1;
  std::vector<bool> donated(buffers);
  for (size_t i = 0; i < buffers; ++i) {
    const array& buf = inputs[3 + i];
    array& out = outputs[1 + i];
    donated[i] = buf.is_donatable() && buf.flags().row_contiguous && buf.data_size() == buf.size();
    if (donated[i]) {
      out.copy_shared_buffer(buf);
    } else {
      allocate(out);
    }
  }
  allocate(outputs[0]);
  return donated;
}

void CachedAttention::eval_gpu(const std::vector<array>& inputs, std::vector<array>& outputs) {
  auto donated = claim_cache_buffers(inputs, outputs, [s = stream()](array& a) { gpu::allocate_output(s, a); });
  gpu::eval_cached_attention(stream(), spec_, inputs, outputs, donated);
}

void CachedAttention::eval_cpu(const std::vector<array>& inputs, std::vector<array>& outputs) {
  auto donated =
      claim_cache_buffers(inputs, outputs, [](array& a) { a.set_data(mx::allocator::malloc(a.nbytes())); });
  dispatch_multi(*this, inputs, outputs,
                 [spec = spec_, keep = std::move(donated)](std::vector<array>& ins, std::vector<array>& outs) {
                   run_cached(spec, keep, ins, outs);
                 });
}

}  // namespace mlxcel::fast
