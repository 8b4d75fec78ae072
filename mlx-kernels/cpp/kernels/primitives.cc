// mlxcel's CPU kernels registered as MLX primitives, and the operations that
// choose between them and MLX's own ops.
//
// Mechanics (MLX 0.32 CPU backend): `eval_cpu` runs on the thread that called
// eval, before the inputs are necessarily computed. It allocates the output,
// then hands a task to the stream's command encoder; the task runs on the
// stream thread after the inputs' tasks, and only it may read them. The task
// captures weak copies of the arrays and its parameters by value (the
// primitive itself may be released before the task runs). Kernels never throw:
// every check is made when the node is built.
#include "mlxcel-mlx/cpp/kernels/primitives.h"

#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <unordered_set>

#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/fast.h"
#include "mlx/ops.h"
#include "mlx/primitives.h"
#include "mlx/utils.h"
#include "mlxcel-mlx/cpp/kernels/kernels.h"

namespace mlxcel::fast {
namespace {

using mx::array;

// Whether `a` is the not yet computed output of a `primitive` node: one that
// a graph fusion may still rewrite or absorb.
bool pending_node(const array& a, const char* primitive) {
  return a.has_primitive() && a.status() == array::Status::unscheduled &&
         std::strcmp(a.primitive().name(), primitive) == 0;
}

// ---------------------------------------------------------------------------
// Reading inputs inside a task.

// The elements of `a` in row-major order: its own memory when it is
// row-contiguous, else a copy in `buf`.
template <class T>
const T* row_major(const array& a, std::vector<T>& buf) {
  if (a.size() == 0) return nullptr;
  if (a.flags().row_contiguous) return a.data<T>();
  buf.resize(a.size());
  const auto& shape = a.shape();
  const auto& strides = a.strides();
  const int nd = a.ndim();
  const int inner = shape[nd - 1];
  const int64_t is = strides[nd - 1];
  const size_t rows = a.size() / inner;
  std::vector<int> idx(nd, 0);
  const T* src = a.data<T>();
  T* dst = buf.data();
  for (size_t r = 0; r < rows; ++r) {
    int64_t off = 0;
    for (int d = 0; d < nd - 1; ++d) off += idx[d] * strides[d];
    for (int c = 0; c < inner; ++c) dst[c] = src[off + c * is];
    dst += inner;
    for (int d = nd - 2; d >= 0; --d) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
  return buf.data();
}

// When `a`, read as rows of its last axis, has a contiguous last axis and one
// stride between consecutive rows, that stride in elements.
std::optional<int64_t> row_stride(const array& a) {
  const int nd = a.ndim();
  if (nd == 0) return std::nullopt;
  const auto& sh = a.shape();
  const auto& st = a.strides();
  if (sh[nd - 1] > 1 && st[nd - 1] != 1) return std::nullopt;
  int64_t stride = -1, expect = 0;
  for (int d = nd - 2; d >= 0; --d) {
    if (sh[d] == 1) continue;
    if (stride < 0) {
      stride = st[d];
    } else if (st[d] != expect) {
      return std::nullopt;
    }
    expect = st[d] * sh[d];
  }
  return stride < 0 ? static_cast<int64_t>(sh[nd - 1]) : stride;
}

// Rows of the last axis of `a`: pointer and row stride, copying when the
// layout has no single row stride.
const float* rows_of(const array& a, std::vector<float>& buf, int64_t& ld) {
  if (auto s = row_stride(a)) {
    ld = *s;
    return a.size() == 0 ? nullptr : a.data<float>();
  }
  ld = a.shape(-1);
  return row_major(a, buf);
}

// Scales or biases (f32, f16 or bf16) in row-major order, and their kern::ScaleType.
struct ScaleData {
  std::vector<float> b32;
  std::vector<uint16_t> b16;
  const void* read(const array& a, int& type) {
    if (a.dtype() == mx::float32) {
      type = kern::kScaleF32;
      return row_major(a, b32);
    }
    type = a.dtype() == mx::float16 ? kern::kScaleF16 : kern::kScaleBF16;
    return row_major(a, b16);
  }
};

// Set while eval_inline runs nodes on the calling thread.
thread_local bool t_inline = false;

// Hands `task` to the stream's encoder, or runs it now under eval_inline
// (whose caller has checked that every input is already computed).
template <class T>
void submit(mx::cpu::CommandEncoder& enc, T&& task) {
  if (t_inline) {
    task();
  } else {
    enc.dispatch(std::forward<T>(task));
  }
}

// Allocates the output and dispatches `f(inputs, out)` on the stream.
template <class F>
void launch(mx::Primitive& p, const std::vector<array>& inputs, array& out, F f) {
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& enc = mx::cpu::get_command_encoder(p.stream());
  std::vector<array> ins;
  ins.reserve(inputs.size());
  for (const auto& in : inputs) {
    enc.set_input_array(in);
    ins.push_back(array::unsafe_weak_copy(in));
  }
  enc.set_output_array(out);
  submit(enc, [f = std::move(f), ins = std::move(ins), out = array::unsafe_weak_copy(out)]() mutable {
    f(ins, out);
  });
}

// Dispatches `f(inputs, outputs)` on the stream for outputs whose memory is
// already set (allocated, or an input's buffer taken over).
template <class F>
void dispatch_multi(mx::Primitive& p, const std::vector<array>& inputs, std::vector<array>& outputs, F f) {
  auto& enc = mx::cpu::get_command_encoder(p.stream());
  std::vector<array> ins, outs;
  ins.reserve(inputs.size());
  outs.reserve(outputs.size());
  for (const auto& in : inputs) {
    enc.set_input_array(in);
    ins.push_back(array::unsafe_weak_copy(in));
  }
  for (auto& out : outputs) {
    enc.set_output_array(out);
    outs.push_back(array::unsafe_weak_copy(out));
  }
  submit(enc, [f = std::move(f), ins = std::move(ins), outs = std::move(outs)]() mutable { f(ins, outs); });
}

// `launch` for primitives with several outputs.
template <class F>
void launch_multi(mx::Primitive& p, const std::vector<array>& inputs, std::vector<array>& outputs, F f) {
  for (auto& out : outputs) out.set_data(mx::allocator::malloc(out.nbytes()));
  dispatch_multi(p, inputs, outputs, std::move(f));
}

class KernelPrimitive : public mx::UnaryPrimitive {
 public:
  explicit KernelPrimitive(mx::Stream s) : mx::UnaryPrimitive(s) {}
  void eval_gpu(const std::vector<array>&, array&) override {
    throw std::runtime_error(std::string(name()) +
                             ": mlxcel's CPU kernel has no GPU version (on the GPU mlxcel uses MLX's own op)");
  }
};

// ---------------------------------------------------------------------------
// Quantized matmul and row gather.

class QuantizedGather : public KernelPrimitive {
 public:
  QuantizedGather(mx::Stream s, int gs, int bits, float scale)
      : KernelPrimitive(s), gs_(gs), bits_(bits), scale_(scale) {}
  const char* name() const override { return "MlxcelQuantizedGather"; }
  bool is_equivalent(const mx::Primitive& o) const override {
    auto& q = static_cast<const QuantizedGather&>(o);
    return gs_ == q.gs_ && bits_ == q.bits_ && scale_ == q.scale_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<array>& in) override {
    auto shape = in[0].shape();
    shape.push_back(in[1].shape(1) * 32 / bits_);
    return {shape};
  }
  void eval_cpu(const std::vector<array>& inputs, array& out) override {
    launch(*this, inputs, out, [gs = gs_, bits = bits_, scale = scale_](std::vector<array>& in, array& out) {
      const array& ids = in[0];
      const int N = in[1].shape(0);
      std::vector<int64_t> idx(ids.size());
      std::vector<uint8_t> raw;
      // Any integer dtype; negative ids count from the end (as take does),
      // anything still out of range is clamped (never read out of bounds).
      auto read = [&](auto tag) {
        using T = decltype(tag);
        std::vector<T> buf;
        const T* p = row_major(ids, buf);
        for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int64_t>(p[i]);
      };
      switch (ids.dtype().val()) {
        case mx::Dtype::Val::uint8: read(uint8_t{}); break;
        case mx::Dtype::Val::uint16: read(uint16_t{}); break;
        case mx::Dtype::Val::uint32: read(uint32_t{}); break;
        case mx::Dtype::Val::uint64: read(uint64_t{}); break;
        case mx::Dtype::Val::int8: read(int8_t{}); break;
        case mx::Dtype::Val::int16: read(int16_t{}); break;
        case mx::Dtype::Val::int32: read(int32_t{}); break;
        default: read(int64_t{}); break;
      }
      for (auto& i : idx) {
        if (i < 0) i += N;
        if (i < 0 || i >= N) i = i < 0 ? 0 : N - 1;
      }
      std::vector<uint32_t> wb;
      ScaleData sb, bb;
      kern::GatherArgs a{};
      a.w = row_major(in[1], wb);
      a.scales = sb.read(in[2], a.scale_type);
      a.biases = bb.read(in[3], a.scale_type);
      a.ids = idx.data();
      a.out = out.data<float>();
      a.n_ids = static_cast<int>(idx.size());
      a.K = in[1].shape(1) * 32 / bits;
      a.group_size = gs;
      a.bits = bits;
      if (N > 0) kern::table().gather(a);
      // After dequantization, as `embedding(ids) * scale` rounds (Gemma).
      if (scale != 1.0f) {
        float* o = out.data<float>();
        for (size_t i = 0; i < out.size(); ++i) o[i] *= scale;
      }
    });
  }

 private:
  int gs_, bits_;
  float scale_;
};

// Several quantized products of one x in one pass (q, k and v; gate and up).
// Output i is `x @ W_iᵀ` shaped like x with N_i features, or, when heads[i] >
// 0, split into heads and transposed: [B, heads, L, N_i / heads] for x
// [B, L, K] (what attention wants; for one position the memory is the same).
//
// An RMS norm of x can be folded in (`NormSpec`): the node built by
// `rms_norm` right before is absorbed when the products are built on its
// output, so the normalised rows never become a separate node. Inputs: x,
// the norm's weight if it has one, then (w, scales, biases) per product.
struct NormSpec {
  int kind = 0;  // 0 none, 1 RMS norm without weight, 2 with weight
  float eps = 0.0f;
  bool operator==(const NormSpec& o) const { return kind == o.kind && eps == o.eps; }
  int inputs() const { return kind == 2 ? 1 : 0; }
};

// Runs the products of `in` into `dst[i]` (plain [M, N_i] layout each);
// returns the row count M.
int run_products(std::vector<array>& in, NormSpec norm, int gs, int bits, const std::vector<float*>& dst) {
  const array& x = in[0];
  const int first = 1 + norm.inputs();
  const int K = x.shape(-1);
  const int M = K == 0 ? 0 : static_cast<int>(x.size() / K);
  const int n = static_cast<int>(dst.size());
  std::vector<float> xb, xn, wnb;
  std::vector<ScaleData> sb(n), bb(n);
  std::vector<std::vector<uint32_t>> wb(n);
  std::vector<kern::QmmArgs> args(n);
  int64_t ldx = K;
  const float* xp = K == 0 ? nullptr : rows_of(x, xb, ldx);
  if (norm.kind != 0 && M > 0 && K > 0) {
    xn.resize(static_cast<size_t>(M) * K);
    const float* wn = norm.kind == 2 ? row_major(in[1], wnb) : nullptr;
    kern::table().rms_norm(xp, ldx, wn, xn.data(), M, K, norm.eps);
    xp = xn.data();
    ldx = K;
  }
  for (int i = 0; i < n; ++i) {
    auto& a = args[i];
    const int wi = first + 3 * i;
    a.x = xp;
    a.ldx = ldx;
    a.w = row_major(in[wi], wb[i]);
    a.scales = sb[i].read(in[wi + 1], a.scale_type);
    a.biases = bb[i].read(in[wi + 2], a.scale_type);
    a.N = in[wi].shape(0);
    a.out = dst[i];
    a.ldo = a.N;
    a.M = M;
    a.K = K;
    a.group_size = gs;
    a.bits = bits;
    if (K == 0) std::memset(dst[i], 0, static_cast<size_t>(M) * a.N * sizeof(float));
  }
  if (K > 0 && M > 0) kern::table().qmm_multi(args.data(), n);
  return M;
}

// With `residual` (one plain product only), a last input r of the output's
// shape is added to the product: `x Wᵀ + r`, a residual connection absorbed
// by `add` (see there), which saves a graph node per projection.
class QuantizedLinearMulti : public mx::Primitive {
 public:
  QuantizedLinearMulti(mx::Stream s, int gs, int bits, std::vector<int> heads, NormSpec norm, bool residual = false)
      : mx::Primitive(s), gs_(gs), bits_(bits), heads_(std::move(heads)), norm_(norm), residual_(residual) {}
  const char* name() const override {
    if (residual_) return "MlxcelQuantizedLinearAdd";
    return heads_.size() == 1 && heads_[0] == 0 ? "MlxcelQuantizedLinear" : "MlxcelQuantizedLinearMulti";
  }
  bool is_equivalent(const mx::Primitive& o) const override {
    auto& q = static_cast<const QuantizedLinearMulti&>(o);
    return gs_ == q.gs_ && bits_ == q.bits_ && heads_ == q.heads_ && norm_ == q.norm_ && residual_ == q.residual_;
  }
  int group_size() const { return gs_; }
  int bits() const { return bits_; }
  const std::vector<int>& heads() const { return heads_; }
  NormSpec norm() const { return norm_; }
  bool residual() const { return residual_; }
  void eval_gpu(const std::vector<array>&, std::vector<array>&) override {
    throw std::runtime_error("MlxcelQuantizedLinearMulti has no GPU version");
  }
  std::vector<mx::Shape> output_shapes(const std::vector<array>& in) override { return shapes(in, heads_, norm_); }

  static std::vector<mx::Shape> shapes(const std::vector<array>& in, const std::vector<int>& heads, NormSpec norm) {
    const array& x = in[0];
    std::vector<mx::Shape> out;
    for (size_t i = 0; i < heads.size(); ++i) {
      const int N = in[1 + norm.inputs() + 3 * i].shape(0);
      if (heads[i] > 0) {
        out.push_back({x.shape(0), heads[i], x.shape(1), N / heads[i]});
      } else {
        auto sh = x.shape();
        sh.back() = N;
        out.push_back(sh);
      }
    }
    return out;
  }

  void eval_cpu(const std::vector<array>& inputs, std::vector<array>& outputs) override {
    launch_multi(*this, inputs, outputs,
                 [gs = gs_, bits = bits_, heads = heads_, norm = norm_, residual = residual_](
                     std::vector<array>& in, std::vector<array>& out) {
                   const array& x = in[0];
                   const int n = static_cast<int>(heads.size());
                   // With one position per sequence the head layout is the plain one.
                   const int L = x.ndim() == 3 ? x.shape(1) : 1;
                   std::vector<std::vector<float>> tmp(n);
                   std::vector<float*> dst(n);
                   for (int i = 0; i < n; ++i) {
                     if (heads[i] > 0 && L > 1) {
                       tmp[i].resize(out[i].size());
                       dst[i] = tmp[i].data();
                     } else {
                       dst[i] = out[i].data<float>();
                     }
                   }
                   const int M = run_products(in, norm, gs, bits, dst);
                   if (residual) {
                     // out[0] is [M, N] (plain layout): add r row by row.
                     std::vector<float> rb;
                     int64_t ldr = 0;
                     const float* r = rows_of(in.back(), rb, ldr);
                     const int64_t N = out[0].shape(-1);
                     float* o = out[0].data<float>();
                     for (int64_t m = 0; m < M; ++m)
                       for (int64_t j = 0; j < N; ++j) o[m * N + j] += r[m * ldr + j];
                   }
                   for (int i = 0; i < n; ++i) {
                     if (tmp[i].empty()) continue;
                     const int B = x.shape(0), H = heads[i], N = in[1 + norm.inputs() + 3 * i].shape(0), D = N / H;
                     float* o = out[i].data<float>();
                     for (int b = 0; b < B; ++b)
                       for (int l = 0; l < L; ++l)
                         for (int h = 0; h < H; ++h)
                           std::memcpy(o + ((static_cast<int64_t>(b) * H + h) * L + l) * D,
                                       tmp[i].data() + (static_cast<int64_t>(b) * L + l) * N + h * D,
                                       D * sizeof(float));
                   }
                 });
  }

 private:
  int gs_, bits_;
  std::vector<int> heads_;
  NormSpec norm_;
  bool residual_;
};

// act(x Gᵀ) * (x Uᵀ): a gated MLP's gate and up projections and its
// activation in one node (with an absorbed RMS norm of x, like the above).
class QuantizedGatedLinear : public KernelPrimitive {
 public:
  QuantizedGatedLinear(mx::Stream s, int gs, int bits, int kind, NormSpec norm)
      : KernelPrimitive(s), gs_(gs), bits_(bits), kind_(kind), norm_(norm) {}
  const char* name() const override { return "MlxcelQuantizedGatedLinear"; }
  bool is_equivalent(const mx::Primitive& o) const override {
    auto& q = static_cast<const QuantizedGatedLinear&>(o);
    return gs_ == q.gs_ && bits_ == q.bits_ && kind_ == q.kind_ && norm_ == q.norm_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<array>& in) override {
    auto shape = in[0].shape();
    shape.back() = in[1 + norm_.inputs()].shape(0);
    return {shape};
  }
  void eval_cpu(const std::vector<array>& inputs, array& out) override {
    launch(*this, inputs, out,
           [gs = gs_, bits = bits_, kind = kind_, norm = norm_](std::vector<array>& in, array& out) {
             const int N = in[1 + norm.inputs()].shape(0);
             const size_t count = out.size();
             float* g = kern::scratch(kern::kScratchShared, 2 * count);
             float* u = g + count;
             const int M = run_products(in, norm, gs, bits, {g, u});
             if (M == 0 || N == 0) return;
             kern::GateArgs ga{g, N, u, N, out.data<float>(), M, N, kind};
             kern::table().gate(ga);
           });
  }

 private:
  int gs_, bits_, kind_;
  NormSpec norm_;
};

// ---------------------------------------------------------------------------
// RMS norm.

class RmsNorm : public KernelPrimitive {
 public:
  // With `residual`, the last input is added to the normalised rows as they
  // are written: `residual + rms_norm(x) * w` (Gemma's post-norms).
  RmsNorm(mx::Stream s, float eps, bool has_weight, bool residual = false)
      : KernelPrimitive(s), eps_(eps), has_weight_(has_weight), residual_(residual) {}
  // A different name for the residual form: `absorb_norm` must not fold it
  // into a product as if it were a plain norm.
  const char* name() const override { return residual_ ? "MlxcelRmsNormAdd" : "MlxcelRmsNorm"; }
  float eps() const { return eps_; }
  bool has_weight() const { return has_weight_; }
  bool is_equivalent(const mx::Primitive& o) const override {
    auto& r = static_cast<const RmsNorm&>(o);
    return eps_ == r.eps_ && has_weight_ == r.has_weight_ && residual_ == r.residual_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<array>& in) override { return {in[0].shape()}; }
  void eval_cpu(const std::vector<array>& inputs, array& out) override {
    launch(*this, inputs, out,
           [eps = eps_, has_weight = has_weight_, residual = residual_](std::vector<array>& in, array& out) {
             const int D = in[0].shape(-1);
             if (D == 0 || in[0].size() == 0) return;
             std::vector<float> xb, wb, rb;
             int64_t ldx = 0;
             const float* x = rows_of(in[0], xb, ldx);
             const float* w = has_weight ? row_major(in[1], wb) : nullptr;
             float* o = out.data<float>();
             kern::table().rms_norm(x, ldx, w, o, static_cast<int>(in[0].size() / D), D, eps);
             if (residual) {
               const float* r = row_major(in.back(), rb);
               for (size_t i = 0; i < out.size(); ++i) o[i] = r[i] + o[i];
             }
           });
  }

 private:
  float eps_;
  bool has_weight_;
  bool residual_;
};

// ---------------------------------------------------------------------------
// RoPE. The cos/sin of every position is computed once per (frequencies,
// scale) exactly as MLX's fallback computes it (f32 positions and products,
// MLX's own exp, sin and cos), then reused by every layer and step.

struct RopeTable {
  std::vector<float> inv;  // inverse frequencies
  float scale = 1.0f;
  int positions = 0;
  std::vector<float> cos, sin;  // [positions][inv.size()]
};

std::mutex g_rope_mu;
std::vector<std::unique_ptr<RopeTable>> g_rope_tables;  // most recently used first

// MLX's CPU exp, sin and cos on x86 (mlx/backend/cpu/simd/math.h, one lane),
// operation for operation, so the tables hold exactly what MLX computes.
float mlx_exp(float x0) {
  const float x = x0 * 1.442695f;
  const float ip = std::floor(x + 0.5f);
  const float f = x - ip;
  float p = 1.535336188319500e-4f;
  p = std::fma(p, f, 1.339887440266574e-3f);
  p = std::fma(p, f, 9.618437357674640e-3f);
  p = std::fma(p, f, 5.550332471162809e-2f);
  p = std::fma(p, f, 2.402264791363012e-1f);
  p = std::fma(p, f, 6.931472028550421e-1f);
  p = std::fma(p, f, 1.0f);
  if (std::isnan(x0)) return x0;
  if (x0 > 88.0f) return INFINITY;
  if (x0 < -88.0f) return 0.0f;
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(ip) + 127) << 23;
  float e;
  std::memcpy(&e, &bits, sizeof(e));
  return e * p;
}

// Cephes sincos as MLX has it (arguments beyond 2^23 go to libm, as there).
float mlx_sincos(float in, bool sine) {
  if (std::fabs(in) > 8388608.0f) return sine ? std::sin(in) : std::cos(in);
  bool sign_sin = in < 0;
  float x = std::fabs(in);
  float y = x * 1.27323954473516f;
  uint32_t emm2 = static_cast<uint32_t>(y);
  emm2 = (emm2 + 1) & ~1u;
  y = static_cast<float>(emm2);
  const bool poly = (emm2 & 2) != 0;
  x = std::fma(y, -0.78515625f, x);
  x = std::fma(y, -2.4187564849853515625e-4f, x);
  x = std::fma(y, -3.77489497744594108e-8f, x);
  sign_sin = sign_sin ^ ((emm2 & 4) != 0);
  const bool sign_cos = ((emm2 - 2) & 4) != 0;
  const float z = x * x;
  float y1 = std::fma(z, 2.443315711809948e-5f, -1.388731625493765e-3f);
  float y2 = std::fma(z, -1.9515295891e-4f, 8.3321608736e-3f);
  y1 = std::fma(y1, z, 4.166664568298827e-2f);
  y2 = std::fma(y2, z, -1.6666654611e-1f);
  y1 = y1 * z;
  y2 = y2 * z;
  y1 = y1 * z;
  y2 = std::fma(x, y2, x);
  y1 = std::fma(z, -0.5f, y1);
  y1 = y1 + 1.0f;
  if (sine) {
    const float ys = poly ? y1 : y2;
    return sign_sin ? -ys : ys;
  }
  const float yc = poly ? y2 : y1;
  return sign_cos ? yc : -yc;
}

float mlx_sin(float x) { return mlx_sincos(x, true); }
float mlx_cos(float x) { return mlx_sincos(x, false); }

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
        t.cos[static_cast<size_t>(p) * half + i] = mlx_cos(theta);
        t.sin[static_cast<size_t>(p) * half + i] = mlx_sin(theta);
      }
    }
    t.positions = grow;
  }
  return t;
}

