// The prompt products (mlx-kernels/cuda/prompt.cuh) run on the CPU through
// cuda_shim.h, launched with the runtime's shapes (gpu_args.h
// set_prompt_shape) and both tile shapes, against f64 references: every
// code width, f32 and f16 scales, rows that fill no tile; q/k/v with heads
// and the norm folded in, o with its residual, the gated MLP with the norm
// folded in; and the first rows' bits the same alone (another tile shape)
// as among more rows. `make cuda-check` runs it beside decode_emulate.cc.
//
//   g++ -std=c++20 -O2 -pthread -Wno-unknown-pragmas -I mlx-kernels/cuda \
//     -o /tmp/prompt_emulate scripts/gpu/emulate/prompt_emulate.cc && /tmp/prompt_emulate
#include "cuda_shim.h"

#include <cstdio>
#include <string>
#include <vector>

#include "gpu_args.h"
#include "products.cuh"
#include "prompt.cuh"
#include "../host_reference.h"

using namespace mlxcel;
using namespace host;

namespace {

// Launches a prompt product with set_prompt_shape's grid, or with `tile`
// rows of x a tile when it is not 0.
template <int Bits, class S, bool Gated>
void run(ProductArgs a, int tile) {
  ProductGrid g = set_prompt_shape(a, Gated ? ProductLaunch::Gated : ProductLaunch::Plain);
  if (tile != 0) {
    a.chunk = tile;
    g.blocks_y = (a.rows + tile - 1) / tile;
  }
  const unsigned gx = g.blocks_x, gy = g.blocks_y;
  if constexpr (Gated) {
    if (a.chunk == kTileRows)
      launch(gx, gy, g.threads, [&] { prompt_gated<Bits, S, kActSilu, kTileRows>(a); });
    else
      launch(gx, gy, g.threads, [&] { prompt_gated<Bits, S, kActSilu, kTileRowsSmall>(a); });
  } else {
    if (a.chunk == kTileRows)
      launch(gx, gy, g.threads, [&] { prompt_product<Bits, S, kTileRows>(a); });
    else
      launch(gx, gy, g.threads, [&] { prompt_product<Bits, S, kTileRowsSmall>(a); });
  }
}

// The heads layout [1, H, rows, d] of an output back to [rows, n].
std::vector<float> merge_heads(const std::vector<float>& o, int rows, int n, int heads) {
  std::vector<float> r(o.size());
  const int d = n / heads;
  for (int m = 0; m < rows; ++m)
    for (int c = 0; c < n; ++c) r[size_t(m) * n + c] = o[(size_t(c / d) * rows + m) * d + c % d];
  return r;
}

template <int Bits, class S>
void plain(int rows, int tile) {
  const int k = 576, group = 32;
  const std::string tag = "bits " + std::to_string(Bits) + (std::is_same_v<S, float> ? " f32" : " f16") +
                          " rows " + std::to_string(rows) + " tile " + std::to_string(tile) + ": ";
  Matrix<S> q(9 * 64, k, Bits, group), kv(3 * 64, k, Bits, group);
  const auto x = normal(size_t(rows) * k);
  const auto gain = normal(k, 1.0f, 0.1f);
  // x [1, rows, k]: one sequence of `rows` positions, heads [1, H, rows, 64].
  std::vector<float> oq(size_t(rows) * q.n), okv(size_t(rows) * kv.n), ov(size_t(rows) * kv.n);
  auto a = args(x.data(), rows, k, group, {q.weight(oq.data(), 9), kv.weight(okv.data(), 3), kv.weight(ov.data(), 3)});
  a.seq = rows;
  with_norm(a, gain.data(), 1e-5f);
  run<Bits, S, false>(a, tile);
  check(tag + "q, heads, norm folded", merge_heads(oq, rows, q.n, 9), reference(x, rows, q, &gain, 1e-5));
  check(tag + "v, heads, norm folded", merge_heads(ov, rows, kv.n, 3), reference(x, rows, kv, &gain, 1e-5));
  Matrix<S> o(k, k, Bits, 64);
  const auto res = normal(size_t(rows) * k);
  std::vector<float> out(size_t(rows) * k);
  auto b = args(x.data(), rows, k, 64, {o.weight(out.data())});
  b.residual = res.data();
  run<Bits, S, false>(b, tile);
  auto want = reference(x, rows, o, nullptr, 0);
  for (size_t i = 0; i < want.size(); ++i) want[i] += res[i];
  check(tag + "o + residual", out, want);
}

template <int Bits, class S>
void gated_mlp(int rows, int tile) {
  const int k = 576, n = 200;
  const std::string tag = "bits " + std::to_string(Bits) + " rows " + std::to_string(rows) + " tile " +
                          std::to_string(tile) + ": ";
  Matrix<S> g(n, k, Bits, 32), u(n, k, Bits, 32);
  const auto x = normal(size_t(rows) * k);
  const auto gain = normal(k, 1.0f, 0.1f);
  std::vector<float> out(size_t(rows) * n);
  auto a = args(x.data(), rows, k, 32, {g.weight(out.data()), u.weight(nullptr)});
  with_norm(a, gain.data(), 1e-6f);
  run<Bits, S, true>(a, tile);
  const auto rg = reference(x, rows, g, &gain, 1e-6), ru = reference(x, rows, u, &gain, 1e-6);
  std::vector<double> want(rg.size());
  for (size_t i = 0; i < rg.size(); ++i) want[i] = rg[i] / (1.0 + std::exp(-rg[i])) * ru[i];
  check(tag + "silu(gate) * up, norm folded", out, want);
  // The first 33 rows alone, in tiles of the other shape.
  std::vector<float> few(size_t(33) * n);
  auto b = a;
  b.rows = 33;
  b.w[0].out = few.data();
  run<Bits, S, true>(b, tile == kTileRows ? kTileRowsSmall : kTileRows);
  same_bits(tag + "first 33 rows alone, other tile", few, std::vector<float>(out.begin(), out.begin() + few.size()));
}

}  // namespace

int main() {
  plain<4, __half>(100, 0);
  plain<4, float>(70, kTileRows);
  plain<5, __half>(45, kTileRowsSmall);
  plain<3, float>(100, kTileRows);
  plain<8, __half>(33, 0);
  plain<6, float>(40, 0);
  plain<2, __half>(64, kTileRows);
  gated_mlp<4, __half>(100, 0);
  gated_mlp<5, float>(70, kTileRows);
  gated_mlp<6, __half>(40, kTileRowsSmall);
  std::printf("%s\n", all_ok ? "prompt_emulate: all within bounds" : "prompt_emulate: SOME FAILED");
  return all_ok ? 0 : 1;
}
