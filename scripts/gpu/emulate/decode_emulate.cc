// mlxcel's decode-step products (mlx-kernels/cuda/products.cuh) and token
// gather (gather.cuh) run on the CPU through cuda_shim.h, launched with the
// runtime's own shapes (gpu_args.h set_product_shape), against f64
// references: every code width, f32 and f16 scales, 1 to 9 rows of x; q/k/v
// with heads and the norm folded in, o with its residual, a vocabulary-
// sized product (four rows of W a thread), the gated MLP (both chunks of x
// rows) with the norm folded in; and each row's bits the same alone as in
// its batch (docs/kernels.md "Batch invariance"). `make cuda-check` runs it:
// CI has no GPU, and this checks the kernels' indexing and rounding order
// (not their speed) on every change.
//
//   g++ -std=c++20 -O2 -pthread -Wno-unknown-pragmas -I mlx-kernels/cuda \
//     -o /tmp/decode_emulate scripts/gpu/emulate/decode_emulate.cc && /tmp/decode_emulate
#include "cuda_shim.h"

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "gpu_args.h"
#include "products.cuh"
#include "gather.cuh"
#include "../host_reference.h"

using namespace mlxcel;
using namespace host;

namespace {

template <int Bits, class S>
void run_plain(ProductArgs a) {
  const ProductGrid g = set_product_shape(a, ProductLaunch::Plain);
  if (a.wide == kWide)
    launch(g.blocks_x, g.blocks_y, g.threads, [&] { product<Bits, S, kWide>(a); });
  else
    launch(g.blocks_x, g.blocks_y, g.threads, [&] { product<Bits, S, 1>(a); });
}

template <int Bits, class S>
void run_gated(ProductArgs a) {
  const ProductGrid g = set_product_shape(a, ProductLaunch::Gated);
  if (a.chunk == kGatedChunk)
    launch(g.blocks_x, g.blocks_y, g.threads, [&] { gated<Bits, S, kActSilu, kGatedChunk>(a); });
  else
    launch(g.blocks_x, g.blocks_y, g.threads, [&] { gated<Bits, S, kActSilu, kRowChunk>(a); });
}

// The f64 reference [rows, n] of x Wᵀ, normed first with `gain` when given.
template <int Bits, class S>
void products(int rows) {
  const int k = 576, group = 32;
  const std::string tag = "bits " + std::to_string(Bits) + (std::is_same_v<S, float> ? " f32" : " f16") +
                          " rows " + std::to_string(rows) + ": ";
  Matrix<S> q(9 * 64, k, Bits, group), kv(3 * 64, k, Bits, group);
  const auto x = normal(size_t(rows) * k);
  const auto gain = normal(k, 1.0f, 0.1f);
  // x [rows, 1, k]: the heads layout [rows, H, 1, 64] is row-major [rows, n].
  std::vector<float> oq(size_t(rows) * q.n), okv(size_t(rows) * kv.n), ov(size_t(rows) * kv.n);
  auto a = args(x.data(), rows, k, group, {q.weight(oq.data(), 9), kv.weight(okv.data(), 3), kv.weight(ov.data(), 3)});
  with_norm(a, gain.data(), 1e-5f);
  run_plain<Bits, S>(a);
  check(tag + "q, heads, norm folded", oq, reference(x, rows, q, &gain, 1e-5));
  check(tag + "v, heads, norm folded", ov, reference(x, rows, kv, &gain, 1e-5));
  // Row rows-1 alone: the bits it gets in the batch.
  {
    std::vector<float> alone(q.n), ak(kv.n), av(kv.n);
    auto b = args(x.data() + size_t(rows - 1) * k, 1, k, group,
                  {q.weight(alone.data(), 9), kv.weight(ak.data(), 3), kv.weight(av.data(), 3)});
    with_norm(b, gain.data(), 1e-5f);
    run_plain<Bits, S>(b);
    same_bits(tag + "q's last row alone", alone, std::vector<float>(oq.end() - q.n, oq.end()));
  }
  // o + residual (K 576), and the down projection (K 1536, group 64) + residual.
  Matrix<S> o(k, k, Bits, group), down(k, 1536, Bits, 64);
  const auto res = normal(size_t(rows) * k);
  std::vector<float> out(size_t(rows) * k);
  auto b = args(x.data(), rows, k, group, {o.weight(out.data())});
  b.residual = res.data();
  run_plain<Bits, S>(b);
  auto want = reference(x, rows, o, nullptr, 0);
  for (size_t i = 0; i < want.size(); ++i) want[i] += res[i];
  check(tag + "o + residual", out, want);
  const auto xi = normal(size_t(rows) * 1536, 0.0f, 0.2f);
  auto c = args(xi.data(), rows, 1536, 64, {down.weight(out.data())});
  c.residual = res.data();
  run_plain<Bits, S>(c);
  want = reference(xi, rows, down, nullptr, 0);
  for (size_t i = 0; i < want.size(); ++i) want[i] += res[i];
  check(tag + "down (K 1536, group 64) + residual", out, want);
  // Gate and up, norm folded.
  Matrix<S> gate(1536, k, Bits, group), up(1536, k, Bits, group);
  std::vector<float> mlp(size_t(rows) * 1536);
  auto d = args(x.data(), rows, k, group, {gate.weight(mlp.data()), up.weight(nullptr)});
  with_norm(d, gain.data(), 1e-6f);
  run_gated<Bits, S>(d);
  const auto g = reference(x, rows, gate, &gain, 1e-6), u = reference(x, rows, up, &gain, 1e-6);
  std::vector<double> act(g.size());
  for (size_t i = 0; i < g.size(); ++i) act[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
  check(tag + "silu(gate) * up, norm folded", mlp, act);
  {
    std::vector<float> alone(1536);
    auto e = d;
    e.x = x.data() + size_t(rows - 1) * k;
    e.rows = 1;
    e.w[0].out = alone.data();
    run_gated<Bits, S>(e);
    same_bits(tag + "gated's last row alone", alone, std::vector<float>(mlp.end() - 1536, mlp.end()));
  }
}

// A vocabulary-sized product: four rows of W a thread even for one row of x.
void vocabulary() {
  const int k = 576, n = 8192, rows = 3;
  Matrix<__half> w(n, k, 8, 64);
  const auto x = normal(size_t(rows) * k);
  const auto gain = normal(k, 1.0f, 0.1f);
  std::vector<float> out(size_t(rows) * n), alone(n);
  auto a = args(x.data(), rows, k, 64, {w.weight(out.data())});
  with_norm(a, gain.data(), 1e-5f);
  run_plain<8, __half>(a);
  check("vocabulary 8192 x 576, 8-bit, norm folded", out, reference(x, rows, w, &gain, 1e-5));
  auto b = a;
  b.x = x.data() + size_t(2) * k;
  b.rows = 1;
  b.w[0].out = alone.data();
  run_plain<8, __half>(b);
  same_bits("vocabulary: row 2 alone", alone, std::vector<float>(out.end() - n, out.end()));
}

// Token embeddings: rows of the table dequantized as MLX rounds (s · q, then + b).
template <int Bits>
void gathers() {
  const int n = 100, k = 640;
  Matrix<float> t(n, k, Bits, 32);
  const std::vector<int> ids{0, 99, 7, -1, 250};
  std::vector<float> out(ids.size() * k);
  GatherRowsArgs a{};
  a.ids = ids.data();
  a.ids_signed = 1;
  a.count = int(ids.size());
  a.n = n;
  a.k = k;
  a.group = 32;
  a.codes = t.codes.data();
  a.scales = t.scales.data();
  a.biases = t.biases.data();
  a.scale = 1.0f;
  a.out = out.data();
  launch((k + kGatherThreads - 1) / kGatherThreads, unsigned(ids.size()), kGatherThreads, [&] { gather<Bits, float>(a); });
  bool same = true;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int id = ids[i] < 0 ? std::max(ids[i] + n, 0) : std::min(ids[i], n - 1);
    for (int c = 0; c < k; ++c) {
      const size_t g = (size_t(id) * k + c) / 32;
      const float want = t.scales[g] * float(t.code(id, c)) + t.biases[g];
      same = same && out[i * k + c] == want;
    }
  }
  all_ok = all_ok && same;
  std::printf("%-52s %s\n", ("gather, bits " + std::to_string(Bits) + " (negative and out-of-range ids)").c_str(),
              same ? "exact ok" : "DIFFER (FAILED)");
}

template <int Bits>
void width() {
  products<Bits, float>(1);
  products<Bits, __half>(3);
  gathers<Bits>();
}

}  // namespace

int main() {
  width<2>();
  width<3>();
  width<4>();
  width<5>();
  width<6>();
  width<8>();
  products<4, __half>(9);
  vocabulary();
  std::printf("%s\n", all_ok ? "decode_emulate: all within bounds" : "decode_emulate: SOME FAILED");
  return all_ok ? 0 : 1;
}