// The parameters of a rotary embedding node.
struct RopeConfig {
  int dims;
  bool traditional;
  float base, scale;
  bool has_freqs;
  bool operator==(const RopeConfig&) const = default;
};

// Rotates `x [.., L, D]` (f32, any strides) for positions `offset..` into a
// contiguous `out` of its shape; `freqs` are the wavelengths when the config
// has them. Runs inside a task.
void rope_into(const RopeConfig& rc, const array* freqs, const array& x, int offset, float* out) {
  if (x.size() == 0) return;
  const int half = rc.dims / 2;
  std::vector<float> inv(half);
  if (rc.has_freqs) {
    std::vector<float> fb;
    const float* f = row_major(*freqs, fb);
    for (int i = 0; i < half; ++i) inv[i] = 1.0f / f[i];
  } else {
    // exp(arange(0, -half, -1) * (log(base) / half)), in f32 as MLX does.
    const float c = std::log(rc.base) / half;
    for (int i = 0; i < half; ++i) inv[i] = mlx_exp(static_cast<float>(-i) * c);
  }
  const int nd = x.ndim();
  const int L = x.shape(nd - 2), D = x.shape(nd - 1);
  // View x as [A, B, L, D].
  std::vector<float> xb;
  const float* xp = x.data<float>();
  int64_t sa = 0, sb = 0, sl = x.strides()[nd - 2];
  int A = 1, B = 1;
  if (nd == 3) {
    B = x.shape(0);
    sb = x.strides()[0];
  } else if (nd == 4) {
    A = x.shape(0);
    B = x.shape(1);
    sa = x.strides()[0];
    sb = x.strides()[1];
  }
  if (x.strides()[nd - 1] != 1 || nd > 4) {
    xp = row_major(x, xb);
    A = 1;
    B = static_cast<int>(x.size() / (static_cast<size_t>(L) * D));
    sl = D;
    sb = static_cast<int64_t>(L) * D;
    sa = 0;
  }
  std::lock_guard<std::mutex> lk(g_rope_mu);
  RopeTable& t = rope_table(inv, rc.scale, offset + L);
  kern::RopeArgs a{};
  a.x = xp;
  a.sa = sa;
  a.sb = sb;
  a.sl = sl;
  a.out = out;
  a.A = A;
  a.B = B;
  a.L = L;
  a.D = D;
  a.dims = rc.dims;
  a.traditional = rc.traditional;
  a.cos = t.cos.data() + static_cast<size_t>(offset) * half;
  a.sin = t.sin.data() + static_cast<size_t>(offset) * half;
  kern::table().rope(a);
}

