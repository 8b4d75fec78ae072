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
// Arithmetic, f32 throughout: per segment, dot = Σ q_j x_j and xs = Σ x_j
// over its 32 codes; the sum adds s·dot + b·xs (the affine dequantisation
// s·q + b distributed over the segment), then the segments in order. Each x
// row's sums run over the same segments in the same order whatever the
// number of rows, so a row's result never depends on the rest of its batch
// (docs/kernels.md "Batch invariance"). MLX's qmv sums differently, so the
// two agree to f32 rounding (tests/gpu_kernels.rs states the bound).
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

// This thread's running sums of weight w's row r against the chunk's x
// rows: its segments `first`, `first + step`, ... (and, with Squares, the
// x rows' sums of squares over the same segments).
template <int Bits, typename ScaleT, bool Squares>
__device__ __forceinline__ void segment_sums(const ProductArgs& a, const GpuWeight& w, int r, int first, int step,
                                             int row0, int rows, float (&acc)[kRowChunk],
                                             float (&squares)[kRowChunk]) {
  const int segments = a.k / kSegment;
  const int groups = a.k / a.group;
  const unsigned* codes = w.codes + static_cast<long long>(r) * segments * Bits;
  const ScaleT* scales = static_cast<const ScaleT*>(w.scales) + static_cast<long long>(r) * groups;
  const ScaleT* biases = static_cast<const ScaleT*>(w.biases) + static_cast<long long>(r) * groups;
  const bool vec_codes = aligned(w.codes, segment_load_bytes<Bits>());
  const bool vec_x = aligned(a.x, 16) && (a.ldx & 3) == 0;
  const float* gain = a.norm ? a.norm_weight : nullptr;
  const bool vec_gain = gain && aligned(gain, 16);
  for (int seg = first; seg < segments; seg += step) {
    unsigned word[Bits];
    load_words<Bits>(codes + seg * Bits, vec_codes, word);
    const int k0 = seg * kSegment;
    const int g = k0 / a.group;
    const float s = to_float(scales[g]);
    const float b = to_float(biases[g]);
    float gj[kSegment];
    if (gain) {
      load_floats(gain + k0, vec_gain, gj);
    } else {
#pragma unroll
      for (int j = 0; j < kSegment; ++j) gj[j] = 1.0f;
    }
#pragma unroll
    for (int m = 0; m < kRowChunk; ++m) {
      if (m < rows) {
        float x[kSegment];
        load_floats(a.x + static_cast<long long>(row0 + m) * a.ldx + k0, vec_x, x);
        float dot = 0.0f, xs = 0.0f, sq = 0.0f;
#pragma unroll
        for (int j = 0; j < kSegment; ++j) {
          if constexpr (Squares) sq += x[j] * x[j];
          const float xj = x[j] * gj[j];
          dot += static_cast<float>(segment_code<Bits>(word, j)) * xj;
          xs += xj;
        }
        acc[m] += s * dot + b * xs;
        if constexpr (Squares) squares[m] += sq;
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

// Shared sums of a block: [thread][x row], padded so that neither the
// writes (a thread's rows) nor the reads (a row's threads) share banks.
using BlockSums = float[kProductThreads][kRowChunk + 1];

// x row m's sum over the segments of the block's row rl, in segment order.
__device__ __forceinline__ float row_total(const BlockSums& sums, int rl, int threads, int m) {
  float y = 0.0f;
  for (int s = 0; s < threads; ++s) y += sums[rl * threads + s][m];
  return y;
}

// 1 / rms of x row m from the squares of the block's first row's threads
// (MLX's rounding order: 1 / sqrt(Σx² · (1/k) + eps)).
__device__ __forceinline__ float inverse_rms(const ProductArgs& a, const BlockSums& squares, int m) {
  return 1.0f / sqrtf(row_total(squares, 0, a.seg_threads, m) * (1.0f / a.k) + a.norm_eps);
}

// Plain products: outputs of every weight; a block holds rows_per_block
// rows of all of them concatenated.
template <int Bits, typename ScaleT>
__global__ void product(ProductArgs a) {
  __shared__ BlockSums sums, squares;
  const int threads = a.seg_threads;
  const int rl = threadIdx.x / threads, s = threadIdx.x % threads;
  const int n = blockIdx.x * a.rows_per_block + rl;
  const int row0 = blockIdx.y * kRowChunk;
  const int rows = min(kRowChunk, a.rows - row0);
  float acc[kRowChunk], sq[kRowChunk];
#pragma unroll
  for (int m = 0; m < kRowChunk; ++m) acc[m] = sq[m] = 0.0f;
  if (n < a.total) {
    const int i = weight_of(a, n);
    segment_sums<Bits, ScaleT, true>(a, a.w[i], n - a.first_row[i], s, threads, row0, rows, acc, sq);
  }
#pragma unroll
  for (int m = 0; m < kRowChunk; ++m) {
    sums[threadIdx.x][m] = acc[m];
    if (rl == 0) squares[s][m] = sq[m];
  }
  __syncthreads();
  for (int t = threadIdx.x; t < a.rows_per_block * kRowChunk; t += blockDim.x) {
    const int rt = t / kRowChunk, m = t % kRowChunk;
    const int nt = blockIdx.x * a.rows_per_block + rt;
    if (m >= rows || nt >= a.total) continue;
    float y = row_total(sums, rt, threads, m);
    if (a.norm) y *= inverse_rms(a, squares, m);
    const int i = weight_of(a, nt);
    const GpuWeight& w = a.w[i];
    const int r = nt - a.first_row[i];
    if (a.residual) y += a.residual[static_cast<long long>(row0 + m) * w.n + r];
    w.out[out_index(a, w, row0 + m, r)] = y;
  }
}

// act(x Gᵀ) ⊙ (x Uᵀ): weight 0 the gate, weight 1 the up projection; a
// block holds rows_per_block rows of both.
template <int Bits, typename ScaleT, int Act>
__global__ void gated(ProductArgs a) {
  __shared__ BlockSums gate_sums, up_sums, squares;
  const int threads = a.seg_threads;
  const int rl = threadIdx.x / threads, s = threadIdx.x % threads;
  const int n = a.w[0].n;
  const int r = blockIdx.x * a.rows_per_block + rl;
  const int row0 = blockIdx.y * kRowChunk;
  const int rows = min(kRowChunk, a.rows - row0);
  float g[kRowChunk], u[kRowChunk], sq[kRowChunk], unused[kRowChunk];
#pragma unroll
  for (int m = 0; m < kRowChunk; ++m) g[m] = u[m] = sq[m] = 0.0f;
  if (r < n) {
    segment_sums<Bits, ScaleT, true>(a, a.w[0], r, s, threads, row0, rows, g, sq);
    segment_sums<Bits, ScaleT, false>(a, a.w[1], r, s, threads, row0, rows, u, unused);
  }
#pragma unroll
  for (int m = 0; m < kRowChunk; ++m) {
    gate_sums[threadIdx.x][m] = g[m];
    up_sums[threadIdx.x][m] = u[m];
    if (rl == 0) squares[s][m] = sq[m];
  }
  __syncthreads();
  for (int t = threadIdx.x; t < a.rows_per_block * kRowChunk; t += blockDim.x) {
    const int rt = t / kRowChunk, m = t % kRowChunk;
    const int nt = blockIdx.x * a.rows_per_block + rt;
    if (m >= rows || nt >= n) continue;
    float gy = row_total(gate_sums, rt, threads, m), uy = row_total(up_sums, rt, threads, m);
    if (a.norm) {
      const float scale = inverse_rms(a, squares, m);
      gy *= scale;
      uy *= scale;
    }
    a.w[0].out[static_cast<long long>(row0 + m) * n + nt] = activate<Act>(gy) * uy;
  }
}

}  // namespace mlxcel
