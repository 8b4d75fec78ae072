// mlxcel's CUDA product kernels: x Wᵀ for affine-quantized W (MLX's layout:
// `bits`-wide codes packed little-end first into uint32 words, one scale and
// bias per `group` inputs), for the few rows of a decode step. Part of the
// module kernels.cu.
//
// Shape of the work: one warp per output row n of the (up to 8) weights
// concatenated; its lanes stride over the row's code words, so a warp reads
// its row's codes once, coalesced, and applies them to up to kRowChunk rows
// of x held in registers as running sums. blockIdx.y picks the chunk of x's
// rows. Each x row's sum runs over the same words in the same order
// whatever the number of rows, so a row's result never depends on the rest
// of its batch (docs/kernels.md "Batch invariance").
//
// Arithmetic, f32 throughout: per word, dot = Σ q_j x_j and xs = Σ x_j over
// its codes; the row sums s·dot + b·xs (the affine dequantisation
// s·q + b distributed over the word). MLX's qmv sums differently, so the
// two agree to f32 rounding (tests/gpu_kernels.rs states the bound).
//
// An RMS norm prologue (fusion.h `absorb_norm`) costs no pass of its own:
// the product is linear in x, so x Wᵀ of the normed row is
// (1 / rms(x)) · Σ (x_j g_j) w_j; each warp, reading every x_j of its rows
// anyway, also sums x_j² and scales its sums by 1 / rms at the end.
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

// The running sums of one weight row against the chunk's x rows (normed
// first when the launch has a norm prologue).
template <int Bits, typename ScaleT>
__device__ __forceinline__ void row_sums(const ProductArgs& a, const GpuWeight& w, int r, int row0, int rows,
                                         float acc[kRowChunk]) {
  constexpr int per_word = 32 / Bits;
  constexpr unsigned mask = (1u << Bits) - 1u;
  const int lane = threadIdx.x & 31;
  const int words = a.k / per_word;
  const int groups = a.k / a.group;
  const unsigned* codes = w.codes + static_cast<long long>(r) * words;
  const ScaleT* scales = static_cast<const ScaleT*>(w.scales) + static_cast<long long>(r) * groups;
  const ScaleT* biases = static_cast<const ScaleT*>(w.biases) + static_cast<long long>(r) * groups;
  const float* gain = a.norm ? a.norm_weight : nullptr;
  float squares[kRowChunk];
#pragma unroll
  for (int m = 0; m < kRowChunk; ++m) squares[m] = 0.0f;
  for (int i = lane; i < words; i += 32) {
    const unsigned word = __ldg(codes + i);
    const int k0 = i * per_word;
    const int g = k0 / a.group;
    const float s = to_float(scales[g]);
    const float b = to_float(biases[g]);
    float gj[per_word];
#pragma unroll
    for (int j = 0; j < per_word; ++j) gj[j] = gain ? __ldg(gain + k0 + j) : 1.0f;
#pragma unroll
    for (int m = 0; m < kRowChunk; ++m) {
      if (m < rows) {
        const float* x = a.x + static_cast<long long>(row0 + m) * a.ldx + k0;
        float dot = 0.0f, xs = 0.0f, sq = 0.0f;
#pragma unroll
        for (int j = 0; j < per_word; ++j) {
          const float raw = __ldg(x + j);
          sq += raw * raw;
          const float xj = raw * gj[j];
          dot += static_cast<float>((word >> (Bits * j)) & mask) * xj;
          xs += xj;
        }
        acc[m] += s * dot + b * xs;
        squares[m] += sq;
      }
    }
  }
#pragma unroll
  for (int m = 0; m < kRowChunk; ++m) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) acc[m] += __shfl_xor_sync(0xffffffffu, acc[m], o);
  }
  if (!a.norm) return;
#pragma unroll
  for (int m = 0; m < kRowChunk; ++m) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) squares[m] += __shfl_xor_sync(0xffffffffu, squares[m], o);
    // MLX's rounding order: 1 / sqrt(Σx² · (1/k) + eps).
    acc[m] *= 1.0f / sqrtf(squares[m] * (1.0f / a.k) + a.norm_eps);
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

// Plain products: outputs of every weight, each row n one warp.
template <int Bits, typename ScaleT>
__global__ void product(ProductArgs a) {
  const int n = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (n >= a.total) return;
  int i = 0;
  while (i + 1 < a.count && n >= a.first_row[i + 1]) ++i;
  const GpuWeight& w = a.w[i];
  const int r = n - a.first_row[i];
  const int row0 = blockIdx.y * kRowChunk;
  const int rows = min(kRowChunk, a.rows - row0);
  float acc[kRowChunk];
#pragma unroll
  for (int m = 0; m < kRowChunk; ++m) acc[m] = 0.0f;
  row_sums<Bits, ScaleT>(a, w, r, row0, rows, acc);
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int m = 0; m < kRowChunk; ++m) {
    if (m == lane && m < rows) {
      float y = acc[m];
      if (a.residual) y += a.residual[static_cast<long long>(row0 + m) * w.n + r];
      w.out[out_index(a, w, row0 + m, r)] = y;
    }
  }
}

// act(x Gᵀ) ⊙ (x Uᵀ): weight 0 the gate, weight 1 the up projection.
template <int Bits, typename ScaleT, int Act>
__global__ void gated(ProductArgs a) {
  const int r = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (r >= a.w[0].n) return;
  const int row0 = blockIdx.y * kRowChunk;
  const int rows = min(kRowChunk, a.rows - row0);
  float g[kRowChunk], u[kRowChunk];
#pragma unroll
  for (int m = 0; m < kRowChunk; ++m) g[m] = u[m] = 0.0f;
  row_sums<Bits, ScaleT>(a, a.w[0], r, row0, rows, g);
  row_sums<Bits, ScaleT>(a, a.w[1], r, row0, rows, u);
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int m = 0; m < kRowChunk; ++m) {
    if (m == lane && m < rows) a.w[0].out[static_cast<long long>(row0 + m) * a.w[0].n + r] = activate<Act>(g[m]) * u[m];
  }
}

}  // namespace mlxcel
