// Checks every kernel of one ISA build against f64 references (and, where the
// kernels promise MLX's exact rounding, against the scalar build bit for
// bit), on random inputs of odd sizes, single- and multi-threaded.
//
// The Rust tests (mlx-kernels/tests/kernels.rs) check each build this machine
// can run against MLX's own ops. This program covers builds it cannot run
// natively: `make test-arm64` cross-compiles it for AArch64 with the NEON
// build and runs it under qemu-user. It links only the kernels (no MLX).
//
//   isa_check [ISA]    # scalar, avx2, avx2i16, avx512, avx512vnni or neon; default: the best
//
// Exit status 0 when every check passes; each failure is printed.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "mlxcel-mlx/cpp/kernels/kernels.h"

using namespace mlxcel::kern;

namespace {

int g_failures = 0;
int g_checks = 0;
std::mt19937_64 g_rng(0x6d6c7863656cULL);

void fail(const std::string& what) {
  if (++g_failures <= 40) std::fprintf(stderr, "FAIL %s\n", what.c_str());
}

std::vector<float> normal(size_t n, float sd = 1.0f) {
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g_rng);
  return v;
}

std::vector<float> uniform(size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g_rng);
  return v;
}

uint16_t to_half(float f) {
  // Round-to-nearest-even f32 -> f16 for the values used here (normal range).
  uint32_t b;
  std::memcpy(&b, &f, 4);
  const uint32_t sign = (b >> 16) & 0x8000;
  int exp = static_cast<int>((b >> 23) & 0xff) - 127 + 15;
  uint32_t man = b & 0x7fffff;
  if (exp <= 0) return static_cast<uint16_t>(sign);
  uint32_t h = sign | (static_cast<uint32_t>(exp) << 10) | (man >> 13);
  const uint32_t rest = man & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;
  return static_cast<uint16_t>(h);
}

uint16_t to_bf16(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return static_cast<uint16_t>((b + 0x7fff + ((b >> 16) & 1)) >> 16);
}

// A random affine-quantized [N, K] matrix in MLX's layout, scales and biases
// stored as `type`.
struct QMatrix {
  int N, K, gs, bits, type;
  std::vector<uint32_t> w;
  std::vector<float> scales32, biases32;
  std::vector<uint16_t> scales16, biases16;
  const void* scales() const { return type == kScaleF32 ? static_cast<const void*>(scales32.data()) : scales16.data(); }
  const void* biases() const { return type == kScaleF32 ? static_cast<const void*>(biases32.data()) : biases16.data(); }
  int code(int n, int k) const {
    const uint8_t* row = reinterpret_cast<const uint8_t*>(w.data()) + static_cast<int64_t>(n) * K * bits / 8;
    const int64_t bit = static_cast<int64_t>(k) * bits;
    unsigned v = row[bit >> 3] >> (bit & 7);
    if ((bit & 7) + bits > 8) v |= static_cast<unsigned>(row[(bit >> 3) + 1]) << (8 - (bit & 7));
    return static_cast<int>(v & ((1u << bits) - 1));
  }
  double value(int n, int k) const {
    const int64_t g = static_cast<int64_t>(n) * (K / gs) + k / gs;
    return static_cast<double>(scale_at(scales(), g, type)) * code(n, k) + scale_at(biases(), g, type);
  }
};

QMatrix qmatrix(int N, int K, int gs, int bits, int type) {
  QMatrix q{N, K, gs, bits, type, {}, {}, {}, {}, {}};
  q.w.resize(static_cast<size_t>(N) * K * bits / 32);
  for (auto& x : q.w) x = static_cast<uint32_t>(g_rng());
  const size_t G = static_cast<size_t>(N) * (K / gs);
  q.scales32 = uniform(G, 0.01f, 0.1f);
  q.biases32 = uniform(G, -0.5f, 0.5f);
  if (type != kScaleF32) {
    for (size_t i = 0; i < G; ++i) {
      q.scales16.push_back(type == kScaleF16 ? to_half(q.scales32[i]) : to_bf16(q.scales32[i]));
      q.biases16.push_back(type == kScaleF16 ? to_half(q.biases32[i]) : to_bf16(q.biases32[i]));
    }
  }
  return q;
}

