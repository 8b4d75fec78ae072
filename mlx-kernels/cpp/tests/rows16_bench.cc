// Batched quantized products, MLX's row-major layout against rows16
// (docs/kernels.md "Quantized products in the rows16 layout"): SmolLM2-135M's
// seven layer products (q, k, v, o, gate, up, down), 4-bit, group 32, f16
// (or, with `f32` as third argument, f32) scales and biases, 30 layers of distinct random weights (so they stream
// from memory, as in a decode step), for M = 1 .. 512 rows of x. Prints the
// best-of-N milliseconds per pass over all layers. Build and run from the
// repository root (the same flags as build.rs):
//
//   mkdir -p target/rows16-bench/include && ln -sfn $PWD/mlx-kernels target/rows16-bench/include/mlxcel-mlx
//   K=mlx-kernels/cpp/kernels
//   g++ -std=c++20 -O2 -ffp-contract=off -pthread -Itarget/rows16-bench/include
//     -o target/rows16-bench/rows16_bench mlx-kernels/cpp/tests/rows16_bench.cc
//     $K/pool.cc $K/dispatch.cc $K/mlx_math.cc $K/isa_*.cc      (one command)
//   target/rows16-bench/rows16_bench [THREADS] [LAYERS] [f16|f32] [ISA] [amx|noamx]
//
// ISA (scalar, avx2, avx512, avx512vnni, neon; default the best) picks the
// build: avx512 against avx512vnni compares the float and the int16 kernels.
// noamx keeps the avx512vnni build off the AMX tiles (rows16_amx_impl.h).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "mlxcel-mlx/cpp/kernels/kernels.h"

using namespace mlxcel::kern;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// One matrix in both layouts: codes as bytes, f16 scales and biases and the
// same values in f32.
struct Matrix {
  int N, K;
  std::vector<uint8_t> codes, codes16;
  std::vector<uint16_t> scales, biases, scales16, biases16;
  std::vector<float> fscales, fbiases, fscales16, fbiases16;
};

bool g_f32 = false;

uint16_t f16(float f) {
  _Float16 h = static_cast<_Float16>(f);
  uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
}

template <class T>
std::vector<T> rows16(const std::vector<T>& src, int rows, int cols) {
  std::vector<T> out(src.size());
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) out[(static_cast<size_t>(r / 16) * cols + c) * 16 + r % 16] = src[static_cast<size_t>(r) * cols + c];
  return out;
}

Matrix matrix(int N, int K, std::mt19937& rng) {
  Matrix m{N, K, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}};
  const int row_bytes = K / 2, G = K / 32;
  m.codes.resize(static_cast<size_t>(N) * row_bytes);
  for (auto& c : m.codes) c = static_cast<uint8_t>(rng());
  std::normal_distribution<float> d(0.0f, 0.01f);
  for (int i = 0; i < N * G; ++i) {
    m.scales.push_back(f16(std::abs(d(rng)) + 1e-3f));
    m.biases.push_back(f16(d(rng) * 8));
  }
  m.codes16 = rows16(m.codes, N, row_bytes);
  m.scales16 = rows16(m.scales, N, G);
  m.biases16 = rows16(m.biases, N, G);
  for (auto h : m.scales) m.fscales.push_back(half_to_float(h));
  for (auto h : m.biases) m.fbiases.push_back(half_to_float(h));
  m.fscales16 = rows16(m.fscales, N, G);
  m.fbiases16 = rows16(m.fbiases, N, G);
  return m;
}

QmmArgs args(const Matrix& w, bool tiled, const float* x, int M, float* out) {
  QmmArgs a{};
  a.x = x;
  a.ldx = w.K;
  a.w = tiled ? w.codes16.data() : w.codes.data();
  if (g_f32) {
    a.scales = tiled ? w.fscales16.data() : w.fscales.data();
    a.biases = tiled ? w.fbiases16.data() : w.fbiases.data();
  } else {
    a.scales = tiled ? w.scales16.data() : w.scales.data();
    a.biases = tiled ? w.biases16.data() : w.biases.data();
  }
  a.out = out;
  a.ldo = w.N;
  a.M = M;
  a.N = w.N;
  a.K = w.K;
  a.group_size = 32;
  a.bits = 4;
  a.scale_type = g_f32 ? kScaleF32 : kScaleF16;
  a.row_invariant = M <= 16;  // a decode batch; more rows are a prefill
  a.layout = tiled ? WeightLayout::Rows16 : WeightLayout::RowMajor;
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 1;
  const int layers = argc > 2 ? std::atoi(argv[2]) : 30;
  g_f32 = argc > 3 && std::strcmp(argv[3], "f32") == 0;
  if (argc > 4) {
    Isa isa;
    if (!isa_from_name(argv[4], isa) || !set_isa(isa)) {
      std::fprintf(stderr, "rows16_bench: unknown ISA %s, or this CPU cannot run it\n", argv[4]);
      return 2;
    }
  }
  set_amx(!(argc > 5 && std::strcmp(argv[5], "noamx") == 0));
  set_pool_threads(threads);
  std::mt19937 rng(1);
  const int shapes[7][2] = {{576, 576}, {192, 576}, {192, 576}, {576, 576}, {1536, 576}, {1536, 576}, {576, 1536}};
  std::vector<Matrix> mats;
  for (int l = 0; l < layers; ++l)
    for (const auto& s : shapes) mats.push_back(matrix(s[0], s[1], rng));
  std::printf("%s%s, %d thread(s), %d layers of SmolLM2-135M's products, 4-bit g32 %s scales\n", table().name,
              amx_active() && table().isa == Isa::Avx512Vnni ? " (AMX tiles for 16 rows and more)" : "", threads, layers,
              g_f32 ? "f32" : "f16");
  std::printf("%5s %14s %14s %8s\n", "M", "row-major ms", "rows16 ms", "ratio");
  for (int M : {1, 2, 4, 8, 16, 64, 512}) {
    std::vector<float> x(static_cast<size_t>(M) * 1536, 0.5f), out(static_cast<size_t>(M) * 1536);
    double best[2] = {1e9, 1e9};
    const int reps = M >= 64 ? 3 : 9;
    for (int rep = 0; rep < reps; ++rep)
      for (int tiled = 0; tiled < 2; ++tiled) {
        const double t = now();
        for (const auto& w : mats) {
          QmmArgs a = args(w, tiled, x.data(), M, out.data());
          table().qmm(a);
        }
        best[tiled] = std::min(best[tiled], now() - t);
      }
    std::printf("%5d %14.2f %14.2f %8.2f\n", M, best[0] * 1e3, best[1] * 1e3, best[1] / best[0]);
  }
  return 0;
}
