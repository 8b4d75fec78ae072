// A CPU stand-in for the few CUDA features mlxcel's kernels use
// (mlx-kernels/cuda/), so that their indexing, tiling and arithmetic can be
// checked without a GPU: each block's threads run as std::threads, a
// `__shared__` variable is a static (blocks run one after another), and
// __syncthreads is a barrier of the block. Checks logic and rounding order
// only (the intrinsics round as the GPU's do), never speed.
// Used by decode_emulate.cc and prompt_emulate.cc (make cuda-check).
#pragma once

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

using std::max;
using std::min;

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
};
inline thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;
// The barrier of the block this thread runs in (launch).
inline thread_local std::barrier<>* tl_barrier = nullptr;
inline void __syncthreads() { tl_barrier->arrive_and_wait(); }

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __shared__ static
#define __align__(n) alignas(n)

struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
struct alignas(8) uint2 {
  unsigned x, y;
};

template <class T>
inline T __ldg(const T* p) {
  return *p;
}
// The GPU's intrinsics round once each, as these do (volatile keeps the
// host compiler from contracting a multiply and an add into one rounding).
inline float __fmaf_rn(float a, float b, float c) { return std::fmaf(a, b, c); }
inline float __fmul_rn(float a, float b) {
  volatile float r = a * b;
  return r;
}
inline float __fadd_rn(float a, float b) {
  volatile float r = a + b;
  return r;
}

// Half and bfloat16 scales: their bits, and the exact conversion to f32.
struct __half {
  uint16_t bits;
};
struct __nv_bfloat16 {
  uint16_t bits;
};
inline float __bfloat162float(__nv_bfloat16 h) {
  const uint32_t u = uint32_t(h.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float __half2float(__half h) {
  const uint32_t sign = (h.bits >> 15) & 1, e = (h.bits >> 10) & 31, m = h.bits & 1023;
  float v;
  if (e == 0)
    v = std::ldexp(float(m), -24);
  else if (e == 31)
    v = m ? NAN : INFINITY;
  else
    v = std::ldexp(float(m + 1024), int(e) - 25);
  return sign ? -v : v;
}

// Runs `kernel` over a gx × gy grid of `threads`-thread blocks: the
// threads are created once and take the blocks one after another, meeting
// at a barrier after each (so the next block may reuse the statics that
// stand for shared memory).
template <class F>
void launch(unsigned gx, unsigned gy, int threads, F kernel) {
  std::barrier<> bar(threads);
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      threadIdx = {unsigned(t), 0, 0};
      blockDim = {unsigned(threads), 1, 1};
      gridDim = {gx, gy, 1};
      tl_barrier = &bar;
      for (unsigned by = 0; by < gy; ++by)
        for (unsigned bx = 0; bx < gx; ++bx) {
          blockIdx = {bx, by, 0};
          kernel();
          bar.arrive_and_wait();
        }
    });
  for (auto& t : ts) t.join();
}