QmmArgs qmm_args(const QMatrix& q, const std::vector<float>& x, int M, std::vector<float>& out) {
  out.assign(static_cast<size_t>(M) * q.N, 0.0f);
  return QmmArgs{x.data(), q.K, q.w.data(), q.scales(), q.biases(), out.data(), q.N, M, q.N, q.K, q.gs, q.bits, q.type};
}

// out[m, n] against the f64 dot product: a sum of K terms in another order
// stays within 8·sqrt(K)·ε·Σ|terms| (docs/kernels.md, "Numerics"). With int16
// activations (avx512vnni, 4/8-bit) each x is also within half a step, 2^-16
// of the largest |x| of its block: 4 (4-bit) or 2 (8-bit) elements in the
// row-major matvec, the weights' group in the rows16 kernel (`block`).
void check_product(const char* isa, const std::string& what, const QMatrix& q, const std::vector<float>& x, int M,
                   const std::vector<float>& out, bool int16, int block = 0) {
  if (block == 0) block = q.bits == 4 ? 4 : 2;
  for (int m = 0; m < M; ++m) {
    for (int n = 0; n < q.N; ++n) {
      double ref = 0.0, mag = 0.0, steps = 0.0;
      for (int k = 0; k < q.K; ++k) {
        const double w = q.value(n, k), xv = x[static_cast<size_t>(m) * q.K + k];
        ref += w * xv;
        mag += std::fabs(w * xv);
        if (int16) {
          double amax = 0.0;
          const int b0 = k / block * block;
          for (int j = b0; j < b0 + block; ++j) amax = std::fmax(amax, std::fabs(x[static_cast<size_t>(m) * q.K + j]));
          const int64_t g = static_cast<int64_t>(n) * (q.K / q.gs) + k / q.gs;
          steps += std::fabs(w - scale_at(q.biases(), g, q.type)) * amax / 32767.0 / 2.0;
        }
      }
      const double bound = 8.0 * std::sqrt(q.K) * 1.1920929e-7 * mag + steps + 1e-30;
      const double got = out[static_cast<size_t>(m) * q.N + n];
      ++g_checks;
      if (!(std::fabs(got - ref) <= bound)) {
        char buf[256];
        std::snprintf(buf, sizeof buf, "%s %s m=%d n=%d: %.9g vs %.9g (bound %.3g)", isa, what.c_str(), m, n, got, ref,
                      bound);
        fail(buf);
        return;
      }
    }
  }
}

void check_qmm(const Table& t, bool int16_build) {
  const int bits_list[] = {2, 3, 4, 5, 6, 8};
  const int gs_list[] = {32, 64, 128};
  const int m_list[] = {1, 3, 8, 13};
  for (int bits : bits_list) {
    for (int gs : gs_list) {
      for (int type : {kScaleF32, kScaleF16, kScaleBF16}) {
        const int K = gs * (gs == 128 ? 2 : 3), N = 37;
        QMatrix q = qmatrix(N, K, gs, bits, type);
        for (int M : m_list) {
          std::vector<float> x = normal(static_cast<size_t>(M) * K), out;
          QmmArgs a = qmm_args(q, x, M, out);
          t.qmm(a);
          const bool int16 = int16_build && (bits == 4 || bits == 8) && M <= 8;
          check_product(t.name, "qmm bits=" + std::to_string(bits) + " gs=" + std::to_string(gs) + " scales=" +
                                    std::to_string(type) + " M=" + std::to_string(M),
                        q, x, M, out, int16);
        }
      }
    }
  }
  // Several products of one x in one pass (q, k, v of different widths).
  for (int M : {1, 5, 11}) {
    const int K = 256;
    QMatrix qs[3] = {qmatrix(48, K, 64, 4, kScaleF32), qmatrix(16, K, 64, 4, kScaleF32),
                     qmatrix(24, K, 64, 4, kScaleF32)};
    std::vector<float> x = normal(static_cast<size_t>(M) * K), outs[3];
    QmmArgs args[3];
    for (int i = 0; i < 3; ++i) args[i] = qmm_args(qs[i], x, M, outs[i]);
    t.qmm_multi(args, 3);
    for (int i = 0; i < 3; ++i)
      check_product(t.name, "qmm_multi M=" + std::to_string(M) + " output " + std::to_string(i), qs[i], x, M, outs[i],
                    int16_build && M <= 8);
  }
}

