// The decode step's quantized products alone, on the GPU, outside MLX: a
// model's layers of q/k/v (norm folded in, heads layout), output projection
// (+ residual), gated MLP (norm folded in) and down projection (+ residual),
// then the output projection of the vocabulary, each layer with weights of
// its own (so the L2 cache holds no more than in a real step), recorded as
// one CUDA graph and replayed; prints the time of a step's products, of each
// kind per launch, and the bandwidth that is, and checks every kind against
// an f64 reference on the host. docs/cuda.md "Wider products".
//
//   nvcc -O3 -std=c++17 -arch=sm_90a -o product_bench scripts/gpu/product_bench.cu
//   ./product_bench [rows=1] [replays=200] [wide=0] [kernels=auto] [tile=0]
//
// `wide` forces the rows of W a thread of a plain decode product takes (1
// or 4; 0: what the runtime's set_product_shape chooses). `kernels` picks
// the decode kernels (`rows`), the prompt kernels (`tiles`, prompt.cuh) or,
// by default, what the runtime launches for that many rows (tiles above
// gpu.h's kMaxRows, 32); with many rows only some are checked against the
// reference (the first and last 16 and 8 in the middle). `tile` forces the
// prompt kernels' rows of x a tile (32 or 64; 0: set_prompt_shape's choice).
//
// The shapes are SmolLM2-135M's (576 wide, 1536 MLP, 9 and 3 heads of 64,
// 30 layers, 4-bit groups of 32 with f16 scales, an 8-bit vocabulary of
// 49152): what the bundle of the package's Q4_1 GGUF runs; then Gemma 3
// 270M's 6-bit vocabulary projection (262144 x 640) alone.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <algorithm>
#include <utility>
#include <random>
#include <vector>

#include "../../mlx-kernels/cuda/kernels.cu"
#include "host_reference.h"

using namespace mlxcel;
using namespace host;

#define CHECK(x)                                                                             \
  do {                                                                                       \
    cudaError_t status_ = (x);                                                                     \
    if (status_ != cudaSuccess) {                                                                \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(status_)); \
      std::exit(1);                                                                          \
    }                                                                                        \
  } while (0)

constexpr int kHidden = 576, kInter = 1536, kVocab = 49152, kLayers = 30, kHeads = 9, kKvHeads = 3, kHeadDim = 64;
constexpr int kGroup = 32;
constexpr float kEps = 1e-5f;

