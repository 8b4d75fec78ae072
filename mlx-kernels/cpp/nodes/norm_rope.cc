// RMS norm and RoPE nodes (norm_rope.h). RoPE's cos/sin of every position is
// computed once per (frequencies, scale) exactly as MLX's fallback computes
// it (f32 positions and products, MLX's own exp, sin and cos), then reused by
// every layer and step.
#include "mlxcel-mlx/cpp/nodes/norm_rope.h"

#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>

#include "mlxcel-mlx/cpp/kernels/kernels.h"
#include "mlxcel-mlx/cpp/kernels/mlx_math.h"
#include "mlxcel-mlx/cpp/nodes/gpu.h"
#include "mlxcel-mlx/cpp/nodes/launch.h"

namespace mlxcel::fast {
namespace {

struct RopeTable {
  std::vector<float> inv;  // inverse frequencies
  float scale = 1.0f;
  int positions = 0;
  std::vector<float> cos, sin;  // [positions][inv.size()]
};

std::mutex g_rope_mu;
std::vector<std::unique_ptr<RopeTable>> g_rope_tables;  // most recently used first

// Call with g_rope_mu held. Rows [0, positions) of the returned table are valid.
RopeTable& rope_table(const std::vector<float>& inv, float scale, int positions) {
  auto it = g_rope_tables.begin();
  for (; it != g_rope_tables.end(); ++it) {
    const auto& t = **it;
    if (t.scale == scale && t.inv.size() == inv.size() &&
        std::memcmp(t.inv.data(), inv.data(), inv.size() * sizeof(float)) == 0)
      break;
  }
  if (it == g_rope_tables.end()) {
    auto t = std::make_unique<RopeTable>();
    t->inv = inv;
    t->scale = scale;
    g_rope_tables.insert(g_rope_tables.begin(), std::move(t));
    if (g_rope_tables.size() > 8) g_rope_tables.pop_back();
  } else if (it != g_rope_tables.begin()) {
    auto t = std::move(*it);
    g_rope_tables.erase(it);
    g_rope_tables.insert(g_rope_tables.begin(), std::move(t));
  }
  RopeTable& t = *g_rope_tables.front();
  if (positions > t.positions) {
    const int half = static_cast<int>(t.inv.size());
    const int grow = ((positions + 255) / 256) * 256;
    t.cos.resize(static_cast<size_t>(grow) * half);
    t.sin.resize(static_cast<size_t>(grow) * half);
    for (int p = t.positions; p < grow; ++p) {
      const float pos = static_cast<float>(p) * t.scale;
      for (int i = 0; i < half; ++i) {
        const float theta = pos * t.inv[i];
        t.cos[static_cast<size_t>(p) * half + i] = kern::mlx_cos(theta);
        t.sin[static_cast<size_t>(p) * half + i] = kern::mlx_sin(theta);
      }
    }
    t.positions = grow;
  }
  return t;
}

}  // namespace

void RmsNorm::eval_cpu(const std::vector<array>& inputs, array& out) {
  launch(*this, inputs, out, [spec = spec_](std::vector<array>& in, array& out) {
    const int D = in[0].shape(-1);
    if (D == 0 || in[0].size() == 0) return;
    std::vector<float> xb, wb, rb;
    int64_t ldx = 0;
    const float* x = rows_of(in[0], xb, ldx);
    const float* w = spec.norm.weight ? row_major(in[1], wb) : nullptr;
    float* o = out.data<float>();
    kern::table().rms_norm(x, ldx, w, o, static_cast<int>(in[0].size() / D), D, spec.norm.eps);
    if (spec.epilogue == Epilogue::AddResidual) {
      // One rounding per element, as MLX's add of the two.
      const float* r = row_major(in.back(), rb);
      for (size_t i = 0; i < out.size(); ++i) o[i] = r[i] + o[i];
    }
  });
}

void RmsNorm::eval_gpu(const std::vector<array>& inputs, array& out) {
  gpu::eval_rms_norm(stream(), spec_, inputs, out);
}

RopeView rope_view(const array& x, std::vector<float>& buf) {
  const int nd = x.ndim();
  RopeView v;
  v.L = x.shape(nd - 2);
  v.D = x.shape(nd - 1);
  v.p = x.data<float>();
  v.sl = x.strides()[nd - 2];
  if (nd == 3) {
    v.B = x.shape(0);
    v.sb = x.strides()[0];
  } else if (nd == 4) {
    v.A = x.shape(0);
    v.B = x.shape(1);
    v.sa = x.strides()[0];
    v.sb = x.strides()[1];
  }
  if (x.strides()[nd - 1] != 1 || nd > 4) {
    v.p = row_major(x, buf);
    v.A = 1;
    v.B = static_cast<int>(x.size() / (static_cast<size_t>(v.L) * v.D));
    v.sl = v.D;
    v.sb = static_cast<int64_t>(v.L) * v.D;
    v.sa = 0;
  }
  return v;
}

void rope_into(const RopeConfig& rc, const array* freqs, const RopeView& x, int offset, float* out) {
  if (static_cast<int64_t>(x.A) * x.B * x.L * x.D == 0) return;
  const int half = rc.dims / 2;
  std::vector<float> inv(half);
  if (rc.has_freqs) {
    std::vector<float> fb;
    const float* f = row_major(*freqs, fb);
    for (int i = 0; i < half; ++i) inv[i] = 1.0f / f[i];
  } else {
    // exp(arange(0, -half, -1) * (log(base) / half)), in f32 as MLX does.
    const float c = std::log(rc.base) / half;
    for (int i = 0; i < half; ++i) inv[i] = kern::mlx_exp(static_cast<float>(-i) * c);
  }
  std::lock_guard<std::mutex> lk(g_rope_mu);
  RopeTable& t = rope_table(inv, rc.scale, offset + x.L);
  kern::RopeArgs a{};
  a.x = x.p;
  a.sa = x.sa;
  a.sb = x.sb;
  a.sl = x.sl;
  a.out = out;
  a.A = x.A;
  a.B = x.B;
  a.L = x.L;
  a.D = x.D;
  a.dims = rc.dims;
  a.traditional = rc.traditional;
  a.cos = t.cos.data() + static_cast<size_t>(offset) * half;
  a.sin = t.sin.data() + static_cast<size_t>(offset) * half;
  kern::table().rope(a);
}

void Rope::eval_cpu(const std::vector<array>& inputs, array& out) {
  launch(*this, inputs, out, [rc = rc_, offset = offset_](std::vector<array>& in, array& out) {
    if (in[0].size() == 0) return;
    std::vector<float> xb;
    rope_into(rc, rc.has_freqs ? &in[1] : nullptr, rope_view(in[0], xb), offset, out.data<float>());
  });
}

}  // namespace mlxcel::fast