class Rope : public KernelPrimitive {
 public:
  Rope(mx::Stream s, RopeConfig rc, int offset) : KernelPrimitive(s), rc_(rc), offset_(offset) {}
  const char* name() const override { return "MlxcelRope"; }
  bool is_equivalent(const mx::Primitive& o) const override {
    auto& r = static_cast<const Rope&>(o);
    return rc_ == r.rc_ && offset_ == r.offset_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<array>& in) override { return {in[0].shape()}; }
  void eval_cpu(const std::vector<array>& inputs, array& out) override {
    launch(*this, inputs, out, [rc = rc_, offset = offset_](std::vector<array>& in, array& out) {
      rope_into(rc, rc.has_freqs ? &in[1] : nullptr, in[0], offset, out.data<float>());
    });
  }

 private:
  RopeConfig rc_;
  int offset_;
};

// ---------------------------------------------------------------------------
// Attention.

// Inputs q, k, v [, mask broadcast to [B, H, Lq, Lk]]. `kv_len` >= 0: k and v
// are whole cache buffers of which the first kv_len positions are the keys
// (the slice the cache would take, absorbed). `merged`: the output is
// [B, Lq, H * Dv] (heads merged for the output projection) instead of
// [B, H, Lq, Dv].
class Attention : public KernelPrimitive {
 public:
  Attention(mx::Stream s, float scale, bool causal, int mask_kind, bool merged, int kv_len)
      : KernelPrimitive(s), scale_(scale), causal_(causal), mask_kind_(mask_kind), merged_(merged), kv_len_(kv_len) {}
  const char* name() const override { return "MlxcelAttention"; }
  bool is_equivalent(const mx::Primitive& o) const override {
    auto& a = static_cast<const Attention&>(o);
    return scale_ == a.scale_ && causal_ == a.causal_ && mask_kind_ == a.mask_kind_ && merged_ == a.merged_ &&
           kv_len_ == a.kv_len_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<array>& in) override { return {shape(in, merged_)}; }
  static mx::Shape shape(const std::vector<array>& in, bool merged) {
    const auto& q = in[0];
    if (merged) return {q.shape(0), q.shape(2), q.shape(1) * in[2].shape(3)};
    return {q.shape(0), q.shape(1), q.shape(2), in[2].shape(3)};
  }
  float scale() const { return scale_; }
  bool causal() const { return causal_; }
  int mask_kind() const { return mask_kind_; }
  bool merged() const { return merged_; }
  int kv_len() const { return kv_len_; }