void check_exact(const char* isa, const std::string& what, const std::vector<float>& got,
                 const std::vector<float>& want);

// Batch invariance: with `row_invariant` (a decode batch) each row of x gets
// exactly the bits it gets alone, whatever M (docs/kernels.md "Batch
// invariance").
void check_row_invariance(const Table& t) {
  for (int bits : {2, 4, 5, 8}) {
    const int K = 256, N = 29;
    QMatrix q = qmatrix(N, K, 64, bits, kScaleF32);
    for (int M : {2, 9, 17}) {
      std::vector<float> x = normal(static_cast<size_t>(M) * K), out;
      QmmArgs a = qmm_args(q, x, M, out);
      a.row_invariant = true;
      t.qmm(a);
      for (int m = 0; m < M; ++m) {
        std::vector<float> xm(x.begin() + static_cast<int64_t>(m) * K, x.begin() + static_cast<int64_t>(m + 1) * K), one;
        QmmArgs b = qmm_args(q, xm, 1, one);
        t.qmm(b);
        const std::vector<float> row(out.begin() + static_cast<int64_t>(m) * N, out.begin() + static_cast<int64_t>(m + 1) * N);
        check_exact(t.name, "row-invariant qmm bits=" + std::to_string(bits) + " M=" + std::to_string(M) + " row " +
                                std::to_string(m),
                    row, one);
      }
    }
  }
}

// A random float matrix W [N, K] stored as `type` (a WeightType) and its
// values as f32 (16-bit values widen exactly).
struct FMatrix {
  int N, K, type;
  std::vector<float> f32;
  std::vector<uint16_t> h;
  const void* data() const { return type == kWeightF32 ? static_cast<const void*>(f32.data()) : h.data(); }
};

FMatrix fmatrix(int N, int K, int type) {
  FMatrix f{N, K, type, normal(static_cast<size_t>(N) * K, 0.1f), {}};
  if (type != kWeightF32) {
    for (auto& v : f.f32) {
      f.h.push_back(type == kWeightF16 ? to_half(v) : to_bf16(v));
      v = type == kWeightF16 ? half_to_float(f.h.back()) : bf16_to_float(f.h.back());
    }
  }
  return f;
}

QmmArgs fmm_args(const FMatrix& f, const std::vector<float>& x, int M, std::vector<float>& out) {
  out.assign(static_cast<size_t>(M) * f.N, 0.0f);
  QmmArgs a{};
  a.x = x.data();
  a.ldx = f.K;
  a.w = f.data();
  a.out = out.data();
  a.ldo = f.N;
  a.M = M;
  a.N = f.N;
  a.K = f.K;
  a.weight_type = f.type;
  return a;
}

