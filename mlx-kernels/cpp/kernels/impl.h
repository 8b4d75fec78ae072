// The ISA-generic kernels, written once against the SIMD layer `S` (simd_*.h).
// Each isa_*.cc includes this file inside its own namespace, after its target
// pragma, so every function here is compiled once per ISA. No standard-library
// templates are instantiated here (their out-of-line copies would carry this
// file's ISA into code shared with other ISAs); scratch memory comes from
// `scratch()` in pool.cc.
//
// Numerics: everything is f32 with f32 accumulation. Where MLX's reference op
// rounds in a particular order (RMS norm, RoPE, the exp of silu and softmax),
// the same order is used; dot products are summed in a different (blocked)
// order than MLX's, which moves results by a few ulp of the sum's terms. The
// one exception is the avx512vnni build's 4-/8-bit matvec (MLXCEL_DOT_I16),
// which rounds x to int16 steps (see there).

using V = S::V;
constexpr int W = S::W;

inline int imin(int a, int b) { return a < b ? a : b; }
inline int imax(int a, int b) { return a > b ? a : b; }
inline int ceil_div(int a, int b) { return (a + b - 1) / b; }
inline int round_up(int a, int b) { return ceil_div(a, b) * b; }

constexpr float kLowest = -3.4028234663852886e38f;  // what MLX writes for masked scores
constexpr float kNegInf = -__builtin_huge_valf();

// Work below this many multiply-adds runs on the calling thread alone: waking
// the pool costs about a microsecond.
constexpr int64_t kParallelWork = 1 << 15;

// ---------------------------------------------------------------------------
// Vector helpers (any length; tails use masked loads).

// The vector whose lane i is the sum of r[i]'s lanes, for W vectors r (r is
// overwritten). A SIMD layer with a cheaper reduction tree (AVX-512) defines
// `S::row_sums`; the others transpose the block and add its rows.
// (A template so that the branch not taken is never instantiated.)
template <class L = S>
inline V row_sums(V* r) {
  if constexpr (requires { L::row_sums(r); }) {
    return L::row_sums(r);
  } else {
    S::transpose(r);
    V s = r[0];
    for (int i = 1; i < W; ++i) s = S::add(s, r[i]);
    return s;
  }
}

inline float dot(const float* a, const float* b, int n) {
  V acc0 = S::zero(), acc1 = S::zero();
  int i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {
    acc0 = S::fma(S::load(a + i), S::load(b + i), acc0);
    acc1 = S::fma(S::load(a + i + W), S::load(b + i + W), acc1);
  }
  for (; i + W <= n; i += W) acc0 = S::fma(S::load(a + i), S::load(b + i), acc0);
  if (i < n) acc0 = S::fma(S::load_n(a + i, n - i), S::load_n(b + i, n - i), acc0);
  return S::hsum(S::add(acc0, acc1));
}

// y += alpha * x
inline void axpy(float* y, float alpha, const float* x, int n) {
  const V av = S::set1(alpha);
  int i = 0;
  for (; i + W <= n; i += W) S::store(y + i, S::fma(av, S::load(x + i), S::load(y + i)));
  if (i < n) S::store_n(y + i, S::fma(av, S::load_n(x + i, n - i), S::load_n(y + i, n - i)), n - i);
}

// y = x * alpha
inline void scale_into(float* y, const float* x, float alpha, int n) {
  const V av = S::set1(alpha);
  int i = 0;
  for (; i + W <= n; i += W) S::store(y + i, S::mul(S::load(x + i), av));
  if (i < n) S::store_n(y + i, S::mul(S::load_n(x + i, n - i), av), n - i);
}

// y = x / d
inline void div_into(float* y, const float* x, float d, int n) {
  const V dv = S::set1(d);
  int i = 0;
  for (; i + W <= n; i += W) S::store(y + i, S::div(S::load(x + i), dv));
  if (i < n) S::store_n(y + i, S::div(S::load_n(x + i, n - i), dv), n - i);
}

inline float vmax(const float* x, int n) {
  float m = x[0];
  int i = 0;
  if (n >= W) {
    V acc = S::load(x);
    for (i = W; i + W <= n; i += W) acc = S::max(acc, S::load(x + i));
    m = S::hmax(acc);
  }
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

// x = exp(x - m) in place; returns the sum.
inline float exp_sub_sum(float* x, float m, int n) {
  const V mv = S::set1(m);
  V acc = S::zero();
  int i = 0;
  for (; i + W <= n; i += W) {
    V e = S::exp(S::sub(S::load(x + i), mv));
    S::store(x + i, e);
    acc = S::add(acc, e);
  }
  if (i < n) {
    S::store_n(x + i, S::exp(S::sub(S::load_n(x + i, n - i), mv)), n - i);
    acc = S::add(acc, S::load_n(x + i, n - i));  // inactive lanes load as zero
  }
  return S::hsum(acc);
}

// The software prefetch of a matvec: the `bytes` bytes at `next` (the block of
// rows kQmvAhead blocks ahead of the one being computed) in `steps` equal
// parts, part i issued at step i of the current block, so that DRAM latency
// overlaps the arithmetic instead of stalling the next block. Null `next`
// (no block that far ahead): nothing to fetch.
struct SpreadPrefetch {
  const char* next;
  int64_t bytes, part;
  SpreadPrefetch(const void* next_block, int64_t n_bytes, int steps)
      : next(static_cast<const char*>(next_block)),
        bytes(n_bytes),
        part((n_bytes + 64 * static_cast<int64_t>(steps) - 1) / (64 * static_cast<int64_t>(steps)) * 64) {}
  inline void step(int i) const {
    if (next == nullptr) return;
    for (int64_t off = i * part; off < (i + 1) * part && off < bytes; off += 64) S::prefetch(next + off);
  }
};

// The kernels, one concern per file, in dependency order:
#include "mlxcel-mlx/cpp/kernels/qmv_impl.h"   // quantized matvec (decode)
#include "mlxcel-mlx/cpp/kernels/gemm_impl.h"  // quantized GEMM (prefill), product dispatch, gather
#include "mlxcel-mlx/cpp/kernels/nn_impl.h"    // RMS norm, RoPE, gates, attention

// ---------------------------------------------------------------------------
// Memory read bandwidth probe: sums n floats with 4 independent accumulators.

float read_sum(const float* x, int64_t n) {
  V a0 = S::zero(), a1 = S::zero(), a2 = S::zero(), a3 = S::zero();
  int64_t i = 0;
  for (; i + 4 * W <= n; i += 4 * W) {
    a0 = S::add(a0, S::load(x + i));
    a1 = S::add(a1, S::load(x + i + W));
    a2 = S::add(a2, S::load(x + i + 2 * W));
    a3 = S::add(a3, S::load(x + i + 3 * W));
  }
  float s = S::hsum(S::add(S::add(a0, a1), S::add(a2, a3)));
  for (; i < n; ++i) s += x[i];
  return s;
}

const Table kTable = {kIsa, kIsaName, qmm, qmm_multi, rms_norm, rope, attention, gate, gather, read_sum};