  void eval_cpu(const std::vector<array>& inputs, array& out) override {
    launch(*this, inputs, out,
           [scale = scale_, causal = causal_, mask_kind = mask_kind_, merged = merged_, kv_len = kv_len_](
               std::vector<array>& in, array& out) {
             if (out.size() == 0) return;
             std::vector<float> qb, kb, vb;
             kern::AttnArgs a{};
             auto view = [](const array& t, std::vector<float>& buf, int64_t* st) -> const float* {
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
             };
             a.q = view(in[0], qb, a.qs);
             a.k = view(in[1], kb, a.ks);
             a.v = view(in[2], vb, a.vs);
             a.out = out.data<float>();
             a.B = in[0].shape(0);
             a.H = in[0].shape(1);
             a.Lq = in[0].shape(2);
             a.D = in[0].shape(3);
             a.KVH = in[1].shape(1);
             a.Lk = kv_len >= 0 ? kv_len : in[1].shape(2);
             a.Dv = in[2].shape(3);
             a.scale = scale;
             a.causal = causal;
             a.mask_kind = mask_kind;
             if (merged) {  // out[b, i, h, :]
               a.os[0] = static_cast<int64_t>(a.Lq) * a.H * a.Dv;
               a.os[1] = a.Dv;
               a.os[2] = static_cast<int64_t>(a.H) * a.Dv;
             } else {  // out[b, h, i, :]
               a.os[0] = static_cast<int64_t>(a.H) * a.Lq * a.Dv;
               a.os[1] = static_cast<int64_t>(a.Lq) * a.Dv;
               a.os[2] = a.Dv;
             }
             if (mask_kind != 0) {
               const array& m = in[3];
               for (int d = 0; d < 4; ++d) a.ms[d] = m.strides()[d];
               a.mask = mask_kind == 1 ? static_cast<const void*>(m.data<uint8_t>())
                                       : static_cast<const void*>(m.data<float>());
             }
             kern::table().attention(a);
           });
  }

 private:
  float scale_;
  bool causal_;
  int mask_kind_;
  bool merged_;
  int kv_len_;
};

// One attention step over a layer's KV cache: inputs q [B, H, L, D], k [B,
// KVH, L, D], v [B, KVH, L, Dv] (not yet rotated), the cache buffers kc [B,
// KVH, C, D] and vc [B, KVH, C, Dv] [, rope wavelengths]; outputs the
// attention with heads merged, [B, L, H * Dv], and the buffers with this
// step's rotated keys and values written at positions slot..slot+L. The
// queries attend over positions [0, visible) of the buffers (causal: query i
// sees up to visible - L + i). What would be two rope nodes, two slice
// updates, two slices and an attention node (and the merge) in MLX's graph.
struct CacheStep {
  int offset;   // position of the first query (RoPE)
  int slot;     // first buffer position written
  int visible;  // buffer positions attended over
  bool causal;
  float scale;
  bool operator==(const CacheStep&) const = default;
};

