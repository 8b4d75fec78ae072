// mlxcel's CUDA product kernels for prompts: x Wᵀ for affine-quantized W
// (products.cuh's layout and arguments) when x has more rows than a decode
// step (gpu.h kMaxRows), so that each weight tile is reused across many rows
// of x. Part of the module kernels.cu.
//
// Why our own: MLX's quantized matmul for f32 activations (qmm_naive) was
// 70–79% of a prompt's GPU time at about 2.3 TFLOPS, and widening the
// weights to f32 for cuBLAS cost more than it saved (docs/cuda.md "Prompts
// through cuBLAS, measured and not kept").
//
// Shape of the work: a block of kTileThreads threads computes a tile of
// TileM rows of x by kTileN rows of W (the outputs of every weight
// concatenated, as the decode kernels take them; a gated block the same
// rows of gate and up). It walks the inputs a segment of 32 at a time: the
// segment's x tile and W tile are dequantized into shared memory (k-major,
// so each thread reads its few rows of x and of W as float4s), and each
// thread adds the 32 products into its TileM / 8 by 4 outputs. The next
// segment's loads are issued before the current segment is multiplied, so
// their latency hides behind the arithmetic.
//
// Arithmetic, f32 throughout: a weight is dequantized as s·q + b (one
// fused multiply-add), x scaled by the norm's gain when a norm is folded in,
// and each output sums x_k w_k over k in order with fused multiply-adds;
// the rest (1 / rms, residual, activation) as the decode kernels do. The
// order of every sum, the norm's squares included (kSquareRun), depends on
// neither the tile shape nor the other rows, so a row's result does not
// depend on its batch; it differs from the decode kernels' (which sum
// s·Σq x + b·Σx per segment) by f32 rounding.
#pragma once