// Float weights (f32, f16, bf16): matvec and GEMM row counts, K and N not
// multiples of any vector width, against the f64 dot product within the
// bound of check_product (a sum of K products in another order); two
// matrices of different types in one call; and with `row_invariant` every
// row of a batch bit for bit against the row alone.
void check_float_products(const Table& t) {
  const int shapes[][2] = {{37, 67}, {19, 300}, {64, 128}, {5, 3}};
  for (int type : {kWeightF32, kWeightF16, kWeightBF16}) {
    for (const auto& nk : shapes) {
      const FMatrix f = fmatrix(nk[0], nk[1], type);
      for (int M : {1, 3, 8, 9, 33}) {
        std::vector<float> x = normal(static_cast<size_t>(M) * f.K), out;
        QmmArgs a = fmm_args(f, x, M, out);
        t.qmm(a);
        for (int m = 0; m < M; ++m) {
          for (int n = 0; n < f.N; ++n) {
            double ref = 0.0, mag = 0.0;
            for (int k = 0; k < f.K; ++k) {
              const double p = static_cast<double>(f.f32[static_cast<size_t>(n) * f.K + k]) * x[static_cast<size_t>(m) * f.K + k];
              ref += p;
              mag += std::fabs(p);
            }
            const double got = out[static_cast<size_t>(m) * f.N + n];
            ++g_checks;
            if (!(std::fabs(got - ref) <= 8.0 * std::sqrt(f.K) * 1.1920929e-7 * mag + 1e-30)) {
              char buf[256];
              std::snprintf(buf, sizeof buf, "%s float product type=%d N=%d K=%d M=%d m=%d n=%d: %.9g vs %.9g", t.name,
                            type, f.N, f.K, M, m, n, got, ref);
              fail(buf);
              m = M;
              break;
            }
          }
        }
      }
      for (int M : {2, 9, 17}) {
        std::vector<float> x = normal(static_cast<size_t>(M) * f.K), out;
        QmmArgs a = fmm_args(f, x, M, out);
        a.row_invariant = true;
        t.qmm(a);
        for (int m = 0; m < M; ++m) {
          std::vector<float> xm(x.begin() + static_cast<int64_t>(m) * f.K, x.begin() + static_cast<int64_t>(m + 1) * f.K),
              one;
          QmmArgs b = fmm_args(f, xm, 1, one);
          t.qmm(b);
          const std::vector<float> row(out.begin() + static_cast<int64_t>(m) * f.N,
                                       out.begin() + static_cast<int64_t>(m + 1) * f.N);
          check_exact(t.name, "row-invariant float product type=" + std::to_string(type) + " M=" + std::to_string(M) +
                                  " row " + std::to_string(m),
                      row, one);
        }
      }
    }
  }
  // Two matrices of different types against one x, in one call: each as alone.
  for (int M : {1, 11}) {
    const FMatrix fs[2] = {fmatrix(40, 96, kWeightBF16), fmatrix(24, 96, kWeightF32)};
    std::vector<float> x = normal(static_cast<size_t>(M) * 96), outs[2], alone[2];
    QmmArgs args[2] = {fmm_args(fs[0], x, M, outs[0]), fmm_args(fs[1], x, M, outs[1])};
    t.qmm_multi(args, 2);
    for (int i = 0; i < 2; ++i) {
      QmmArgs b = fmm_args(fs[i], x, M, alone[i]);
      t.qmm(b);
      check_exact(t.name, "float qmm_multi M=" + std::to_string(M) + " output " + std::to_string(i), outs[i], alone[i]);
    }
  }
}

void check_close(const char* isa, const std::string& what, const std::vector<float>& got,
                 const std::vector<double>& ref, double rel, double abs_tol) {
  for (size_t i = 0; i < ref.size(); ++i) {
    ++g_checks;
    if (!(std::fabs(got[i] - ref[i]) <= rel * std::fabs(ref[i]) + abs_tol)) {
      char buf[256];
      std::snprintf(buf, sizeof buf, "%s %s [%zu]: %.9g vs %.9g", isa, what.c_str(), i, got[i], ref[i]);
      fail(buf);
      return;
    }
  }
}

void check_exact(const char* isa, const std::string& what, const std::vector<float>& got,
                 const std::vector<float>& want) {
  ++g_checks;
  if (std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) != 0) {
    size_t i = 0;
    while (i < got.size() && std::memcmp(&got[i], &want[i], sizeof(float)) == 0) ++i;
    char buf[256];
    std::snprintf(buf, sizeof buf, "%s %s [%zu]: %.9g, scalar build %.9g", isa, what.c_str(), i, got[i], want[i]);
    fail(buf);
  }
}