class CachedAttention : public mx::Primitive {
 public:
  CachedAttention(mx::Stream s, RopeConfig rope, CacheStep step) : mx::Primitive(s), rope_(rope), step_(step) {}
  const char* name() const override { return "MlxcelCachedAttention"; }
  bool is_equivalent(const mx::Primitive& o) const override {
    auto& c = static_cast<const CachedAttention&>(o);
    return rope_ == c.rope_ && step_ == c.step_;
  }
  void eval_gpu(const std::vector<array>&, std::vector<array>&) override {
    throw std::runtime_error("MlxcelCachedAttention has no GPU version (on the GPU mlxcel uses MLX's own ops)");
  }
  std::vector<mx::Shape> output_shapes(const std::vector<array>& in) override { return shapes(in); }
  static std::vector<mx::Shape> shapes(const std::vector<array>& in) {
    const array &q = in[0], &v = in[2];
    return {{q.shape(0), q.shape(2), q.shape(1) * v.shape(3)}, in[3].shape(), in[4].shape()};
  }

  void eval_cpu(const std::vector<array>& inputs, std::vector<array>& outputs) override {
    // Every output of a multi-output node holds its own copy of the inputs
    // (array::make_arrays), so each cache buffer has one reference per output
    // here and is never donatable. MLX drops the siblings' copies right after
    // this call (array::detach, unless the node is traced); dropping them now
    // lets a buffer nothing else holds be written in place.
    if (!outputs[0].is_tracer()) {
      for (auto& out : outputs)
        if (&out.inputs() != &inputs) out.inputs().clear();
    }
    // The buffers are written in place when this node holds their only
    // reference (as MLX's SliceUpdate does); otherwise the task copies them.
    bool donated[2];
    for (int c = 0; c < 2; ++c) {
      const array& buf = inputs[3 + c];
      array& out = outputs[1 + c];
      donated[c] = buf.is_donatable() && buf.flags().row_contiguous && buf.data_size() == buf.size();
      if (donated[c]) {
        out.copy_shared_buffer(buf);
      } else {
        out.set_data(mx::allocator::malloc(out.nbytes()));
      }
    }
    outputs[0].set_data(mx::allocator::malloc(outputs[0].nbytes()));
    dispatch_multi(*this, inputs, outputs,
                   [rope = rope_, step = step_, keep_k = donated[0], keep_v = donated[1]](
                       std::vector<array>& ins, std::vector<array>& outs) { run(rope, step, keep_k, keep_v, ins, outs); });
  }

 private:
  // Copies `n` positions of `src` [B, KVH, n, W] (row-major) into positions
  // at.. of the contiguous buffer `dst` [B, KVH, C, W].
  static void write_positions(const float* src, float* dst, int groups, int n, int W, int C, int at) {
    for (int g = 0; g < groups; ++g)
      std::memcpy(dst + (static_cast<int64_t>(g) * C + at) * W, src + static_cast<int64_t>(g) * n * W,
                  static_cast<size_t>(n) * W * sizeof(float));
  }

  static void run(const RopeConfig& rope, const CacheStep& step, bool keep_k, bool keep_v, std::vector<array>& in,
                  std::vector<array>& out) {
    const array &q = in[0], &k = in[1], &v = in[2];
    const int B = q.shape(0), H = q.shape(1), L = q.shape(2), D = q.shape(3);
    const int KVH = k.shape(1), Dv = v.shape(3), C = in[3].shape(2);
    float* kc = out[1].data<float>();
    float* vc = out[2].data<float>();
    std::vector<float> tmp;
    if (!keep_k) std::memcpy(kc, row_major(in[3], tmp), out[1].nbytes());
    if (!keep_v) std::memcpy(vc, row_major(in[4], tmp), out[2].nbytes());
    const array* freqs = rope.has_freqs ? &in[5] : nullptr;
    // Rotated keys and queries, contiguous, in one scratch buffer.
    float* kr = kern::scratch(kern::kScratchStep, k.size() + q.size());
    float* qr = kr + k.size();
    rope_into(rope, freqs, k, step.offset, kr);
    write_positions(kr, kc, B * KVH, L, D, C, step.slot);
    write_positions(row_major(v, tmp), vc, B * KVH, L, Dv, C, step.slot);
    rope_into(rope, freqs, q, step.offset, qr);
    if (out[0].size() == 0) return;
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
    a.out = out[0].data<float>();
    // out[b, i, h, :], heads merged.
    a.os[0] = static_cast<int64_t>(L) * H * Dv;
    a.os[1] = Dv;
    a.os[2] = static_cast<int64_t>(H) * Dv;
    a.B = B;
    a.H = H;
    a.KVH = KVH;
    a.Lq = L;
    a.Lk = step.visible;
    a.D = D;
    a.Dv = Dv;
    a.scale = step.scale;
    a.causal = step.causal;
    a.mask_kind = 0;
    kern::table().attention(a);
  }

  RopeConfig rope_;
  CacheStep step_;
};

// ---------------------------------------------------------------------------
// Gated activations.

class GatedActivation : public KernelPrimitive {
 public:
  GatedActivation(mx::Stream s, int kind) : KernelPrimitive(s), kind_(kind) {}
  const char* name() const override { return kind_ == 0 ? "MlxcelSiluMul" : "MlxcelGeluTanhMul"; }
  bool is_equivalent(const mx::Primitive& o) const override {
    return kind_ == static_cast<const GatedActivation&>(o).kind_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<array>& in) override { return {in[0].shape()}; }
  void eval_cpu(const std::vector<array>& inputs, array& out) override {
    launch(*this, inputs, out, [kind = kind_](std::vector<array>& in, array& out) {
      if (out.size() == 0) return;
      std::vector<float> ab, bb;
      kern::GateArgs g{};
      g.a = rows_of(in[0], ab, g.lda);
      g.b = rows_of(in[1], bb, g.ldb);
      g.out = out.data<float>();
      g.cols = in[0].shape(-1);
      g.rows = static_cast<int>(out.size() / g.cols);
      g.kind = kind;
      kern::table().gate(g);
    });
  }

 private:
  int kind_;
};

// ---------------------------------------------------------------------------
// Choosing between our kernels and MLX's ops.


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

// Why our quantized kernels cannot take these inputs ("" when they can).
std::string quant_unsupported(const array& w, const array& scales, const std::optional<array>& biases, int gs,
                              int bits) {
  if (bits < 2 || bits > 8 || bits == 7)
    return "codes must be 2, 3, 4, 5, 6 or 8 bits wide, not " + std::to_string(bits);
  if (gs != 32 && gs != 64 && gs != 128) return "group size must be 32, 64 or 128, not " + std::to_string(gs);
  if (w.dtype() != mx::uint32) return "packed weights must be uint32, not " + dtype_str(w.dtype());
  if (w.ndim() != 2) return "packed weights must be 2-D, not " + shape_str(w.shape());
  if (!biases) return "affine quantization needs biases";
  auto sd = scales.dtype();
  if ((sd != mx::float32 && sd != mx::float16 && sd != mx::bfloat16) || biases->dtype() != sd)
    return "scales and biases must both be float32, float16 or bfloat16, not " + dtype_str(scales.dtype()) + "/" +
           dtype_str(biases->dtype());
  const int K = w.shape(1) * 32 / bits;
  const mx::Shape want{w.shape(0), K / gs};
  if (scales.shape() != want || biases->shape() != want)
    return "scales and biases must be " + shape_str(want) + " for weights " + shape_str(w.shape()) + ", not " +
           shape_str(scales.shape()) + "/" + shape_str(biases->shape());
  if (K % gs != 0) return "input features " + std::to_string(K) + " are not a multiple of the group size";
  return "";
}