namespace mlxcel {

// A thread's share of a tile's segment: the x row it loads (and the part of
// its 32 inputs), and the W row (and half of its 32 codes).
struct TileLoad {
  int x_row, x_part;
  int w_row, w_half;
};

template <int TileM>
__device__ __forceinline__ TileLoad tile_load() {
  const int t = threadIdx.x;
  return TileLoad{t % TileM, t / TileM, t % kTileN, t / kTileN};
}

// Inputs of x one thread loads per segment.
template <int TileM>
__host__ __device__ constexpr int x_per_thread() {
  return TileM * kSegment / kTileThreads;
}

// One weight's codes (its segment's `Bits` words), scale and bias for the
// W row this thread dequantizes, as loaded for the next segment.
template <int Bits>
struct StagedCodes {
  unsigned word[Bits];
  float s, b;
};

// One segment's x inputs of this thread (raw, for the squares of the norm).
template <int TileM>
struct StagedX {
  float v[x_per_thread<TileM>()];
};

template <int Bits, typename ScaleT>
__device__ __forceinline__ void stage_codes(const ProductArgs& a, const WeightRow<ScaleT>& w, bool vec, int seg,
                                            StagedCodes<Bits>& out) {
  load_words<Bits>(w.codes + static_cast<long long>(seg) * Bits, vec, out.word);
  const int g = seg * kSegment / a.group;
  out.s = to_float(w.scales[g]);
  out.b = to_float(w.biases[g]);
}

template <int TileM>
__device__ __forceinline__ void stage_x(const ProductArgs& a, const TileLoad& l, int row0, bool vec, int seg,
                                        StagedX<TileM>& out) {
  constexpr int per = x_per_thread<TileM>();
  const int m = row0 + l.x_row;
  if (m >= a.rows) {
#pragma unroll
    for (int j = 0; j < per; ++j) out.v[j] = 0.0f;
    return;
  }
  const float* p = a.x + static_cast<long long>(m) * a.ldx + seg * kSegment + l.x_part * per;
  if (vec) {
#pragma unroll
    for (int j = 0; j < per / 4; ++j) {
      const float4 f = __ldg(reinterpret_cast<const float4*>(p) + j);
      out.v[4 * j] = f.x;
      out.v[4 * j + 1] = f.y;
      out.v[4 * j + 2] = f.z;
      out.v[4 * j + 3] = f.w;
    }
  } else {
#pragma unroll
    for (int j = 0; j < per; ++j) out.v[j] = __ldg(p + j);
  }
}

// Writes this thread's half of a W row's segment, dequantized, into the
// k-major tile `ws` (column w_row). `Half` is the thread's w_half, a
// constant so that every code's word and shift are too.
template <int Bits, int Half>
__device__ __forceinline__ void store_codes(const StagedCodes<Bits>& c, int col, float (*ws)[kTileN]) {
  constexpr int per = kSegment / 2;
#pragma unroll
  for (int j = 0; j < per; ++j) {
    const float q = static_cast<float>(segment_code<Bits>(c.word, Half * per + j));
    ws[Half * per + j][col] = __fmaf_rn(c.s, q, c.b);
  }
}

template <int Bits>
__device__ __forceinline__ void store_codes(const StagedCodes<Bits>& c, const TileLoad& l, float (*ws)[kTileN]) {
  if (l.w_half == 0)
    store_codes<Bits, 0>(c, l.w_row, ws);
  else
    store_codes<Bits, 1>(c, l.w_row, ws);
}

// The norm's sums of squares are kept per run of kSquareRun inputs of each
// segment (kSegment / kSquareRun sums a row, each over the same inputs in
// the same order whatever the tile), so that 1 / rms, and with it a row's
// outputs, do not depend on how many rows of x a tile takes.
constexpr int kSquareRun = 8;

// Writes this thread's x inputs into the k-major tile `xs` (times the norm's
// gain when there is one), adding their squares to its runs' `squares`.
template <int TileM>
__device__ __forceinline__ void store_x(const ProductArgs& a, const TileLoad& l, int seg, const StagedX<TileM>& x,
                                        float (*xs)[TileM], float (&squares)[x_per_thread<TileM>() / kSquareRun]) {
  constexpr int per = x_per_thread<TileM>();
  const int k0 = l.x_part * per;
  const float* gain = a.norm && a.norm_weight ? a.norm_weight + seg * kSegment + k0 : nullptr;
#pragma unroll
  for (int j = 0; j < per; ++j) {
    squares[j / kSquareRun] = __fmaf_rn(x.v[j], x.v[j], squares[j / kSquareRun]);
    xs[k0 + j][l.x_row] = gain ? __fmul_rn(x.v[j], __ldg(gain + j)) : x.v[j];
  }
}

// The shared memory of a tile: x and each weight's W for one segment,
// k-major; then the rows' sums of squares (one per run of kSquareRun
// inputs of a segment) and their 1 / rms.
template <int TileM, int Weights>
struct TileShared {
  __align__(16) float x[kSegment][TileM];
  __align__(16) float w[Weights][kSegment][kTileN];
  float squares[kSegment / kSquareRun][TileM];
  float inverse_rms[TileM];
};

// Adds one segment's products to a thread's outputs: its TileM / 8 rows of
// x (from `xm`) by 4 rows of W (from `wn`) of each of `Weights` tiles.
template <int TileM, int Weights>
__device__ __forceinline__ void multiply_tile(const TileShared<TileM, Weights>& sh, int xm, int wn,
                                              float (&acc)[Weights][TileM / 8][4]) {
  constexpr int rows = TileM / 8;
#pragma unroll 8
  for (int k = 0; k < kSegment; ++k) {
    float xv[rows];
#pragma unroll
    for (int i = 0; i < rows; i += 4) {
      const float4 f = *reinterpret_cast<const float4*>(&sh.x[k][xm + i]);
      xv[i] = f.x;
      xv[i + 1] = f.y;
      xv[i + 2] = f.z;
      xv[i + 3] = f.w;
    }
#pragma unroll
    for (int w = 0; w < Weights; ++w) {
      const float4 f = *reinterpret_cast<const float4*>(&sh.w[w][k][wn]);
      const float wv[4] = {f.x, f.y, f.z, f.w};
#pragma unroll
      for (int i = 0; i < rows; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[w][i][j] = __fmaf_rn(xv[i], wv[j], acc[w][i][j]);
    }
  }
}

// The sums of a block's tile: `acc[w][i][j]` is x row xm + i against row
// wn + j of the tile's W rows (of weight tile w: the plain product's one,
// or gate and up). `rows_w[w]` is the W row this thread loads of each.
template <int Bits, typename ScaleT, int TileM, int Weights>
__device__ __forceinline__ void tile_sums(const ProductArgs& a, const WeightRow<ScaleT> (&rows_w)[Weights], bool vec_codes,
                                          TileShared<TileM, Weights>& sh, int xm, int wn,
                                          float (&acc)[Weights][TileM / 8][4]) {
  const TileLoad l = tile_load<TileM>();
  const int row0 = blockIdx.y * TileM;
  const int segments = a.k / kSegment;
  constexpr int per = x_per_thread<TileM>();
  const bool vec_x = aligned(a.x, 16) && (a.ldx & 3) == 0 && per % 4 == 0;
  StagedX<TileM> x;
  StagedCodes<Bits> c[Weights];
  float squares[per / kSquareRun] = {};
  stage_x<TileM>(a, l, row0, vec_x, 0, x);
#pragma unroll
  for (int w = 0; w < Weights; ++w) stage_codes<Bits, ScaleT>(a, rows_w[w], vec_codes, 0, c[w]);
  for (int seg = 0; seg < segments; ++seg) {
    store_x<TileM>(a, l, seg, x, sh.x, squares);
#pragma unroll
    for (int w = 0; w < Weights; ++w) store_codes<Bits>(c[w], l, sh.w[w]);
    __syncthreads();
    if (seg + 1 < segments) {
      stage_x<TileM>(a, l, row0, vec_x, seg + 1, x);
#pragma unroll
      for (int w = 0; w < Weights; ++w) stage_codes<Bits, ScaleT>(a, rows_w[w], vec_codes, seg + 1, c[w]);
    }
    multiply_tile<TileM, Weights>(sh, xm, wn, acc);
    __syncthreads();
  }
  if (a.norm) {
#pragma unroll
    for (int i = 0; i < per / kSquareRun; ++i) sh.squares[l.x_part * (per / kSquareRun) + i][l.x_row] = squares[i];
    __syncthreads();
    if (threadIdx.x < TileM) {
      float total = 0.0f;
#pragma unroll
      for (int r = 0; r < kSegment / kSquareRun; ++r) total = __fadd_rn(total, sh.squares[r][threadIdx.x]);
      sh.inverse_rms[threadIdx.x] = 1.0f / sqrtf(total * (1.0f / a.k) + a.norm_eps);
    }
    __syncthreads();
  }
}

// Where a thread's outputs lie in the tile: x rows xm.. (TileM / 8 of
// them), W rows wn.. (4).
template <int TileM>
__device__ __forceinline__ void tile_position(int& xm, int& wn) {
  xm = (threadIdx.x / (kTileN / 4)) * (TileM / 8);
  wn = (threadIdx.x % (kTileN / 4)) * 4;
}

// Plain prompt products: outputs of every weight, a block a tile of TileM
// rows of x by kTileN of the weights' rows concatenated (grid: x the W
// tiles, y the x tiles; set_prompt_shape).
template <int Bits, typename ScaleT, int TileM>
__global__ void __launch_bounds__(kTileThreads) prompt_product(ProductArgs a) {
  __shared__ TileShared<TileM, 1> sh;
  const TileLoad l = tile_load<TileM>();
  // The W row this thread loads (rows past the end repeat the last one;
  // their outputs are not written).
  const int n_load = min(static_cast<int>(blockIdx.x) * kTileN + l.w_row, a.total - 1);
  const int wi = weight_of(a, n_load);
  const WeightRow<ScaleT> rows_w[1] = {weight_row<Bits, ScaleT>(a, a.w[wi], n_load - a.first_row[wi])};
  bool vec_codes = true;
  for (int i = 0; i < a.count; ++i) vec_codes = vec_codes && aligned(a.w[i].codes, segment_load_bytes<Bits>());
  int xm, wn;
  tile_position<TileM>(xm, wn);
  float acc[1][TileM / 8][4] = {};
  tile_sums<Bits, ScaleT, TileM, 1>(a, rows_w, vec_codes, sh, xm, wn, acc);
  const int row0 = blockIdx.y * TileM;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int n = blockIdx.x * kTileN + wn + j;
    if (n >= a.total) continue;
    const int wj = weight_of(a, n);
    const GpuWeight& w = a.w[wj];
    const int r = n - a.first_row[wj];
#pragma unroll
    for (int i = 0; i < TileM / 8; ++i) {
      const int m = row0 + xm + i;
      if (m >= a.rows) continue;
      float y = acc[0][i][j];
      if (a.norm) y = __fmul_rn(y, sh.inverse_rms[xm + i]);
      if (a.residual) y = __fadd_rn(y, a.residual[static_cast<long long>(m) * w.n + r]);
      w.out[out_index(a, w, m, r)] = y;
    }
  }
}

// Gated prompt products: act(x Gᵀ) ⊙ (x Uᵀ), weight 0 the gate and weight
// 1 the up projection, a block the same kTileN rows of both (the grid as
// the plain product's over the gate's rows).
template <int Bits, typename ScaleT, int Act, int TileM>
__global__ void __launch_bounds__(kTileThreads) prompt_gated(ProductArgs a) {
  __shared__ TileShared<TileM, 2> sh;
  const TileLoad l = tile_load<TileM>();
  const int n_out = a.w[0].n;
  const int r_load = min(static_cast<int>(blockIdx.x) * kTileN + l.w_row, n_out - 1);
  const WeightRow<ScaleT> rows_w[2] = {weight_row<Bits, ScaleT>(a, a.w[0], r_load),
                                       weight_row<Bits, ScaleT>(a, a.w[1], r_load)};
  const bool vec_codes =
      aligned(a.w[0].codes, segment_load_bytes<Bits>()) && aligned(a.w[1].codes, segment_load_bytes<Bits>());
  int xm, wn;
  tile_position<TileM>(xm, wn);
  float acc[2][TileM / 8][4] = {};
  tile_sums<Bits, ScaleT, TileM, 2>(a, rows_w, vec_codes, sh, xm, wn, acc);
  const int row0 = blockIdx.y * TileM;
#pragma unroll
  for (int i = 0; i < TileM / 8; ++i) {
    const int m = row0 + xm + i;
    if (m >= a.rows) continue;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int n = blockIdx.x * kTileN + wn + j;
      if (n >= n_out) continue;
      float gy = acc[0][i][j], uy = acc[1][i][j];
      if (a.norm) {
        const float scale = sh.inverse_rms[xm + i];
        gy = __fmul_rn(gy, scale);
        uy = __fmul_rn(uy, scale);
      }
      a.w[0].out[static_cast<long long>(m) * n_out + n] = __fmul_rn(activate<Act>(gy), uy);
    }
  }
}

}  // namespace mlxcel
