// A decode step's attention over each sequence's KV cache, one launch: the
// step's keys rotated (RoPE) and written with its values into the cache
// buffers, each query rotated and attended over its visible positions,
// heads merged as it writes. What the CPU's CachedAttention node does
// (cpp/nodes/attention.h); part of the module kernels.cu.
//
// Arithmetic, f32: RoPE as the CPU node computes it (inverse frequencies
// exp(-i·ln(base)/half) or 1/freqs, angle (pos·scale)·inv, cosf/sinf);
// attention with a running maximum and sum per warp (each warp over every
// eighth position), the warps combined at the end, so any number of
// positions fits. A sequence's result depends on its own buffers only.
#pragma once

namespace mlxcel {

// -inf (NVRTC compiles without the C library's INFINITY).
__device__ __forceinline__ float negative_infinity() { return __int_as_float(0xff800000); }

// y = RoPE(x) at position `pos` for the D values of one head, threads
// `tid`, `tid + step`, ... sharing the work.
__device__ __forceinline__ void rope_head(const AttentionArgs& a, const float* x, float* y, int pos, int tid,
                                          int step) {
  const int half = a.rope_dims / 2;
  const float c = logf(a.rope_base) / static_cast<float>(half);
  const float p = static_cast<float>(pos) * a.rope_scale;
  for (int j = tid; j < half; j += step) {
    const float inv = a.freqs ? 1.0f / a.freqs[j] : expf(static_cast<float>(-j) * c);
    const float theta = p * inv;
    const float cs = cosf(theta), sn = sinf(theta);
    const int i1 = a.rope_traditional ? 2 * j : j;
    const int i2 = a.rope_traditional ? 2 * j + 1 : j + half;
    const float x1 = x[i1], x2 = x[i2];
    y[i1] = x1 * cs - x2 * sn;
    y[i2] = x1 * sn + x2 * cs;
  }
  for (int d = a.rope_dims + tid; d < a.dim; d += step) y[d] = x[d];
}

// Row b of the step: its buffers, and its positions from device memory when
// a replayed step graph supplies them.
__device__ __forceinline__ CacheRowArgs step_row(const AttentionArgs& a, int b) {
  CacheRowArgs row = a.rows[b];
  if (a.positions) {
    const StepPositions p = a.positions[b];
    row.offset = p.offset;
    row.slot = p.slot;
    row.visible = p.visible;
    row.causal = p.causal;
  }
  return row;
}

// Grid (H, L, B): query l of head h of sequence b. The step's own keys
// (buffer positions slot .. slot + L - 1) are rotated by every block that
// attends over them, from k itself, so no block waits on another's cache
// write; the blocks of each kv group's first head write them, with the
// values, into the cache for the next steps. One launch instead of a RoPE
// and cache-write kernel followed by the attention (docs/cuda.md "Wider
// products"), with the same values: the rotation is the same function of
// the same inputs, so the keys attended over are the bits the cache holds.
__global__ void cached_attention(AttentionArgs a) {
  __shared__ float qs[kMaxHeadDim];
  __shared__ float fresh[kMaxAttentionPositions][kMaxHeadDim];
  __shared__ float warp_max[kAttentionWarps], warp_sum[kAttentionWarps];
  __shared__ float warp_acc[kAttentionWarps][kMaxHeadDim];
  const int h = blockIdx.x, l = blockIdx.y, b = blockIdx.z;
  const CacheRowArgs row = step_row(a, b);
  const int group = a.heads / a.kv_heads;
  const int kvh = h / group;
  const long long qrow = (static_cast<long long>(b) * a.heads + h) * a.seq + l;
  rope_head(a, a.q + qrow * a.dim, qs, row.offset + l, threadIdx.x, blockDim.x);
  const long long first_new = (static_cast<long long>(b) * a.kv_heads + kvh) * a.seq;
  for (int j = 0; j < a.seq; ++j)
    rope_head(a, a.k + (first_new + j) * a.dim, fresh[j], row.offset + j, threadIdx.x, blockDim.x);
  __syncthreads();
  if (h % group == 0) {
    // Position l of this kv head into the cache buffers.
    const long long at = static_cast<long long>(kvh) * row.capacity + row.slot + l;
    float* kc = row.keys + at * a.dim;
    for (int d = threadIdx.x; d < a.dim; d += blockDim.x) kc[d] = fresh[l][d];
    const float* v = a.v + (first_new + l) * a.vdim;
    float* vc = row.values + at * a.vdim;
    for (int d = threadIdx.x; d < a.vdim; d += blockDim.x) vc[d] = v[d];
  }
  const float* keys = row.keys + static_cast<long long>(kvh) * row.capacity * a.dim;
  const float* values = row.values + static_cast<long long>(kvh) * row.capacity * a.vdim;
  const int n = row.causal ? row.visible - a.seq + l + 1 : row.visible;
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  constexpr int per_lane = kMaxHeadDim / 32;
  float m = negative_infinity(), s = 0.0f, acc[per_lane];
#pragma unroll
  for (int i = 0; i < per_lane; ++i) acc[i] = 0.0f;
  for (int p = warp; p < n; p += kAttentionWarps) {
    // This step's positions from the block's own copies, the rest from
    // the cache.
    const unsigned j = static_cast<unsigned>(p - row.slot);
    const bool is_new = j < static_cast<unsigned>(a.seq);
    const float* k = is_new ? fresh[j] : keys + static_cast<long long>(p) * a.dim;
    float dot = 0.0f;
    for (int d = lane; d < a.dim; d += 32) dot += qs[d] * k[d];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    const float score = dot * a.scale;
    const float mx = fmaxf(m, score);
    const float correction = expf(m - mx);
    const float e = expf(score - mx);
    s = s * correction + e;
    const float* v = is_new ? a.v + (first_new + j) * a.vdim : values + static_cast<long long>(p) * a.vdim;
#pragma unroll
    for (int i = 0; i < per_lane; ++i) {
      const int d = lane + 32 * i;
      if (d < a.vdim) acc[i] = acc[i] * correction + e * v[d];
    }
    m = mx;
  }
  if (lane == 0) {
    warp_max[warp] = m;
    warp_sum[warp] = s;
  }
#pragma unroll
  for (int i = 0; i < per_lane; ++i) {
    const int d = lane + 32 * i;
    if (d < a.vdim) warp_acc[warp][d] = acc[i];
  }
  __syncthreads();
  float top = negative_infinity();
#pragma unroll
  for (int w = 0; w < kAttentionWarps; ++w) top = fmaxf(top, warp_max[w]);
  float* out = a.out + ((static_cast<long long>(b) * a.seq + l) * a.heads + h) * a.vdim;
  for (int d = threadIdx.x; d < a.vdim; d += blockDim.x) {
    float total = 0.0f, o = 0.0f;
#pragma unroll
    for (int w = 0; w < kAttentionWarps; ++w) {
      const float f = warp_max[w] == negative_infinity() ? 0.0f : expf(warp_max[w] - top);
      total += warp_sum[w] * f;
      o += warp_acc[w][d] * f;
    }
    out[d] = o / total;
  }
}

// dst[i] = src[i] for a cache buffer that could not be written in place.
__global__ void copy_floats(const float* src, float* dst, long long n) {
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<long long>(gridDim.x) * blockDim.x)
    dst[i] = src[i];
}

}  // namespace mlxcel