// (buffer, n) when `t` is a not yet computed Slice of the first n positions
// (axis 2) of a 4-D buffer, all of its other axes whole.
std::optional<std::pair<array, int>> prefix_slice(const array& t) {
  if (!pending_node(t, "Slice") || t.ndim() != 4 || t.inputs().size() != 1) return std::nullopt;
  const auto& [start, stop, strides] = static_cast<const mx::Slice&>(t.primitive()).state();
  const array& buf = t.inputs()[0];
  if (buf.ndim() != 4 || buf.dtype() != mx::float32) return std::nullopt;
  for (int d = 0; d < 4; ++d) {
    if (start[d] != 0 || strides[d] != 1) return std::nullopt;
    if (d != 2 && stop[d] != buf.shape(d)) return std::nullopt;
  }
  return std::make_pair(buf, static_cast<int>(stop[2]));
}

// Why our rope cannot rotate `x` with these parameters ("" when it can).
std::string rope_unsupported(const array& x, int dims, float base, int offset, const std::optional<array>& freqs) {
  if (x.dtype() != mx::float32) return "input must be float32, not " + dtype_str(x.dtype());
  if (x.ndim() < 3) return "input must have at least 3 dimensions, not " + shape_str(x.shape());
  if (dims <= 0 || dims % 2 != 0 || dims > x.shape(-1))
    return "dims must be even, positive and at most " + std::to_string(x.shape(-1)) + ", not " + std::to_string(dims);
  if (offset < 0 || static_cast<int64_t>(offset) + x.shape(-2) > (1 << 24))
    return "positions must lie in [0, 2^24), offset is " + std::to_string(offset);
  if (freqs && (freqs->dtype() != mx::float32 || freqs->ndim() != 1 || freqs->shape(0) != dims / 2))
    return "freqs must be float32 [" + std::to_string(dims / 2) + "], not " + dtype_str(freqs->dtype()) + " " +
           shape_str(freqs->shape());
  if (!freqs && !(base > 0.0f)) return "base must be positive";
  return "";
}

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

}  // namespace

mx::array quantized_linear(const mx::array& x, const mx::array& w, const mx::array& scales,
                           const std::optional<mx::array>& biases, int group_size, int bits, Path path) {
  // One product: the multi-product node with one plain output.
  return quantized_linear_multi(x, {{w, scales, biases}}, {0}, group_size, bits, path)[0];
}

namespace {

// Why several weights cannot go through one fused product ("" when they can).
std::string multi_unsupported(const mx::array& x, const std::vector<QuantizedWeight>& ws, int gs, int bits) {
  if (ws.empty() || ws.size() > 8) return "between 1 and 8 weights are fused, not " + std::to_string(ws.size());
  if (x.dtype() != mx::float32) return "activations must be float32, not " + dtype_str(x.dtype());
  if (x.ndim() < 1) return "activations must have at least one dimension";
  for (const auto& w : ws) {
    if (auto why = quant_unsupported(w.w, w.scales, w.biases, gs, bits); !why.empty()) return why;
    if (w.w.shape(1) * 32 / bits != x.shape(-1))
      return "activations have " + std::to_string(x.shape(-1)) + " features, a weight " +
             std::to_string(w.w.shape(1) * 32 / bits);
  }
  return "";
}

// When `x` is the not yet computed output of our RMS norm, its input (and
// weight) and the norm's parameters: the product then normalises x itself.
struct FusedInput {
  array x;
  NormSpec norm;
  std::optional<array> weight;
};

FusedInput absorb_norm(const mx::array& x) {
  if (pending_node(x, "MlxcelRmsNorm")) {
    const auto& p = static_cast<const RmsNorm&>(x.primitive());
    NormSpec norm{p.has_weight() ? 2 : 1, p.eps()};
    std::optional<array> w;
    if (p.has_weight()) w = x.inputs()[1];
    return {x.inputs()[0], norm, w};
  }
  return {x, NormSpec{}, std::nullopt};
}

std::vector<array> multi_inputs(const FusedInput& fx, const std::vector<QuantizedWeight>& ws) {
  std::vector<array> inputs{fx.x};
  if (fx.weight) inputs.push_back(*fx.weight);
  for (const auto& w : ws) {
    inputs.push_back(w.w);
    inputs.push_back(w.scales);
    inputs.push_back(*w.biases);
  }
  return inputs;
}

}  // namespace

std::vector<mx::array> quantized_linear_multi(const mx::array& x, const std::vector<QuantizedWeight>& ws,
                                              const std::vector<int>& heads, int group_size, int bits, Path path) {
  if (heads.size() != ws.size()) throw std::invalid_argument("quantized_linear_multi: one head count per weight");
  for (size_t i = 0; i < ws.size(); ++i) {
    if (heads[i] < 0) throw std::invalid_argument("quantized_linear_multi: negative head count");
    if (heads[i] > 0 && (x.ndim() != 3 || ws[i].w.ndim() != 2 || ws[i].w.shape(0) % heads[i] != 0))
      throw std::invalid_argument("quantized_linear_multi: heads need x [batch, seq, features] and outputs " +
                                  std::string("divisible by the head count"));
  }
  auto s = mx::default_stream(mx::default_device());
  const bool on_cpu = s.device == mx::Device::cpu;
  auto mlx_op = [&] {
    std::vector<array> outs;
    for (size_t i = 0; i < ws.size(); ++i) {
      auto y = mx::quantized_matmul(x, ws[i].w, ws[i].scales, ws[i].biases, true, group_size, bits, "affine");
      if (heads[i] > 0) {
        y = mx::reshape(y, {x.shape(0), x.shape(1), heads[i], y.shape(-1) / heads[i]});
        y = mx::transpose(y, {0, 2, 1, 3});
      }
      outs.push_back(y);
    }
    return outs;
  };
  std::string why = on_cpu ? multi_unsupported(x, ws, group_size, bits) : "the default device is not the CPU";
  if (!use_kernel(path, "quantized_linear_multi", why)) return mlx_op();
  auto fx = absorb_norm(x);
  auto inputs = multi_inputs(fx, ws);
  auto shapes = QuantizedLinearMulti::shapes(inputs, heads, fx.norm);
  std::vector<mx::Dtype> dtypes(ws.size(), mx::float32);
  return array::make_arrays(std::move(shapes), dtypes,
                            std::make_shared<QuantizedLinearMulti>(s, group_size, bits, heads, fx.norm), inputs);
}

mx::array add(const mx::array& a, const mx::array& b, Path path) {
  // `a + b` where one side is the not yet computed output of a plain
  // quantized product (`h + o_proj(..)`) or RMS norm (`h + post_norm(..)`) of
  // ours and the other has its shape: one node of the same kind that adds the
  // residual as it writes (the original node is then never evaluated unless
  // something else reads it).
  // A product on either side is preferred to a norm.
  if (path != Path::Mlx && mx::default_device() == mx::Device::cpu) {
    for (const bool product : {true, false}) {
      for (const auto& [p, r] : {std::pair{&a, &b}, std::pair{&b, &a}}) {
        if (!pending_node(*p, product ? "MlxcelQuantizedLinear" : "MlxcelRmsNorm") || r->dtype() != mx::float32 ||
            r->shape() != p->shape())
          continue;
        std::shared_ptr<mx::Primitive> prim;
        if (product) {
          const auto& q = static_cast<const QuantizedLinearMulti&>(p->primitive());
          prim = std::make_shared<QuantizedLinearMulti>(p->primitive().stream(), q.group_size(), q.bits(), q.heads(),
                                                        q.norm(), true);
        } else {
          const auto& n = static_cast<const RmsNorm&>(p->primitive());
          prim = std::make_shared<RmsNorm>(p->primitive().stream(), n.eps(), n.has_weight(), true);
        }
        std::vector<array> inputs = p->inputs();
        inputs.push_back(*r);
        return array(p->shape(), mx::float32, std::move(prim), std::move(inputs));
      }
    }
  }
  return mx::add(a, b);
}