void check_rms_norm(const Table& t) {
  for (int dim : {7, 64, 133, 640}) {
    const int rows = 5;
    const int64_t ldx = dim + 3;
    std::vector<float> x = normal(rows * ldx), w = uniform(dim, 0.5f, 1.5f), out(rows * dim);
    t.rms_norm(x.data(), ldx, w.data(), out.data(), rows, dim, 1e-5f);
    std::vector<double> ref(rows * dim);
    for (int r = 0; r < rows; ++r) {
      double ss = 0.0;
      for (int d = 0; d < dim; ++d) ss += static_cast<double>(x[r * ldx + d]) * x[r * ldx + d];
      const double inv = 1.0 / std::sqrt(ss / dim + 1e-5);
      for (int d = 0; d < dim; ++d) ref[r * dim + d] = x[r * ldx + d] * inv * w[d];
    }
    // f32 sums of squares and three roundings: a few ulp.
    check_close(t.name, "rms_norm dim=" + std::to_string(dim), out, ref, 1e-5, 1e-6);
  }
}

void check_rope(const Table& t) {
  for (bool traditional : {false, true}) {
    for (int dims : {16, 32}) {
      const int A = 1, B = 3, L = 5, D = 32, half = dims / 2;
      std::vector<float> x = normal(A * B * L * D), cs(L * half), sn(L * half);
      for (int l = 0; l < L; ++l)
        for (int i = 0; i < half; ++i) {
          const float ang = (l + 7) * std::pow(10000.0f, -2.0f * i / dims);
          cs[l * half + i] = std::cos(ang);
          sn[l * half + i] = std::sin(ang);
        }
      std::vector<float> got(x.size()), want(x.size());
      RopeArgs a{x.data(), B * L * D, L * D, D, got.data(), A, B, L, D, dims, traditional, cs.data(), sn.data()};
      t.rope(a);
      a.out = want.data();
      table_scalar().rope(a);
      // MLX's rounding order in every build: bit-identical to the scalar one.
      check_exact(t.name, "rope dims=" + std::to_string(dims) + (traditional ? " traditional" : ""), got, want);
    }
  }
}

void check_gather(const Table& t) {
  for (int bits : {2, 3, 4, 5, 6, 8}) {
    for (int type : {kScaleF32, kScaleF16}) {
      QMatrix q = qmatrix(29, 128, 32, bits, type);
      const int64_t ids[] = {0, 28, 3, 3, 17};
      std::vector<float> got(5 * 128), want(5 * 128);
      GatherArgs a{q.w.data(), q.scales(), q.biases(), ids, got.data(), 5, 128, 32, bits, type};
      t.gather(a);
      a.out = want.data();
      table_scalar().gather(a);
      check_exact(t.name, "gather bits=" + std::to_string(bits), got, want);
    }
  }
}

