// mlxcel's CUDA product kernels: x Wᵀ for affine-quantized W (MLX's layout:
// each row one little-endian bit stream of `bits`-wide codes in uint32
// words, one scale and bias per `group` inputs; 2 to 8 bits), for the few
// rows of a decode step. Part of the module kernels.cu.
//
// Shape of the work: a row of W is cut into segments of 32 inputs (one
// group of 32, or a part of a larger group), and each thread takes one
// segment of one row (several, `seg_threads` apart, when a row has more than
// kProductThreads segments): it reads the segment's `bits` code words with
// one or two 16-byte loads, its scale and bias, and the segment's 32 inputs
// of each x row, and keeps one running sum per x row. A block holds
// `rows_per_block` whole rows of W, so every load of the launch is issued at
// once, and the segments' sums are added in shared memory in segment order.
// Why not a warp per row, as before 2026-12-06: a decode step's products are
// small (a 576-wide 4-bit row is 288 bytes), so a warp striding over its row
// waited on a chain of loads per word; the step's time was load latency,
// not bandwidth (docs/cuda.md "Wider products").
//
// Wide products (docs/cuda.md "Wide products"): for each segment a thread
// reads 32 inputs (and 32 norm gains) per x row against 8 to 32 bytes of
// codes, so a vocabulary projection was bound by those L1 reads, not by
// memory. A thread of a plain product may therefore take `wide` (4) rows
// of W, loading each x segment once for all of them; the gated kernel's
// thread takes the same row of gate and up for the same reason. A block
// takes two rows of x (kRowChunk; a gated one eight when x has more), so
// a batch's rows spread over blocks rather than lengthening every thread's
// chain of loads.
//
// Arithmetic, f32 throughout: per segment, dot = Σ q_j x_j and xs = Σ x_j
// over its 32 codes; the sum adds s·dot + b·xs (the affine dequantisation
// s·q + b distributed over the segment), then the segments in order. Each x
// row's sums run over the same segments in the same order, each multiply,
// add and fused multiply-add written out (none left to the compiler to
// contract), whatever the number of rows and the launch shape they choose,
// so a row's result never depends on the rest of its batch (docs/kernels.md
// "Batch invariance"). MLX's qmv sums differently, so the two agree to f32
// rounding (tests/gpu_kernels.rs states the bound).
//
// An RMS norm prologue (fusion.h `absorb_norm`) costs no pass of its own:
// the product is linear in x, so x Wᵀ of the normed row is
// (1 / rms(x)) · Σ (x_j g_j) w_j; the threads of a block's first row, which
// read every x_j between them, also sum x_j², and the sums are scaled by
// 1 / rms at the end.
#pragma once