mx::array quantized_gated_linear(int kind, const mx::array& x, const QuantizedWeight& gate, const QuantizedWeight& up,
                                 int group_size, int bits, Path path) {
  if (kind != 0 && kind != 1) throw std::invalid_argument("quantized_gated_linear: unknown activation");
  auto s = mx::default_stream(mx::default_device());
  const bool on_cpu = s.device == mx::Device::cpu;
  auto mlx_op = [&] {
    auto g = mx::quantized_matmul(x, gate.w, gate.scales, gate.biases, true, group_size, bits, "affine");
    auto u = mx::quantized_matmul(x, up.w, up.scales, up.biases, true, group_size, bits, "affine");
    return gated_activation(kind, g, u, Path::Mlx);
  };
  std::string why = on_cpu ? multi_unsupported(x, {gate, up}, group_size, bits) : "the default device is not the CPU";
  if (why.empty() && gate.w.shape(0) != up.w.shape(0)) why = "gate and up projections have different widths";
  if (!use_kernel(path, "quantized_gated_linear", why)) return mlx_op();
  auto fx = absorb_norm(x);
  auto shape = x.shape();
  shape.back() = gate.w.shape(0);
  return array(std::move(shape), mx::float32,
               std::make_shared<QuantizedGatedLinear>(s, group_size, bits, kind, fx.norm), multi_inputs(fx, {gate, up}));
}

mx::array quantized_gather(const mx::array& ids, const mx::array& w, const mx::array& scales,
                           const std::optional<mx::array>& biases, int group_size, int bits, float scale,
                           Path path) {
  auto s = mx::default_stream(mx::default_device());
  const bool on_cpu = s.device == mx::Device::cpu;
  auto mlx_op = [&] {
    std::optional<array> b;
    if (biases) b = mx::take(*biases, ids, 0);
    auto rows = mx::dequantize(mx::take(w, ids, 0), mx::take(scales, ids, 0), b, group_size, bits, "affine");
    return scale == 1.0f ? rows : mx::multiply(rows, array(scale, rows.dtype()));
  };
  std::string why;
  if (!on_cpu) {
    why = "the default device is not the CPU";
  } else if (!mx::issubdtype(ids.dtype(), mx::integer)) {
    why = "ids must be integers, not " + dtype_str(ids.dtype());
  } else {
    why = quant_unsupported(w, scales, biases, group_size, bits);
  }
  if (!use_kernel(path, "quantized_gather", why)) return mlx_op();
  auto shape = ids.shape();
  shape.push_back(w.shape(1) * 32 / bits);
  return array(std::move(shape), mx::float32, std::make_shared<QuantizedGather>(s, group_size, bits, scale),
               {ids, w, scales, *biases});
}

mx::array rms_norm(const mx::array& x, const std::optional<mx::array>& weight, float eps, Path path) {
  auto s = mx::default_stream(mx::default_device());
  const bool on_cpu = s.device == mx::Device::cpu;
  auto mlx_op = [&] { return mx::fast::rms_norm(x, weight, eps); };
  std::string why;
  if (!on_cpu) {
    why = "the default device is not the CPU";
  } else if (x.dtype() != mx::float32) {
    why = "input must be float32, not " + dtype_str(x.dtype());
  } else if (x.ndim() < 1) {
    why = "input must have at least one dimension";
  } else if (weight && weight->dtype() != mx::float32) {
    why = "weight must be float32, not " + dtype_str(weight->dtype());
  } else if (weight && (weight->ndim() != 1 || weight->shape(0) != x.shape(-1))) {
    why = "weight must be [" + std::to_string(x.shape(-1)) + "], not " + shape_str(weight->shape());
  }
  if (!use_kernel(path, "rms_norm", why)) return mlx_op();
  std::vector<array> inputs{x};
  if (weight) inputs.push_back(*weight);
  return array(x.shape(), mx::float32, std::make_shared<RmsNorm>(s, eps, weight.has_value()), std::move(inputs));
}

mx::array rope(const mx::array& x, int dims, bool traditional, float base, float scale, int offset,
               const std::optional<mx::array>& freqs, Path path) {
  auto s = mx::default_stream(mx::default_device());
  auto mlx_op = [&] {
    std::optional<float> b = freqs ? std::nullopt : std::optional<float>(base);
    return mx::fast::rope(x, dims, traditional, b, scale, offset, freqs);
  };
  std::string why = s.device == mx::Device::cpu ? rope_unsupported(x, dims, base, offset, freqs)
                                                : "the default device is not the CPU";
  if (!use_kernel(path, "rope", why)) return mlx_op();
  std::vector<array> inputs{x};
  if (freqs) inputs.push_back(*freqs);
  return array(x.shape(), mx::float32,
               std::make_shared<Rope>(s, RopeConfig{dims, traditional, base, scale, freqs.has_value()}, offset),
               std::move(inputs));
}

mx::array sdpa(const mx::array& q, const mx::array& k, const mx::array& v, float scale, const std::string& mask_mode,
               const std::optional<mx::array>& mask, Path path) {
  auto s = mx::default_stream(mx::default_device());
  const bool on_cpu = s.device == mx::Device::cpu;
  auto mlx_op = [&] { return mx::fast::scaled_dot_product_attention(q, k, v, scale, mask_mode, mask); };
  std::string why;
  int mask_kind = 0;
  if (!on_cpu) {
    why = "the default device is not the CPU";
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
  } else if (mask_mode == "causal") {
    if (mask) why = "a causal mask takes no mask array";
  } else if (mask_mode == "array") {
    if (!mask) {
      why = "mask mode 'array' needs a mask";
    } else if (mask->dtype() == mx::bool_) {
      mask_kind = 1;
    } else if (mask->dtype() == mx::float32) {
      mask_kind = 2;
    } else {
      why = "masks must be bool or float32, not " + dtype_str(mask->dtype());
    }
    if (why.empty() && mask->ndim() > 4) why = "masks have at most 4 dimensions";
  } else if (!mask_mode.empty()) {
    why = "unknown mask mode '" + mask_mode + "'";
  }
  if (!use_kernel(path, "scaled_dot_product_attention", why)) return mlx_op();
  // Keys and values that are the first positions of cache buffers (the
  // Slice nodes a cache builds): attend over the buffers directly.
  int kv_len = -1;
  array kk = k, vv = v;
  auto kb = prefix_slice(k), vb = prefix_slice(v);
  if (kb && vb && kb->second == vb->second) {
    kk = kb->first;
    vv = vb->first;
    kv_len = kb->second;
  }
  std::vector<array> inputs{q, kk, vv};
  if (mask_kind != 0) inputs.push_back(mx::broadcast_to(*mask, {q.shape(0), q.shape(1), q.shape(2), k.shape(2)}));
  auto shape = Attention::shape(inputs, false);
  return array(std::move(shape), mx::float32,
               std::make_shared<Attention>(s, scale, mask_mode == "causal", mask_kind, false, kv_len),
               std::move(inputs));
}

