// The product nodes (products.h): each reads its inputs in the forms
// launch.h gives and runs one of kern::table()'s product kernels (quantized
// or float weights).
#include "mlxcel-mlx/cpp/nodes/products.h"

#include <cstring>

#include "mlxcel-mlx/cpp/nodes/gpu.h"
#include "mlxcel-mlx/cpp/nodes/launch.h"

namespace mlxcel::fast {
namespace {

// Runs the products of `in` (inputs as ProductSpec lays them out) into
// `dst[i]` (plain [M, N_i] layout each); returns the row count M.
int run_products(std::vector<array>& in, const std::optional<RmsNormParams>& prologue, QuantSpec quant,
                 bool row_invariant, const std::vector<float*>& dst) {
  const array& x = in[0];
  const bool norm_weight = prologue && prologue->weight;
  const int first = first_weight_input(prologue);
  const int K = x.shape(-1);
  const int M = K == 0 ? 0 : static_cast<int>(x.size() / K);
  const int n = static_cast<int>(dst.size());
  std::vector<float> xb, xn, wnb;
  std::vector<ScaleData> sb(n), bb(n), wd(n);
  std::vector<std::vector<uint32_t>> wb(n);
  std::vector<kern::QmmArgs> args(n);
  int64_t ldx = K;
  const float* xp = K == 0 ? nullptr : rows_of(x, xb, ldx);
  if (prologue && M > 0 && K > 0) {
    // The same kernel, rows and eps as the RmsNorm node this replaces.
    xn.resize(static_cast<size_t>(M) * K);
    const float* wn = norm_weight ? row_major(in[1], wnb) : nullptr;
    kern::table().rms_norm(xp, ldx, wn, xn.data(), M, K, prologue->eps);
    xp = xn.data();
    ldx = K;
  }
  for (int i = 0; i < n; ++i) {
    auto& a = args[i];
    const int wi = first + quant.inputs_per_weight() * i;
    a.x = xp;
    a.ldx = ldx;
    if (quant.dense()) {
      // f32, f16 or bf16, as ScaleData reads scales: WeightType is 1 + ScaleType.
      int type = 0;
      a.w = wd[i].read(in[wi], type);
      a.weight_type = kern::kWeightF32 + type;
    } else {
      a.w = row_major(in[wi], wb[i]);
      a.scales = sb[i].read(in[wi + 1], a.scale_type);
      a.biases = bb[i].read(in[wi + 2], a.scale_type);
      a.layout = quant.layout;
    }
    a.N = in[wi].shape(0);
    a.out = dst[i];
    a.ldo = a.N;
    a.M = M;
    a.K = K;
    a.group_size = quant.group_size;
    a.bits = quant.bits;
    a.row_invariant = row_invariant;
    if (K == 0) std::memset(dst[i], 0, static_cast<size_t>(M) * a.N * sizeof(float));
  }
  if (K > 0 && M > 0) kern::table().qmm_multi(args.data(), n);
  return M;
}

void run_product(const ProductSpec& spec, std::vector<array>& in, std::vector<array>& out) {
  const array& x = in[0];
  const int n = static_cast<int>(spec.heads.size());
  // With one position per sequence the head layout is the plain one.
  const int L = x.ndim() == 3 ? x.shape(1) : 1;
  std::vector<std::vector<float>> tmp(n);
  std::vector<float*> dst(n);
  for (int i = 0; i < n; ++i) {
    if (spec.heads[i] > 0 && L > 1) {
      tmp[i].resize(out[i].size());
      dst[i] = tmp[i].data();
    } else {
      dst[i] = out[i].data<float>();
    }
  }
  const int M = run_products(in, spec.prologue, spec.quant, spec.row_invariant, dst);
  if (spec.epilogue == Epilogue::AddResidual) {
    // out[0] is [M, N] (plain layout): add r row by row, one rounding per
    // element as MLX's add.
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
    const int B = x.shape(0), H = spec.heads[i], N = in[spec.weight_input(i)].shape(0), D = N / H;
    float* o = out[i].data<float>();
    for (int b = 0; b < B; ++b)
      for (int l = 0; l < L; ++l)
        for (int h = 0; h < H; ++h)
          std::memcpy(o + ((static_cast<int64_t>(b) * H + h) * L + l) * D,
                      tmp[i].data() + (static_cast<int64_t>(b) * L + l) * N + h * D, D * sizeof(float));
  }
}

// Quantized rows `idx` of the table in[1..3] into `out`.
void gather_quantized(std::vector<array>& in, const std::vector<int64_t>& idx, QuantSpec quant, float* out) {
  const int N = in[1].shape(0);
  std::vector<uint32_t> wb;
  ScaleData sb, bb;
  kern::GatherArgs a{};
  a.w = row_major(in[1], wb);
  a.scales = sb.read(in[2], a.scale_type);
  a.biases = bb.read(in[3], a.scale_type);
  a.ids = idx.data();
  a.out = out;
  a.n_ids = static_cast<int>(idx.size());
  a.K = in[1].shape(1) * 32 / quant.bits;
  a.group_size = quant.group_size;
  a.bits = quant.bits;
  a.layout = quant.layout;
  if (N > 0) kern::table().gather(a);
}
}  // namespace

const char* QuantizedProduct::name() const {
  const bool dense = spec_.quant.dense();
  if (spec_.epilogue == Epilogue::AddResidual) return dense ? "MlxcelLinearAdd" : "MlxcelQuantizedLinearAdd";
  if (spec_.single_plain()) return dense ? "MlxcelLinear" : "MlxcelQuantizedLinear";
  return dense ? "MlxcelLinearMulti" : "MlxcelQuantizedLinearMulti";
}

std::vector<mx::Shape> QuantizedProduct::shapes(const std::vector<array>& in, const ProductSpec& spec) {
  const array& x = in[0];
  std::vector<mx::Shape> out;
  for (size_t i = 0; i < spec.heads.size(); ++i) {
    const int N = in[spec.weight_input(static_cast<int>(i))].shape(0);
    const int h = spec.heads[i];
    if (h > 0) {
      out.push_back({x.shape(0), h, x.shape(1), N / h});
    } else {
      auto sh = x.shape();
      sh.back() = N;
      out.push_back(sh);
    }
  }
  return out;
}

void QuantizedProduct::eval_cpu(const std::vector<array>& inputs, std::vector<array>& outputs) {
  launch_multi(*this, inputs, outputs,
               [spec = spec_](std::vector<array>& in, std::vector<array>& out) { run_product(spec, in, out); });
}

void QuantizedProduct::eval_gpu(const std::vector<array>& inputs, std::vector<array>& outputs) {
  gpu::eval_product(stream(), spec_, inputs, outputs);
}

std::vector<mx::Shape> QuantizedGatedProduct::output_shapes(const std::vector<array>& in) {
  auto shape = in[0].shape();
  shape.back() = in[spec_.weight_input(0)].shape(0);
  return {shape};
}

void QuantizedGatedProduct::eval_cpu(const std::vector<array>& inputs, array& out) {
  launch(*this, inputs, out, [spec = spec_](std::vector<array>& in, array& out) {
    const int N = out.shape(-1);
    const size_t count = out.size();
    float* g = kern::scratch(kern::kScratchShared, 2 * count);
    float* u = g + count;
    const int M = run_products(in, spec.prologue, spec.quant, spec.row_invariant, {g, u});
    if (M == 0 || N == 0) return;
    kern::GateArgs ga{g, N, u, N, out.data<float>(), M, N, spec.act};
    kern::table().gate(ga);
  });
}

void QuantizedGatedProduct::eval_gpu(const std::vector<array>& inputs, array& out) {
  gpu::eval_gated(stream(), spec_, inputs, out);
}

std::vector<mx::Shape> QuantizedGather::output_shapes(const std::vector<array>& in) {
  auto shape = in[0].shape();
  shape.push_back(quant_.dense() ? in[1].shape(1) : in[1].shape(1) * 32 / quant_.bits);
  return {shape};
}

void QuantizedGather::eval_cpu(const std::vector<array>& inputs, array& out) {
  launch(*this, inputs, out, [quant = quant_, scale = scale_](std::vector<array>& in, array& out) {
    const array& ids = in[0];
    const int N = in[1].shape(0);
    std::vector<int64_t> idx(ids.size());
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
    if (quant.dense() && N > 0) {
      // Float rows: widened to f32 (exact), then the scale below.
      ScaleData tb;
      int type = 0;
      const void* t = tb.read(in[1], type);
      const int64_t K = in[1].shape(1);
      float* o = out.data<float>();
      for (size_t i = 0; i < idx.size(); ++i)
        for (int64_t k = 0; k < K; ++k) o[i * K + k] = kern::scale_at(t, idx[i] * K + k, type);
    } else if (!quant.dense()) {
      gather_quantized(in, idx, quant, out.data<float>());
    }
    // After dequantization, as `embedding(ids) * scale` rounds (Gemma).
    if (scale != 1.0f) {
      float* o = out.data<float>();
      for (size_t i = 0; i < out.size(); ++i) o[i] *= scale;
    }
  });
}

void QuantizedGather::eval_gpu(const std::vector<array>& inputs, array& out) {
  gpu::eval_gather(stream(), quant_, scale_, inputs, out);
}

const char* GatedActivation::name() const {
  return act_ == kern::Activation::Silu ? "MlxcelSiluMul" : "MlxcelGeluTanhMul";
}

void GatedActivation::eval_cpu(const std::vector<array>& inputs, array& out) {
  launch(*this, inputs, out, [act = act_](std::vector<array>& in, array& out) {
    if (out.size() == 0) return;
    std::vector<float> ab, bb;
    kern::GateArgs g{};
    g.a = rows_of(in[0], ab, g.lda);
    g.b = rows_of(in[1], bb, g.ldb);
    g.out = out.data<float>();
    g.cols = in[0].shape(-1);
    g.rows = static_cast<int>(out.size() / g.cols);
    g.kind = act;
    kern::table().gate(g);
  });
}

}  // namespace mlxcel::fast