namespace mlxcel {

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

// MLX's sigmoid (kernels/nn_impl.h uses the same form).
__device__ __forceinline__ float sigmoid(float x) {
  const float y = 1.0f / (1.0f + expf(fabsf(x)));
  return x < 0.0f ? y : 1.0f - y;
}

__device__ __forceinline__ float gelu_tanh(float x) {
  const float inner = (x + x * x * x * 0.044715f) * 0.7978845608028654f;
  const float e = expf(fabsf(inner) * -2.0f);
  float t = (1.0f - e) / (1.0f + e);
  if (inner < 0.0f) t = -t;
  return x * 0.5f * (t + 1.0f);
}

template <int Act>
__device__ __forceinline__ float activate(float g) {
  if (Act == kActSilu) return g * sigmoid(g);
  return gelu_tanh(g);
}

// Inputs of one segment.
constexpr int kSegment = 32;

__device__ __forceinline__ bool aligned(const void* p, unsigned long long bytes) {
  return (reinterpret_cast<unsigned long long>(p) & (bytes - 1)) == 0;
}

// The bytes a segment's words may be loaded by at once: 16 when `Bits` is
// a multiple of 4, 8 when it is even, else 4 (a segment is `Bits` words).
template <int Bits>
__host__ __device__ constexpr int segment_load_bytes() {
  return Bits % 4 == 0 ? 16 : (Bits % 2 == 0 ? 8 : 4);
}

// The `Bits` code words of one segment, with 16- or 8-byte loads where the
// pointer allows (`vec`, the same for every thread of a launch).
template <int Bits>
__device__ __forceinline__ void load_words(const unsigned* p, bool vec, unsigned (&w)[Bits]) {
  if (vec) {
    if constexpr (Bits % 4 == 0) {
#pragma unroll
      for (int i = 0; i < Bits / 4; ++i) {
        const uint4 v = __ldg(reinterpret_cast<const uint4*>(p) + i);
        w[4 * i] = v.x;
        w[4 * i + 1] = v.y;
        w[4 * i + 2] = v.z;
        w[4 * i + 3] = v.w;
      }
      return;
    } else if constexpr (Bits % 2 == 0) {
#pragma unroll
      for (int i = 0; i < Bits / 2; ++i) {
        const uint2 v = __ldg(reinterpret_cast<const uint2*>(p) + i);
        w[2 * i] = v.x;
        w[2 * i + 1] = v.y;
      }
      return;
    }
  }
#pragma unroll
  for (int i = 0; i < Bits; ++i) w[i] = __ldg(p + i);
}

// Code j of a segment's bit stream (j a constant once unrolled, so the word
// and shifts are too; a code of 3, 5 or 6 bits may straddle two words).
template <int Bits>
__device__ __forceinline__ unsigned segment_code(const unsigned (&w)[Bits], int j) {
  constexpr unsigned mask = (1u << Bits) - 1u;
  const int bit = j * Bits, i = bit / 32, shift = bit % 32;
  unsigned v = w[i] >> shift;
  if (shift + Bits > 32) v |= w[i + 1] << (32 - shift);
  return v & mask;
}

// 32 consecutive floats, four at a time where `vec` says they are 16-byte
// aligned.
__device__ __forceinline__ void load_floats(const float* p, bool vec, float (&v)[kSegment]) {
  if (vec) {
#pragma unroll
    for (int i = 0; i < kSegment / 4; ++i) {
      const float4 f = __ldg(reinterpret_cast<const float4*>(p) + i);
      v[4 * i] = f.x;
      v[4 * i + 1] = f.y;
      v[4 * i + 2] = f.z;
      v[4 * i + 3] = f.w;
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < kSegment; ++i) v[i] = __ldg(p + i);
}

// Which of the launch's weights output row n belongs to.
__device__ __forceinline__ int weight_of(const ProductArgs& a, int n) {
  int i = 0;
  while (i + 1 < a.count && n >= a.first_row[i + 1]) ++i;
  return i;
}

// One row of a weight: its codes, scales and biases.
template <typename ScaleT>
struct WeightRow {
  const unsigned* codes;
  const ScaleT* scales;
  const ScaleT* biases;
};

template <int Bits, typename ScaleT>
__device__ __forceinline__ WeightRow<ScaleT> weight_row(const ProductArgs& a, const GpuWeight& w, int r) {
  const long long segments = a.k / kSegment, groups = a.k / a.group;
  return WeightRow<ScaleT>{w.codes + r * segments * Bits, static_cast<const ScaleT*>(w.scales) + r * groups,
                           static_cast<const ScaleT*>(w.biases) + r * groups};
}

// This thread's running sums of the `Wide` weight rows `w` against the
// chunk's x rows: its segments `first`, `first + step`, ... (and, with
// Squares, the x rows' sums of squares over the same segments). Each x
// segment is loaded once for all `Wide` rows. The arithmetic of one weight
// row and x row is spelled out (no contraction left to the compiler), so it
// is the same bits whatever `Wide` and `Chunk` a launch takes: a row's
// result never depends on its batch.
template <int Bits, typename ScaleT, int Wide, int Chunk, bool Squares>
__device__ __forceinline__ void segment_sums(const ProductArgs& a, const WeightRow<ScaleT> (&w)[Wide],
                                             bool vec_codes, int first, int step, int row0, int rows,
                                             float (&acc)[Wide][Chunk], float (&squares)[Chunk]) {
  const int segments = a.k / kSegment;
  const bool vec_x = aligned(a.x, 16) && (a.ldx & 3) == 0;
  const float* gain = a.norm ? a.norm_weight : nullptr;
  const bool vec_gain = gain && aligned(gain, 16);
  for (int seg = first; seg < segments; seg += step) {
    unsigned word[Wide][Bits];
    float s[Wide], b[Wide];
    const int k0 = seg * kSegment;
    const int g = k0 / a.group;
#pragma unroll
    for (int i = 0; i < Wide; ++i) {
      load_words<Bits>(w[i].codes + seg * Bits, vec_codes, word[i]);
      s[i] = to_float(w[i].scales[g]);
      b[i] = to_float(w[i].biases[g]);
    }
    float gj[kSegment];
    if (gain) {
      load_floats(gain + k0, vec_gain, gj);
    } else {
#pragma unroll
      for (int j = 0; j < kSegment; ++j) gj[j] = 1.0f;
    }
#pragma unroll
    for (int m = 0; m < Chunk; ++m) {
      if (m < rows) {
        float x[kSegment];
        load_floats(a.x + static_cast<long long>(row0 + m) * a.ldx + k0, vec_x, x);
        float xs = 0.0f, sq = 0.0f;
#pragma unroll
        for (int j = 0; j < kSegment; ++j) {
          if constexpr (Squares) sq = __fmaf_rn(x[j], x[j], sq);
          x[j] = __fmul_rn(x[j], gj[j]);
          xs = __fadd_rn(xs, x[j]);
        }
#pragma unroll
        for (int i = 0; i < Wide; ++i) {
          float dot = 0.0f;
#pragma unroll
          for (int j = 0; j < kSegment; ++j)
            dot = __fmaf_rn(static_cast<float>(segment_code<Bits>(word[i], j)), x[j], dot);
          acc[i][m] = __fadd_rn(acc[i][m], __fmaf_rn(s[i], dot, __fmul_rn(b[i], xs)));
        }
        if constexpr (Squares) squares[m] = __fadd_rn(squares[m], sq);
      }
    }
  }
}

// Where row m (of the rows x has) of weight w's output column r goes: the
// plain [rows, N] layout, or [B, heads, L, N / heads].
__device__ __forceinline__ long long out_index(const ProductArgs& a, const GpuWeight& w, int m, int r) {
  if (w.heads <= 0) return static_cast<long long>(m) * w.n + r;
  const int d = w.n / w.heads;
  const int b = m / a.seq, l = m % a.seq;
  return ((static_cast<long long>(b) * w.heads + r / d) * a.seq + l) * d + r % d;
}

// Shared sums of a block: [thread][sum], a thread's sums being its rows of
// W by its x rows (at most kWide · kRowChunk), padded so that neither the
// writes (a thread's sums) nor the reads (a row's threads) share banks.
using BlockSums = float[kProductThreads][kWide * kRowChunk + 1];

// Sum e over the segments of the block's row rl, in segment order.
__device__ __forceinline__ float row_total(const BlockSums& sums, int rl, int threads, int e) {
  float y = 0.0f;
  for (int s = 0; s < threads; ++s) y += sums[rl * threads + s][e];
  return y;
}

// 1 / rms of x row m from the squares of the block's first row's threads
// (MLX's rounding order: 1 / sqrt(Σx² · (1/k) + eps)).
__device__ __forceinline__ float inverse_rms(const ProductArgs& a, const BlockSums& squares, int m) {
  return 1.0f / sqrtf(row_total(squares, 0, a.seg_threads, m) * (1.0f / a.k) + a.norm_eps);
}

// The sums of a plain product's block with `Wide` rows of W per thread:
// each thread's [Wide][kRowChunk] sums go to its row of `sums`, the first
// block row's squares to `squares`. The grid's x picks the block of W
// rows, its y the chunk of x rows.
template <int Bits, typename ScaleT, int Wide>
__device__ __forceinline__ void product_sums(const ProductArgs& a, BlockSums& sums, BlockSums& squares) {
  const int threads = a.seg_threads;
  const int rl = threadIdx.x / threads, s = threadIdx.x % threads;
  const int n0 = (blockIdx.x * a.rows_per_block + rl) * Wide;
  const int row0 = blockIdx.y * kRowChunk;
  const int rows = min(kRowChunk, a.rows - row0);
  float acc[Wide][kRowChunk], sq[kRowChunk];
#pragma unroll
  for (int m = 0; m < kRowChunk; ++m) {
    sq[m] = 0.0f;
#pragma unroll
    for (int i = 0; i < Wide; ++i) acc[i][m] = 0.0f;
  }
  if (n0 < a.total) {
    // Rows past the end repeat the last one (their sums are not written).
    WeightRow<ScaleT> w[Wide];
    bool vec_codes = true;
#pragma unroll
    for (int i = 0; i < Wide; ++i) {
      const int n = min(n0 + i, a.total - 1);
      const int wi = weight_of(a, n);
      w[i] = weight_row<Bits, ScaleT>(a, a.w[wi], n - a.first_row[wi]);
      vec_codes = vec_codes && aligned(a.w[wi].codes, segment_load_bytes<Bits>());
    }
    segment_sums<Bits, ScaleT, Wide, kRowChunk, true>(a, w, vec_codes, s, threads, row0, rows, acc, sq);
  }
#pragma unroll
  for (int i = 0; i < Wide; ++i)
#pragma unroll
    for (int m = 0; m < kRowChunk; ++m) sums[threadIdx.x][i * kRowChunk + m] = acc[i][m];
  if (rl == 0)
#pragma unroll
    for (int m = 0; m < kRowChunk; ++m) squares[s][m] = sq[m];
}

// Plain products: outputs of every weight; a block holds
// rows_per_block · Wide rows of all of them concatenated. One kernel per
// Wide (the `a.wide` set_product_shape chose), so each takes the registers
// of its own path only (docs/cuda.md "Kernels per launch shape").
template <int Bits, typename ScaleT, int Wide>
__global__ void product(ProductArgs a) {
  __shared__ BlockSums sums, squares;
  product_sums<Bits, ScaleT, Wide>(a, sums, squares);
  __syncthreads();
  const int row0 = blockIdx.y * kRowChunk;
  const int rows = min(kRowChunk, a.rows - row0);
  const int per_row = Wide * kRowChunk;
  for (int t = threadIdx.x; t < a.rows_per_block * per_row; t += blockDim.x) {
    // Sum e of block row rt: the thread's W row e / kRowChunk, x row m.
    const int rt = t / per_row, e = t % per_row, m = e % kRowChunk;
    const int nt = (blockIdx.x * a.rows_per_block + rt) * Wide + e / kRowChunk;
    if (m >= rows || nt >= a.total) continue;
    float y = row_total(sums, rt, a.seg_threads, e);
    if (a.norm) y = __fmul_rn(y, inverse_rms(a, squares, m));
    const int wi = weight_of(a, nt);
    const GpuWeight& w = a.w[wi];
    const int r = nt - a.first_row[wi];
    if (a.residual) y = __fadd_rn(y, a.residual[static_cast<long long>(row0 + m) * w.n + r]);
    w.out[out_index(a, w, row0 + m, r)] = y;
  }
}

// The sums of a gated block with `Chunk` rows of x: each thread's gate and
// up sums go to its row of `gate` and `up`, the first block row's squares
// to `squares`.
template <int Bits, typename ScaleT, int Chunk>
__device__ __forceinline__ void gated_sums(const ProductArgs& a, BlockSums& gate, BlockSums& up,
                                           BlockSums& squares) {
  static_assert(Chunk <= kWide * kRowChunk, "a thread's sums fit a row of BlockSums");
  const int threads = a.seg_threads;
  const int rl = threadIdx.x / threads, s = threadIdx.x % threads;
  const int r = blockIdx.x * a.rows_per_block + rl;
  const int row0 = blockIdx.y * Chunk;
  const int rows = min(Chunk, a.rows - row0);
  float acc[2][Chunk], sq[Chunk];
#pragma unroll
  for (int m = 0; m < Chunk; ++m) acc[0][m] = acc[1][m] = sq[m] = 0.0f;
  if (r < a.w[0].n) {
    const WeightRow<ScaleT> w[2] = {weight_row<Bits, ScaleT>(a, a.w[0], r), weight_row<Bits, ScaleT>(a, a.w[1], r)};
    const bool vec_codes =
        aligned(a.w[0].codes, segment_load_bytes<Bits>()) && aligned(a.w[1].codes, segment_load_bytes<Bits>());
    segment_sums<Bits, ScaleT, 2, Chunk, true>(a, w, vec_codes, s, threads, row0, rows, acc, sq);
  }
#pragma unroll
  for (int m = 0; m < Chunk; ++m) {
    gate[threadIdx.x][m] = acc[0][m];
    up[threadIdx.x][m] = acc[1][m];
    if (rl == 0) squares[s][m] = sq[m];
  }
}

// act(x Gᵀ) ⊙ (x Uᵀ): weight 0 the gate, weight 1 the up projection; a
// block holds rows_per_block rows of both, each thread the same row of the
// two (sharing its loads of x), and Chunk rows of x (the `a.chunk`
// set_product_shape chose; the grid as the plain product's).
template <int Bits, typename ScaleT, int Act, int Chunk>
__global__ void gated(ProductArgs a) {
  __shared__ BlockSums gate_sums, up_sums, squares;
  gated_sums<Bits, ScaleT, Chunk>(a, gate_sums, up_sums, squares);
  __syncthreads();
  const int n = a.w[0].n;
  const int row0 = blockIdx.y * Chunk;
  const int rows = min(Chunk, a.rows - row0);
  for (int t = threadIdx.x; t < a.rows_per_block * Chunk; t += blockDim.x) {
    const int rt = t / Chunk, m = t % Chunk;
    const int nt = blockIdx.x * a.rows_per_block + rt;
    if (m >= rows || nt >= n) continue;
    float gy = row_total(gate_sums, rt, a.seg_threads, m), uy = row_total(up_sums, rt, a.seg_threads, m);
    if (a.norm) {
      const float scale = inverse_rms(a, squares, m);
      gy = __fmul_rn(gy, scale);
      uy = __fmul_rn(uy, scale);
    }
    a.w[0].out[static_cast<long long>(row0 + m) * n + nt] = __fmul_rn(activate<Act>(gy), uy);
  }
}

}  // namespace mlxcel