std::vector<mx::array> cached_attention(const mx::array& q, const mx::array& k, const mx::array& v,
                                        const RopeSpec& rope, int offset, const CacheSlot& cache, float scale,
                                        Path path) {
  const auto &kc = cache.keys, &vc = cache.values;
  // Shapes are checked on every path: a mismatch is a caller's bug, not a
  // case for MLX's ops.
  auto fail = [](const std::string& why) { throw std::invalid_argument("cached_attention: " + why); };
  if (q.ndim() != 4 || k.ndim() != 4 || v.ndim() != 4 || kc.ndim() != 4 || vc.ndim() != 4)
    fail("q, k, v and the cache buffers must be [batch, heads, positions, dim]");
  const int B = q.shape(0), H = q.shape(1), L = q.shape(2), D = q.shape(3), KVH = k.shape(1), Dv = v.shape(3);
  if (k.shape() != mx::Shape{B, KVH, L, D} || v.shape(0) != B || v.shape(1) != KVH || v.shape(2) != L)
    fail("queries " + shape_str(q.shape()) + ", keys " + shape_str(k.shape()) + " and values " +
         shape_str(v.shape()) + " do not match");
  if (KVH == 0 || H % KVH != 0) fail("query heads must be a multiple of key/value heads");
  const int C = kc.shape(2);
  if (kc.shape() != mx::Shape{B, KVH, C, D} || vc.shape() != mx::Shape{B, KVH, C, Dv})
    fail("cache buffers " + shape_str(kc.shape()) + "/" + shape_str(vc.shape()) + " do not hold keys " +
         shape_str(k.shape()) + " and values " + shape_str(v.shape()));
  if (cache.slot < 0 || cache.slot + L > C)
    fail("positions " + std::to_string(cache.slot) + ".." + std::to_string(cache.slot + L) +
         " do not fit a buffer of " + std::to_string(C));
  if (cache.visible < 1 || cache.visible > C)
    fail(std::to_string(cache.visible) + " visible positions in a buffer of " + std::to_string(C));
  if (cache.causal && cache.slot + L != cache.visible)
    fail("a causal step must write the last of the visible positions");

  auto s = mx::default_stream(mx::default_device());
  auto unfused = [&](Path parts) {
    auto qr = fast::rope(q, rope.dims, rope.traditional, rope.base, rope.scale, offset, rope.freqs, parts);
    auto kr = fast::rope(k, rope.dims, rope.traditional, rope.base, rope.scale, offset, rope.freqs, parts);
    const int end = cache.slot + L;
    const mx::Shape at{0, 0, cache.slot, 0}, origin{0, 0, 0, 0};
    auto kc2 = mx::slice_update(kc, kr, at, mx::Shape{B, KVH, end, D});
    auto vc2 = mx::slice_update(vc, v, at, mx::Shape{B, KVH, end, Dv});
    auto ks = mx::slice(kc2, origin, mx::Shape{B, KVH, cache.visible, D});
    auto vs = mx::slice(vc2, origin, mx::Shape{B, KVH, cache.visible, Dv});
    auto o = sdpa(qr, ks, vs, scale, cache.causal ? "causal" : "", std::nullopt, parts);
    return std::vector<array>{merge_heads(o, parts), kc2, vc2};
  };
  std::string why;
  if (s.device != mx::Device::cpu) {
    why = "the default device is not the CPU";
  } else if (q.dtype() != mx::float32 || k.dtype() != mx::float32 || v.dtype() != mx::float32 ||
             kc.dtype() != mx::float32 || vc.dtype() != mx::float32) {
    why = "q, k, v and the cache buffers must be float32";
  } else {
    why = rope_unsupported(q, rope.dims, rope.base, offset, rope.freqs);
  }
  if (!use_kernel(path, "cached_attention", why)) return unfused(path);
  std::vector<array> inputs{q, k, v, kc, vc};
  if (rope.freqs) inputs.push_back(*rope.freqs);
  auto shapes = CachedAttention::shapes(inputs);
  RopeConfig rc{rope.dims, rope.traditional, rope.base, rope.scale, rope.freqs.has_value()};
  CacheStep step{offset, cache.slot, cache.visible, cache.causal, scale};
  return array::make_arrays(std::move(shapes), {mx::float32, mx::float32, mx::float32},
                            std::make_shared<CachedAttention>(s, rc, step), std::move(inputs));
}

mx::array merge_heads(const mx::array& x, Path path) {
  if (x.ndim() != 4) throw std::invalid_argument("merge_heads: expected [batch, heads, seq, dim], not " + shape_str(x.shape()));
  if (path != Path::Mlx && pending_node(x, "MlxcelAttention")) {
    const auto& p = static_cast<const Attention&>(x.primitive());
    if (!p.merged()) {
      const auto& in = x.inputs();
      return array(Attention::shape(in, true), mx::float32,
                   std::make_shared<Attention>(x.primitive().stream(), p.scale(), p.causal(), p.mask_kind(), true,
                                               p.kv_len()),
                   in);
    }
  }
  if (path == Path::Kernel) refuse("merge_heads", "the input is not an attention node of mlxcel's kernel");
  return mx::reshape(mx::transpose(x, {0, 2, 1, 3}), {x.shape(0), x.shape(2), x.shape(1) * x.shape(3)});
}

mx::array gated_activation(int kind, const mx::array& a, const mx::array& b, Path path) {
  auto s = mx::default_stream(mx::default_device());
  const bool on_cpu = s.device == mx::Device::cpu;
  auto mlx_op = [&] {
    if (kind == 0) return mx::multiply(mx::multiply(a, mx::sigmoid(a)), b);
    // (x/2)(1 + tanh(sqrt(2/pi) (x + 0.044715 x³))), as mlxcel's Array::gelu_approx.
    auto scalar = [&](float v) { return mx::full({}, mx::array(v, mx::float32), a.dtype()); };
    auto cube = mx::multiply(mx::square(a), a);
    auto inner = mx::multiply(mx::add(a, mx::multiply(cube, scalar(0.044715f))),
                              scalar(std::sqrt(2.0f / static_cast<float>(M_PI))));
    auto act = mx::multiply(mx::multiply(a, scalar(0.5f)), mx::add(mx::tanh(inner), scalar(1.0f)));
    return mx::multiply(act, b);
  };
  if (kind != 0 && kind != 1) throw std::invalid_argument("gated_activation: unknown activation");
  std::string why;
  if (!on_cpu) {
    why = "the default device is not the CPU";
  } else if (a.dtype() != mx::float32 || b.dtype() != mx::float32) {
    why = "inputs must be float32";
  } else if (a.shape() != b.shape()) {
    why = "inputs must have the same shape, not " + shape_str(a.shape()) + " and " + shape_str(b.shape());
  } else if (a.ndim() < 1) {
    why = "inputs must have at least one dimension";
  }
  if (!use_kernel(path, kind == 0 ? "silu_mul" : "gelu_approx_mul", why)) return mlx_op();
  return array(a.shape(), mx::float32, std::make_shared<GatedActivation>(s, kind), {a, b});
}

std::vector<std::string> pending_ops(const std::vector<mx::array>& outputs) {
  std::vector<std::string> names;
  std::unordered_set<std::uintptr_t> seen;
  std::vector<array> stack(outputs.begin(), outputs.end());
  while (!stack.empty()) {
    array a = stack.back();
    stack.pop_back();
    if (a.status() != array::Status::unscheduled || !a.has_primitive()) continue;
    if (!seen.insert(a.primitive_id()).second) continue;  // siblings share one primitive
    names.emplace_back(a.primitive().name());
    for (const auto& in : a.inputs()) stack.push_back(in);
  }
  return names;
}

bool eval_inline(const std::vector<mx::array>& outputs) {
  // The pending nodes in dependency order (a post-order walk). The walk keeps
  // one array per node and none of their inputs, so that when a node runs,
  // its inputs are held only by the graph, as under MLX's own eval (the cache
  // buffers of MlxcelCachedAttention must stay donatable).
  std::vector<array> order;
  std::unordered_set<std::uintptr_t> seen;
  std::vector<std::pair<array, bool>> stack;
  for (const auto& o : outputs) stack.emplace_back(o, false);
  while (!stack.empty()) {
    auto [a, expanded] = std::move(stack.back());
    stack.pop_back();
    if (a.status() != array::Status::unscheduled) {
      // Computed earlier, or still being computed by the stream: MLX waits.
      if (!a.is_available()) return false;
      continue;
    }
    if (!a.has_primitive() || a.is_tracer()) return false;
    if (expanded) {
      order.push_back(std::move(a));
      continue;
    }
    if (!seen.insert(a.primitive_id()).second) continue;  // siblings share one node
    mx::Primitive& p = a.primitive();
    if (p.stream().device != mx::Device::cpu || std::strncmp(p.name(), "Mlxcel", 6) != 0) return false;
    auto inputs = a.inputs();
    stack.emplace_back(std::move(a), true);
    for (auto& in : inputs) stack.emplace_back(std::move(in), false);
  }
  t_inline = true;
  try {
    for (auto& a : order) {
      array node = std::move(a);
      auto outs = node.outputs();
      node.primitive().eval_cpu(node.inputs(), outs);
      for (auto& o : outs) o.set_status(array::Status::available);
      // What MLX's eval does after a node: drop its inputs (freeing what no
      // later node needs) and its primitive.
      node.detach();
    }
  } catch (...) {
    t_inline = false;
    throw;
  }
  t_inline = false;
  return true;
}

}  // namespace mlxcel::fast