template <class T>
T* upload(const std::vector<T>& v) {
  T* d = nullptr;
  CHECK(cudaMalloc(&d, v.size() * sizeof(T)));
  CHECK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

// One quantized matrix [n, k] (host_reference.h's, with f16 scales and
// biases as GGUF transcodes store them) and its copy in device memory.
struct DeviceMatrix : host::Matrix<__half> {
  unsigned* d_codes;
  __half *d_scales, *d_biases;

  DeviceMatrix(int n_, int k_, int bits_) : host::Matrix<__half>(n_, k_, bits_, kGroup) {
    d_codes = upload(codes);
    d_scales = upload(scales);
    d_biases = upload(biases);
  }

  GpuWeight weight(float* out, int heads = 0) const { return GpuWeight{d_codes, d_scales, d_biases, out, n, heads}; }
};

struct Layer {
  DeviceMatrix q{kHeads * kHeadDim, kHidden, 4}, k{kKvHeads * kHeadDim, kHidden, 4}, v{kKvHeads * kHeadDim, kHidden, 4};
  DeviceMatrix o{kHidden, kHeads * kHeadDim, 4}, gate{kInter, kHidden, 4}, up{kInter, kHidden, 4}, down{kHidden, kInter, 4};
};

// The rows of W each thread of a plain product takes (0: as the runtime
// chooses; the third argument of the command line).
int g_wide = 0;
// The prompt kernels' rows of x a tile (0: as set_prompt_shape chooses).
int g_tile = 0;
// Whether the launches take the prompt kernels (the fourth argument).
bool g_tiles = false;
// gpu.h's kMaxRows: more rows of x than this are a prompt.
constexpr int kMaxRows = 32;

// The prompt kernels' launch shape of `a`, with `g_tile` when set.
std::pair<dim3, dim3> tile_shape(ProductArgs& a, ProductLaunch launch) {
  ProductGrid g = set_prompt_shape(a, launch);
  if (g_tile != 0) {
    a.chunk = g_tile;
    g.blocks_y = (a.rows + a.chunk - 1) / a.chunk;
  }
  return {dim3(g.blocks_x, g.blocks_y), dim3(g.threads)};
}

// The launch shape of `a` (gpu_args.h, as the runtime launches it), with
// `g_wide` for plain products.
std::pair<dim3, dim3> shape(ProductArgs& a, ProductLaunch launch) {
  a.wide = g_wide;
  const ProductGrid g = set_product_shape(a, launch);
  return {dim3(g.blocks_x, g.blocks_y), dim3(g.threads)};
}

template <int Bits>
void product_launch(ProductArgs& a, cudaStream_t s) {
  if (g_tiles) {
    auto [grid, block] = tile_shape(a, ProductLaunch::Plain);
    if (a.chunk == kTileRows)
      prompt_product<Bits, __half, kTileRows><<<grid, block, 0, s>>>(a);
    else
      prompt_product<Bits, __half, kTileRowsSmall><<<grid, block, 0, s>>>(a);
    return;
  }
  auto [grid, block] = shape(a, ProductLaunch::Plain);
  if (a.wide == kWide)
    product<Bits, __half, kWide><<<grid, block, 0, s>>>(a);
  else
    product<Bits, __half, 1><<<grid, block, 0, s>>>(a);
}
void gated_launch(ProductArgs& a, cudaStream_t s) {
  if (g_tiles) {
    auto [grid, block] = tile_shape(a, ProductLaunch::Gated);
    if (a.chunk == kTileRows)
      prompt_gated<4, __half, kActSilu, kTileRows><<<grid, block, 0, s>>>(a);
    else
      prompt_gated<4, __half, kActSilu, kTileRowsSmall><<<grid, block, 0, s>>>(a);
    return;
  }
  auto [grid, block] = shape(a, ProductLaunch::Gated);
  if (a.chunk == kGatedChunk)
    gated<4, __half, kActSilu, kGatedChunk><<<grid, block, 0, s>>>(a);
  else
    gated<4, __half, kActSilu, kRowChunk><<<grid, block, 0, s>>>(a);
}

// The rows of x checked against the reference: all of a few, else the
// first and last 16 and 8 in the middle (the host's f64 sums of a whole
// prompt would take minutes).
std::vector<int> checked_rows(int rows) {
  std::vector<int> r;
  for (int m = 0; m < rows; ++m)
    if (rows <= 40 || m < 16 || m >= rows - 16 || (m >= rows / 2 && m < rows / 2 + 8)) r.push_back(m);
  return r;
}

// The f64 reference of x Wᵀ for x rows [rows, k], normed first with `gain`
// when given: the checked rows' outputs, [checked_rows(rows), n].
std::vector<double> reference(const std::vector<float>& x, int rows, const DeviceMatrix& w,
                              const std::vector<float>* gain) {
  const auto checked = checked_rows(rows);
  return host::reference(x, rows, w, gain, kEps, &checked);
}

std::vector<float> download(const float* d, size_t n) {
  std::vector<float> h(n);
  CHECK(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
  return h;
}

// The checked rows (checked_rows) of the output [rows, n] at `d`.
std::vector<float> download_checked(const float* d, int rows, int n) {
  const auto all = download(d, static_cast<size_t>(rows) * n);
  std::vector<float> h;
  for (int m : checked_rows(rows)) h.insert(h.end(), all.begin() + static_cast<size_t>(m) * n, all.begin() + static_cast<size_t>(m + 1) * n);
  return h;
}

// The checked rows of the host's x [rows, n].
std::vector<float> host_checked(const std::vector<float>& x, int rows, int n) {
  std::vector<float> h;
  for (int m : checked_rows(rows)) h.insert(h.end(), x.begin() + static_cast<size_t>(m) * n, x.begin() + static_cast<size_t>(m + 1) * n);
  return h;
}

int main(int argc, char** argv) {
  const int rows = argc > 1 ? std::atoi(argv[1]) : 1;
  const int replays = argc > 2 ? std::atoi(argv[2]) : 200;
  g_wide = argc > 3 ? std::atoi(argv[3]) : 0;
  const std::string kernels = argc > 4 ? argv[4] : "auto";
  if (kernels != "auto" && kernels != "rows" && kernels != "tiles") {
    std::fprintf(stderr, "kernels must be auto, rows or tiles, not %s\n", kernels.c_str());
    return 2;
  }
  g_tiles = kernels == "tiles" || (kernels == "auto" && rows > kMaxRows);
  g_tile = argc > 5 ? std::atoi(argv[5]) : 0;
  if (g_tile != 0 && g_tile != kTileRows && g_tile != kTileRowsSmall) {
    std::fprintf(stderr, "tile must be 0, %d or %d, not %d\n", kTileRowsSmall, kTileRows, g_tile);
    return 2;
  }
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %d SMs; %d x rows, %d replays, %s kernels, wide %d, tile %d (0: the runtime's choice)\n",
              prop.name, prop.multiProcessorCount, rows, replays, g_tiles ? "prompt (tiles)" : "decode (rows)", g_wide,
              g_tile);

  std::vector<Layer> layers(kLayers);
  DeviceMatrix head(kVocab, kHidden, 8);
  const auto gain_h = normal(kHidden, 1.0f, 0.1f);
  const float* gain = upload(gain_h);
  const auto x_h = normal(static_cast<size_t>(rows) * kHidden);
  const auto xi_h = normal(static_cast<size_t>(rows) * kInter, 0.0f, 0.2f);
  float* x = upload(x_h);
  float* xi = upload(xi_h);  // the MLP's activations, the down projection's input
  float* xa = upload(normal(static_cast<size_t>(rows) * kHidden));  // attention's output, o's input
  auto scratch = [&](size_t n) { return upload(std::vector<float>(n)); };
  float *q = scratch(rows * kHeads * kHeadDim), *k = scratch(rows * kKvHeads * kHeadDim),
        *v = scratch(rows * kKvHeads * kHeadDim), *h = scratch(rows * kHidden), *mlp = scratch(rows * kInter),
        *logits = scratch(static_cast<size_t>(rows) * kVocab);

  struct Kind {
    const char* name;
    std::vector<ProductArgs> launches;
    void (*launch)(ProductArgs&, cudaStream_t);
    double bytes;  // weights read per launch
    double flops;  // multiply-adds per launch, times 2
  };
  auto matrix_bytes = [](const DeviceMatrix& m) { return m.codes.size() * 4.0 + m.scales.size() * 4.0; };
  Kind qkv{"q/k/v, norm folded", {}, product_launch<4>, 0}, o{"o + residual", {}, product_launch<4>, 0},
      mlp_kind{"gate and up, norm folded", {}, gated_launch, 0}, down{"down + residual", {}, product_launch<4>, 0},
      vocab{"vocabulary (8-bit)", {}, product_launch<8>, 0};
  for (auto& l : layers) {
    auto a = args(x, rows, kHidden, kGroup, {l.q.weight(q, kHeads), l.k.weight(k, kKvHeads), l.v.weight(v, kKvHeads)});
    with_norm(a, gain, kEps);
    qkv.launches.push_back(a);
    a = args(xa, rows, kHidden, kGroup, {l.o.weight(h)});
    a.residual = x;
    o.launches.push_back(a);
    a = args(x, rows, kHidden, kGroup, {l.gate.weight(mlp), l.up.weight(nullptr)});
    with_norm(a, gain, kEps);
    mlp_kind.launches.push_back(a);
    a = args(xi, rows, kInter, kGroup, {l.down.weight(h)});
    a.residual = x;
    down.launches.push_back(a);
  }
  qkv.bytes = matrix_bytes(layers[0].q) + matrix_bytes(layers[0].k) + matrix_bytes(layers[0].v);
  qkv.flops = 2.0 * rows * kHidden * (kHeads + 2 * kKvHeads) * kHeadDim;
  o.flops = 2.0 * rows * kHidden * kHidden;
  mlp_kind.flops = 2.0 * rows * kHidden * 2 * kInter;
  down.flops = 2.0 * rows * kInter * kHidden;
  vocab.flops = 2.0 * rows * kHidden * kVocab;
  o.bytes = matrix_bytes(layers[0].o);
  mlp_kind.bytes = matrix_bytes(layers[0].gate) + matrix_bytes(layers[0].up);
  down.bytes = matrix_bytes(layers[0].down);
  auto va = args(x, rows, kHidden, kGroup, {head.weight(logits)});
  with_norm(va, gain, kEps);
  vocab.launches.push_back(va);
  vocab.bytes = matrix_bytes(head);

  // Correctness against the f64 reference (layer 0 and the vocabulary).
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  bool ok = true;
  auto check = [&](const char* what, const std::vector<float>& got, const std::vector<double>& want) {
    const double e = relative_error(got, want);
    const bool pass = e <= kErrorBound;
    ok = ok && pass;
    std::printf("  %-28s largest error / largest value %.2e %s\n", what, e, pass ? "ok" : "FAILED (bound 2e-5)");
  };
  std::printf("against f64 (bound 2e-5 of the output's scale: f32 sums of 576 to 1536 terms):\n");
  qkv.launch(qkv.launches[0], s);
  CHECK(cudaStreamSynchronize(s));
  {
    // q in the heads layout is [B, H, 1, D]: with one position, row-major [B, H·D].
    check("q (norm folded, heads)", download_checked(q, rows, kHeads * kHeadDim), reference(x_h, rows, layers[0].q, &gain_h));
    check("v (norm folded, heads)", download_checked(v, rows, kKvHeads * kHeadDim),
          reference(x_h, rows, layers[0].v, &gain_h));
  }
  o.launch(o.launches[0], s);
  CHECK(cudaStreamSynchronize(s));
  {
    auto want = reference(download(xa, rows * kHidden), rows, layers[0].o, nullptr);
    const auto residual = host_checked(x_h, rows, kHidden);
    for (size_t i = 0; i < want.size(); ++i) want[i] += residual[i];
    check("o + residual", download_checked(h, rows, kHidden), want);
  }
  mlp_kind.launch(mlp_kind.launches[0], s);
  CHECK(cudaStreamSynchronize(s));
  {
    const auto g = reference(x_h, rows, layers[0].gate, &gain_h), u = reference(x_h, rows, layers[0].up, &gain_h);
    std::vector<double> want(g.size());
    for (size_t i = 0; i < g.size(); ++i) want[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
    check("silu(gate) * up, norm folded", download_checked(mlp, rows, kInter), want);
  }
  down.launch(down.launches[0], s);
  CHECK(cudaStreamSynchronize(s));
  {
    auto want = reference(xi_h, rows, layers[0].down, nullptr);
    const auto residual = host_checked(x_h, rows, kHidden);
    for (size_t i = 0; i < want.size(); ++i) want[i] += residual[i];
    check("down + residual", download_checked(h, rows, kHidden), want);
  }
  vocab.launch(vocab.launches[0], s);
  CHECK(cudaStreamSynchronize(s));
  check("vocabulary, norm folded", download_checked(logits, rows, kVocab),
        reference(x_h, rows, head, &gain_h));

  // Batch invariance across launch shapes: each row's bits are the same
  // whatever rows of W a thread takes (decode) or rows of x a tile takes
  // (prompt), and whatever rows of x the launch has (its first three alone).
  {
    const int chosen_wide = g_wide, chosen_tile = g_tile;
    std::vector<float> first;
    bool same = true;
    const int fewer = std::min(rows, 3);
    auto run = [&](int launch_rows) {
      ProductArgs va1 = vocab.launches[0], qa = qkv.launches[0];
      va1.rows = qa.rows = launch_rows;
      vocab.launch(va1, s);
      qkv.launch(qa, s);
      CHECK(cudaStreamSynchronize(s));
      auto got = download(logits, static_cast<size_t>(fewer) * kVocab);
      const auto qs = download(q, fewer * kHeads * kHeadDim);
      got.insert(got.end(), qs.begin(), qs.end());
      if (first.empty())
        first = got;
      else
        same = same && std::memcmp(first.data(), got.data(), got.size() * sizeof(float)) == 0;
    };
    for (int shape : {1, 2}) {
      if (g_tiles)
        g_tile = shape == 1 ? kTileRowsSmall : kTileRows;
      else
        g_wide = shape == 1 ? 1 : kWide;
      run(rows);
    }
    run(fewer);
    g_wide = chosen_wide;
    g_tile = chosen_tile;
    ok = ok && same;
    std::printf("  %-28s %s\n", g_tiles ? "tiles of 32 and 64, 3 rows" : "wide 1 and 4, 3 rows",
                same ? "bit-identical ok" : "DIFFER (FAILED)");
  }

  // Timing: each kind's launches alone (30 per replay, the vocabulary 30
  // times too), then a whole step's in layer order.
  auto time_graph = [&](auto&& issue) {
    cudaGraph_t g;
    cudaGraphExec_t e;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    issue();
    CHECK(cudaStreamEndCapture(s, &g));
    CHECK(cudaGraphInstantiate(&e, g, 0));
    for (int i = 0; i < 10; ++i) CHECK(cudaGraphLaunch(e, s));
    cudaEvent_t t0, t1;
    CHECK(cudaEventCreate(&t0));
    CHECK(cudaEventCreate(&t1));
    CHECK(cudaEventRecord(t0, s));
    for (int i = 0; i < replays; ++i) CHECK(cudaGraphLaunch(e, s));
    CHECK(cudaEventRecord(t1, s));
    CHECK(cudaEventSynchronize(t1));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, t0, t1));
    CHECK(cudaGraphExecDestroy(e));
    CHECK(cudaGraphDestroy(g));
    return 1000.0 * ms / replays;  // µs a replay
  };
  std::printf("\nin-graph time per launch (%d launches a replay):\n", kLayers);
  double summed = 0;
  for (Kind* kind : {&qkv, &o, &mlp_kind, &down, &vocab}) {
    const double us = time_graph([&] {
      for (int i = 0; i < kLayers; ++i) kind->launch(kind->launches[i % kind->launches.size()], s);
    }) / kLayers;
    const int per_step = kind == &vocab ? 1 : kLayers;
    summed += us * per_step;
    std::printf("  %-28s %8.2f us  %7.1f GB/s  %6.2f TFLOPS  x%d a step = %8.1f us\n", kind->name, us,
                kind->bytes / us / 1e3, kind->flops / us / 1e6, per_step, us * per_step);
  }
  const double step = time_graph([&] {
    for (int i = 0; i < kLayers; ++i) {
      qkv.launch(qkv.launches[i], s);
      o.launch(o.launches[i], s);
      mlp_kind.launch(mlp_kind.launches[i], s);
      down.launch(down.launches[i], s);
    }
    vocab.launch(vocab.launches[0], s);
  });
  std::printf("a step's %d products in one graph: %.1f us (the kinds summed: %.1f us)\n", 4 * kLayers + 1, step,
              summed);

  // Gemma 3 270M's vocabulary projection (its tied 6-bit embedding of its
  // Q4_K_M bundle, 262144 x 640: more than the L2 cache holds), alone.
  {
    constexpr int kGemmaVocab = 262144, kGemmaHidden = 640;
    DeviceMatrix gemma(kGemmaVocab, kGemmaHidden, 6);
    const auto gemma_gain_h = normal(kGemmaHidden, 1.0f, 0.1f);
    const auto gemma_x_h = normal(static_cast<size_t>(rows) * kGemmaHidden);
    const float* gemma_gain = upload(gemma_gain_h);
    const float* gemma_x = upload(gemma_x_h);
    float* out = scratch(static_cast<size_t>(rows) * kGemmaVocab);
    auto a = args(gemma_x, rows, kGemmaHidden, kGroup, {gemma.weight(out)});
    with_norm(a, gemma_gain, kEps);
    product_launch<6>(a, s);
    CHECK(cudaStreamSynchronize(s));
    // The first x row only (the reference of 32 rows takes the host a while).
    const std::vector<float> x0(gemma_x_h.begin(), gemma_x_h.begin() + kGemmaHidden);
    check("Gemma 3 vocabulary, x row 0", download(out, kGemmaVocab), reference(x0, 1, gemma, &gemma_gain_h));
    const double us = time_graph([&] {
      for (int i = 0; i < 10; ++i) product_launch<6>(a, s);
    }) / 10;
    std::printf("Gemma 3 vocabulary (6-bit, 262144 x 640): %.2f us a launch, %.1f GB/s\n", us,
                matrix_bytes(gemma) / us / 1e3);
  }
  std::printf("%s\n", ok ? "all within bounds" : "SOME FAILED");
  return ok ? 0 : 1;
}