// The rows16 layout (kernels.h): every block of 16 rows transposed, codes as
// bytes and scales/biases as elements. Its products are one fused
// multiply-add per k in increasing k of fma(code, s, b) and x, so every float
// ISA, thread count and row count must give the bits of that sequential sum.
// The avx512vnni and avx2i16 builds round x to int16 steps per group
// (rows16_i16_impl.h, rows16_i16_avx2_impl.h):
// there the products are checked against the f64 sum within those steps, and
// every row of every M must have the bits that row gets alone. Where the
// CPU has AMX, main() runs this with it off and on: 16 rows and more then take
// the tiles (rows16_amx_impl.h), a row alone the int16 kernel, and the two
// must agree bit for bit.
std::vector<uint8_t> rows16_bytes(const uint8_t* src, int rows, int64_t cols, int elem) {
  std::vector<uint8_t> out(static_cast<size_t>(rows) * cols * elem);
  for (int r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      std::memcpy(&out[((static_cast<int64_t>(r / 16) * cols + c) * 16 + r % 16) * elem],
                  src + (static_cast<int64_t>(r) * cols + c) * elem, elem);
  return out;
}

void check_rows16(const Table& t, bool int16_build) {
  for (int bits : {4, 8}) {
    for (int gs : {32, 64, 128}) {
      for (int type : {kScaleF32, kScaleF16, kScaleBF16}) {
        const int N = 48, K = 384, G = K / gs;
        QMatrix q = qmatrix(N, K, gs, bits, type);
        const int es = type == kScaleF32 ? 4 : 2;
        auto codes = rows16_bytes(reinterpret_cast<const uint8_t*>(q.w.data()), N, static_cast<int64_t>(K) * bits / 8, 1);
        auto scales = rows16_bytes(static_cast<const uint8_t*>(q.scales()), N, G, es);
        auto biases = rows16_bytes(static_cast<const uint8_t*>(q.biases()), N, G, es);
        const std::string what = "rows16 bits=" + std::to_string(bits) + " gs=" + std::to_string(gs) + " scales=" +
                                 std::to_string(type);
        for (int M : {1, 2, 3, 5, 16, 17, 70}) {
          std::vector<float> x = normal(static_cast<size_t>(M) * K), out, want(static_cast<size_t>(M) * N);
          // An activation outlier in every other row (the int16 kernel's
          // second pass for its group; the rows beside it take none).
          for (int m = 1; m < M; m += 2) x[static_cast<size_t>(m) * K + 37] *= 100.0f;
          for (int m = 0; m < M; ++m)
            for (int n = 0; n < N; ++n) {
              float acc = 0.0f;
              for (int k = 0; k < K; ++k) {
                const int64_t g = static_cast<int64_t>(n) * G + k / gs;
                const float w = std::fmaf(static_cast<float>(q.code(n, k)), scale_at(q.scales(), g, type),
                                          scale_at(q.biases(), g, type));
                acc = std::fmaf(w, x[static_cast<size_t>(m) * K + k], acc);
              }
              want[static_cast<size_t>(m) * N + n] = acc;
            }
          auto run = [&](const float* xr, int rows, std::vector<float>& o, bool row_invariant) {
            o.assign(static_cast<size_t>(rows) * N, 0.0f);
            QmmArgs a{xr, K, q.w.data(), q.scales(), q.biases(), o.data(), N, rows, N, K, gs, bits, type};
            a.w = codes.data();
            a.scales = scales.data();
            a.biases = biases.data();
            a.layout = WeightLayout::Rows16;
            a.row_invariant = row_invariant;
            t.qmm(a);
          };
          for (bool row_invariant : {false, true}) {
            run(x.data(), M, out, row_invariant);
            if (!int16_build) {
              check_exact(t.name, what + " M=" + std::to_string(M), out, want);
              continue;
            }
            check_product(t.name, what + " M=" + std::to_string(M), q, x, M, out, true, gs);
            for (int m = 0; m < M; ++m) {
              std::vector<float> alone;
              run(x.data() + static_cast<size_t>(m) * K, 1, alone, row_invariant);
              check_exact(t.name, what + " M=" + std::to_string(M) + " row " + std::to_string(m) + " vs alone",
                          std::vector<float>(out.begin() + static_cast<int64_t>(m) * N,
                                             out.begin() + static_cast<int64_t>(m + 1) * N),
                          alone);
            }
          }
        }
        const int64_t ids[] = {0, 47, 3, 3, 17};
        std::vector<float> got(5 * K), want(5 * K);
        for (int i = 0; i < 5; ++i)
          for (int k = 0; k < K; ++k) {
            const int64_t g = ids[i] * G + k / gs;
            want[static_cast<size_t>(i) * K + k] = std::fmaf(
                static_cast<float>(q.code(static_cast<int>(ids[i]), k)), scale_at(q.scales(), g, type),
                scale_at(q.biases(), g, type));
          }
        GatherArgs a{reinterpret_cast<const uint32_t*>(codes.data()), scales.data(), biases.data(), ids, got.data(), 5,
                     K, gs, bits, type, WeightLayout::Rows16};
        t.gather(a);
        check_exact(t.name, what + " gather", got, want);
      }
    }
  }
}

void check_gate(const Table& t) {
  for (Activation kind : {Activation::Silu, Activation::GeluTanh}) {
    const int rows = 3, cols = 301;
    std::vector<float> a = normal(rows * cols, 3.0f), b = normal(rows * cols), out(rows * cols);
    GateArgs g{a.data(), cols, b.data(), cols, out.data(), rows, cols, kind};
    t.gate(g);
    std::vector<double> ref(rows * cols);
    for (int i = 0; i < rows * cols; ++i) {
      const double v = a[i];
      const double act = kind == Activation::Silu ? v / (1.0 + std::exp(-v))
                                   : 0.5 * v * (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
      ref[i] = act * b[i];
    }
    // MLX's exp polynomial (~2 ulp) and tanh through it: ~1e-6 relative.
    check_close(t.name, kind == Activation::Silu ? "gate silu" : "gate gelu", out, ref, 2e-5, 1e-6);
  }
}

// Attention: q [B, H, Lq, D], k and v [B, KVH, Lk, D] contiguous.
void check_attention(const Table& t) {
  struct Case {
    int Lq, Lk;
    bool causal;
    MaskKind mask_kind;
    int H = 4, KVH = 2, D = 32;
  };
  constexpr MaskKind kNone = MaskKind::None, kBool = MaskKind::Bool, kAdd = MaskKind::Additive;
  // The last cases: SmolLM2's decode shape (3 query heads per KV head, D 64)
  // and Gemma 3 270M's (4 per KV head, D 256), with key blocks and a tail.
  const Case cases[] = {{1, 1, false, kNone},         {1, 37, false, kNone},        {2, 9, true, kNone},
                        {1, 21, false, kBool},        {19, 19, true, kNone},        {19, 40, true, kNone},
                        {7, 23, false, kAdd},         {33, 33, false, kBool},       {1, 53, false, kNone, 6, 2, 64},
                        {1, 70, false, kNone, 4, 1, 256}, {2, 35, true, kNone, 6, 2, 64}};
  const int B = 1;
  for (const auto& c : cases) {
    const int H = c.H, KVH = c.KVH, D = c.D;
    std::vector<float> q = normal(B * H * c.Lq * D), k = normal(B * KVH * c.Lk * D), v = normal(B * KVH * c.Lk * D);
    std::vector<uint8_t> bmask(c.Lq * c.Lk);
    std::vector<float> fmask(c.Lq * c.Lk);
    for (int i = 0; i < c.Lq * c.Lk; ++i) {
      bmask[i] = (i % 3 != 1) || (i % c.Lk == 0);  // every row keeps key 0
      fmask[i] = static_cast<float>(g_rng() % 5) * -0.5f;
    }
    std::vector<float> out(B * H * c.Lq * D);
    AttnArgs a{};
    a.q = q.data();
    a.qs[0] = H * c.Lq * D, a.qs[1] = c.Lq * D, a.qs[2] = D, a.qs[3] = 1;
    a.k = k.data();
    a.ks[0] = KVH * c.Lk * D, a.ks[1] = c.Lk * D, a.ks[2] = D, a.ks[3] = 1;
    a.v = v.data();
    a.vs[0] = a.ks[0], a.vs[1] = a.ks[1], a.vs[2] = a.ks[2], a.vs[3] = 1;
    a.out = out.data();
    a.os[0] = H * c.Lq * D, a.os[1] = c.Lq * D, a.os[2] = D;
    a.B = B, a.H = H, a.KVH = KVH, a.Lq = c.Lq, a.Lk = c.Lk, a.D = D, a.Dv = D;
    a.scale = 0.2f;
    a.causal = c.causal;
    a.mask_kind = c.mask_kind;
    a.mask = c.mask_kind == kBool ? static_cast<const void*>(bmask.data()) : fmask.data();
    a.ms[0] = 0, a.ms[1] = 0, a.ms[2] = c.Lk, a.ms[3] = 1;
    t.attention(a);
    std::vector<double> ref(out.size());
    for (int h = 0; h < H; ++h) {
      const int kvh = h / (H / KVH);
      for (int i = 0; i < c.Lq; ++i) {
        std::vector<double> s(c.Lk);
        double mx = -1e300;
        for (int j = 0; j < c.Lk; ++j) {
          double dot = 0.0;
          for (int d = 0; d < D; ++d) dot += static_cast<double>(q[(h * c.Lq + i) * D + d]) * k[(kvh * c.Lk + j) * D + d];
          s[j] = 0.2 * dot;
          bool keep = !c.causal || j <= i + (c.Lk - c.Lq);
          if (c.mask_kind == kBool) keep = keep && bmask[i * c.Lk + j];
          if (c.mask_kind == kAdd) s[j] += fmask[i * c.Lk + j];
          if (!keep) s[j] = -1e300;
          mx = std::fmax(mx, s[j]);
        }
        double sum = 0.0;
        for (int j = 0; j < c.Lk; ++j) sum += s[j] <= -1e299 ? 0.0 : std::exp(s[j] - mx);
        for (int d = 0; d < D; ++d) {
          double o = 0.0;
          for (int j = 0; j < c.Lk; ++j)
            if (s[j] > -1e299) o += std::exp(s[j] - mx) / sum * v[(kvh * c.Lk + j) * D + d];
          ref[(h * c.Lq + i) * D + d] = o;
        }
      }
    }
    // Softmax weights within ~1e-6 relative (f32 scores of |s| ≲ 10, MLX's
    // exp), each output a convex combination of values |v| ≲ 4.
    check_close(t.name,
                "attention H=" + std::to_string(H) + "/" + std::to_string(KVH) + " D=" + std::to_string(D) + " Lq=" +
                    std::to_string(c.Lq) + " Lk=" + std::to_string(c.Lk) + (c.causal ? " causal" : "") +
                    " mask=" + std::to_string(static_cast<int>(c.mask_kind)),
                out, ref, 1e-4, 2e-5);
  }
}

void check_read_sum(const Table& t) {
  for (int64_t n : {1, 63, 4096, 4099}) {
    std::vector<float> x = uniform(n, 0.0f, 1.0f);
    double ref = 0.0;
    for (float v : x) ref += v;
    ++g_checks;
    const float got = t.read_sum(x.data(), n);
    if (!(std::fabs(got - ref) <= 1e-5 * ref + 1e-6)) fail(std::string(t.name) + " read_sum n=" + std::to_string(n));
  }
}

}  // namespace

int main(int argc, char** argv) {
  Isa isa = best_isa();
  if (argc > 1 && !isa_from_name(argv[1], isa)) {
    std::fprintf(stderr, "usage: isa_check [scalar|avx2|avx2i16|avx512|avx512vnni|neon]\n");
    return 2;
  }
  if (!set_isa(isa)) {
    std::fprintf(stderr, "isa_check: this CPU cannot run the %s build\n", argc > 1 ? argv[1] : "best");
    return 2;
  }
  const Table& t = table();
  for (int threads : {1, 2}) {
    set_pool_threads(threads);
    check_qmm(t, isa == Isa::Avx512Vnni);
    check_row_invariance(t);
    check_float_products(t);
    check_rms_norm(t);
    check_rope(t);
    check_gather(t);
    set_amx(false);
    check_rows16(t, isa == Isa::Avx512Vnni || isa == Isa::Avx2I16);
    set_amx(true);
    if (isa == Isa::Avx512Vnni && amx_supported()) check_rows16(t, true);
    check_gate(t);
    check_attention(t);
    check_read_sum(t);
  }
  std::printf("isa_check %s%s: %d checks, %d failed\n", t.name,
              isa == Isa::Avx512Vnni && amx_supported() ? " (rows16 also on AMX tiles)" : "", g_checks, g_failures);
  return g_failures == 0 ? 0 : 1;
}
