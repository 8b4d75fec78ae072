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

// ---------------------------------------------------------------------------
// Quantized matmul, decode shapes: a matrix-vector product per row of x.
//
// 4-bit: each byte of a row holds two consecutive codes (low nibble first), so
// W bytes hold 2W codes; their low nibbles are the even elements and the high
// nibbles the odd ones. x is permuted once per call into the same order
// (per chunk of 2W: evens, then odds), so codes are never de-interleaved.
// The bias term is folded: sum_k (s q_k + b) x_k = s sum_k q_k x_k + b sum_k x_k,
// with sum_k x_k per group computed once per call.

constexpr int kQmvMaxM = 8;
constexpr int kQmvAhead = 2;  // blocks of rows the software prefetch runs ahead

// Code k of a row's bit stream, any width.
inline int code_at(const uint8_t* row, int64_t k, int bits) {
  const int64_t bit = k * bits;
  const int shift = static_cast<int>(bit & 7);
  unsigned v = row[bit >> 3] >> shift;
  if (shift + bits > 8) v |= static_cast<unsigned>(row[(bit >> 3) + 1]) << (8 - shift);
  return static_cast<int>(v & ((1u << bits) - 1));
}

// The `BYTES` bytes at p as a little-endian integer, from whole loads (a
// memcpy into a zeroed u64 goes through the stack and stalls the reload).
template <int BYTES>
inline uint64_t load_le(const uint8_t* p) {
  static_assert(BYTES >= 2 && BYTES <= 6, "2 to 6 bytes");
  uint64_t v;
  if constexpr (BYTES >= 4) {
    uint32_t lo;
    __builtin_memcpy(&lo, p, 4);
    v = lo;
    if constexpr (BYTES == 5) v |= static_cast<uint64_t>(p[4]) << 32;
    if constexpr (BYTES == 6) {
      uint16_t hi;
      __builtin_memcpy(&hi, p + 4, 2);
      v |= static_cast<uint64_t>(hi) << 32;
    }
  } else {
    uint16_t lo;
    __builtin_memcpy(&lo, p, 2);
    v = lo;
    if constexpr (BYTES == 3) v |= static_cast<uint64_t>(p[2]) << 16;
  }
  return v;
}

// Codes k .. k+W of a row (k a multiple of W) as floats. 8-bit codes are
// bytes. 2-, 3-, 5- and 6-bit codes have no SIMD-friendly layout, but 8
// consecutive codes fill exactly BITS bytes of the little-endian bit stream,
// and pdep spreads them into 8 bytes in registers (no store and reload).
// (4-bit codes take their own nibble paths.)
template <int BITS>
inline V load_codes(const uint8_t* row, int64_t k) {
  // Where pdep spreads 8 codes: a byte per code, its BITS low bits.
  [[maybe_unused]] constexpr uint64_t kMask = 0x0101010101010101ull * ((1u << BITS) - 1);
  if constexpr (BITS == 8) {
    return S::u8(row + k);
  } else if constexpr (W >= 8) {
    const uint8_t* p = row + k * BITS / 8;
    uint64_t u[W / 8];
#pragma GCC unroll 2
    for (int i = 0; i < W / 8; ++i) u[i] = S::pdep(load_le<BITS>(p + i * BITS), kMask);
    return S::u8x(u);
  } else if constexpr (W == 4) {
    // Half of the 8 codes (BITS whole bytes) that k's block of 8 lies in.
    const uint8_t* p = row + (k & ~int64_t{7}) * BITS / 8;
    const uint64_t u = S::pdep(load_le<BITS>(p), kMask) >> ((k & 4) * 8);
    return S::u8x(&u);
  } else {
    return S::set1(static_cast<float>(code_at(row, k, BITS)));
  }
}

// Rows n .. n+R of W against MM rows of x. With a 16-entry table (AVX-512,
// 4-bit), each group's codes go through a table of its dequantized values
// (s * code + b, one FMA per group) and the dot product needs no bias term;
// otherwise codes are converted to floats, summed against x per group, scaled
// once per group, and the bias enters as b * sum(x) per group.
template <int BITS, int GS, int R, int MM>
inline void qmv_rows(const QmmArgs& a, int n, const float* xp, const float* xs, float* out) {
  constexpr int SPAN = BITS == 4 ? 2 * W : W;
  constexpr int CH = GS / SPAN;
  constexpr int GBYTES = GS * BITS / 8;
  constexpr bool LUT = BITS == 4 && S::kLut16;
  // Accumulators per (row, x row): two halve the FMA chains. Two for every
  // MM, so that a row of x gets the same sums whichever other rows share
  // its call (batch invariance: a sequence's bits do not depend on its batch).
  constexpr int NA = 2;
  const int K = a.K, G = K / GS;
  const int64_t row_bytes = static_cast<int64_t>(K) * BITS / 8;
  const uint8_t* wb = static_cast<const uint8_t*>(a.w) + static_cast<int64_t>(n) * row_bytes;
  const float* sc;
  const float* bi;
  float widened[2 * 4 * 256];  // 16-bit scales and biases of these rows as f32
  if (a.scale_type == kScaleF32) {
    sc = static_cast<const float*>(a.scales) + static_cast<int64_t>(n) * G;
    bi = static_cast<const float*>(a.biases) + static_cast<int64_t>(n) * G;
  } else {
    // 16-bit scales and biases of these rows, widened once per block.
    float* buf = 2 * R * G <= 2 * 4 * 256 ? widened : scratch(kScratchScales, static_cast<size_t>(2) * R * G);
    S::widen(static_cast<const uint16_t*>(a.scales) + static_cast<int64_t>(n) * G, buf, R * G, a.scale_type);
    S::widen(static_cast<const uint16_t*>(a.biases) + static_cast<int64_t>(n) * G, buf + R * G, R * G, a.scale_type);
    sc = buf;
    bi = buf + R * G;
  }
  V tot[R][MM][NA];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int m = 0; m < MM; ++m)
#pragma GCC unroll 2
      for (int i = 0; i < NA; ++i) tot[r][m][i] = S::zero();
  [[maybe_unused]] const V iota = S::iota();
  // Software prefetch of the block of rows kQmvAhead blocks ahead, spread over
  // the groups (weights, then scales and biases), so that DRAM latency
  // overlaps the arithmetic.
  const int64_t ahead = static_cast<int64_t>(kQmvAhead) * R;
  const int64_t next_bytes = R * row_bytes;
  const int64_t per_group = ((next_bytes + 64 * G - 1) / (64 * G)) * 64;
  for (int g = 0; g < G; ++g) {
    const float* xg = xp + static_cast<int64_t>(g) * GS;
    if (n + ahead + R <= a.N) {
      const uint8_t* pf = wb + ahead * row_bytes;
      for (int64_t off = g * per_group; off < (g + 1) * per_group && off < next_bytes; off += 64) S::prefetch(pf + off);
      if (g < 2 * R) {
        const int es = a.scale_type == kScaleF32 ? 4 : 2;
        const char* sp = static_cast<const char*>(g & 1 ? a.biases : a.scales) + ((n + ahead + g / 2) * G) * es;
        S::prefetch(sp);
        S::prefetch(sp + (G - 1) * es);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const uint8_t* p = wb + r * row_bytes + static_cast<int64_t>(g) * GBYTES;
      if constexpr (LUT) {
        const V lut = S::fma(iota, S::set1(sc[r * G + g]), S::set1(bi[r * G + g]));
#pragma GCC unroll 8
        for (int c = 0; c < CH; ++c) {
          V lo, hi;
          S::nib_lut(p + c * W, lut, lo, hi);
          const float* xc = xg + c * SPAN;
#pragma GCC unroll 8
          for (int m = 0; m < MM; ++m) {
            tot[r][m][0] = S::fma(lo, S::load(xc + static_cast<int64_t>(m) * K), tot[r][m][0]);
            tot[r][m][NA - 1] = S::fma(hi, S::load(xc + static_cast<int64_t>(m) * K + W), tot[r][m][NA - 1]);
          }
        }
      } else {
        V acc[MM];
#pragma GCC unroll 8
        for (int m = 0; m < MM; ++m) acc[m] = S::zero();
#pragma GCC unroll 8
        for (int c = 0; c < CH; ++c) {
          const float* xc = xg + c * SPAN;
          if constexpr (BITS == 4) {
            V lo, hi;
            S::nib(p + c * W, lo, hi);
#pragma GCC unroll 8
            for (int m = 0; m < MM; ++m) {
              acc[m] = S::fma(lo, S::load(xc + static_cast<int64_t>(m) * K), acc[m]);
              acc[m] = S::fma(hi, S::load(xc + static_cast<int64_t>(m) * K + W), acc[m]);
            }
          } else {
            const V q = load_codes<BITS>(p, c * W);
#pragma GCC unroll 8
            for (int m = 0; m < MM; ++m) acc[m] = S::fma(q, S::load(xc + static_cast<int64_t>(m) * K), acc[m]);
          }
        }
        const V s = S::set1(sc[r * G + g]);
#pragma GCC unroll 8
        for (int m = 0; m < MM; ++m) tot[r][m][0] = S::fma(acc[m], s, tot[r][m][0]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int m = 0; m < MM; ++m) {
      float y = S::hsum(S::add(tot[r][m][0], tot[r][m][1]));
      if constexpr (!LUT) y += dot(bi + r * G, xs + m * G, G);
      out[static_cast<int64_t>(m) * a.ldo + n + r] = y;
    }
  }
}

template <int BITS, int GS, int MM>
void qmv_range(const QmmArgs& a, int n0, int n1, const float* xp, const float* xs, float* out) {
  constexpr int R = MM == 1 ? 4 : (MM == 2 ? 2 : 1);
  int n = n0;
  for (; n + R <= n1; n += R) qmv_rows<BITS, GS, R, MM>(a, n, xp, xs, out);
  for (; n < n1; ++n) qmv_rows<BITS, GS, 1, MM>(a, n, xp, xs, out);
}

template <int BITS, int GS>
void qmv_dispatch_m(const QmmArgs& a, int mm, int n0, int n1, const float* xp, const float* xs, float* out) {
  switch (mm) {
    case 1: qmv_range<BITS, GS, 1>(a, n0, n1, xp, xs, out); break;
    case 2: qmv_range<BITS, GS, 2>(a, n0, n1, xp, xs, out); break;
    case 3: qmv_range<BITS, GS, 3>(a, n0, n1, xp, xs, out); break;
    case 4: qmv_range<BITS, GS, 4>(a, n0, n1, xp, xs, out); break;
    case 5: qmv_range<BITS, GS, 5>(a, n0, n1, xp, xs, out); break;
    case 6: qmv_range<BITS, GS, 6>(a, n0, n1, xp, xs, out); break;
    case 7: qmv_range<BITS, GS, 7>(a, n0, n1, xp, xs, out); break;
    default: qmv_range<BITS, GS, 8>(a, n0, n1, xp, xs, out); break;
  }
}

template <int BITS>
void qmv_dispatch(const QmmArgs& a, int mm, int n0, int n1, const float* xp, const float* xs, float* out) {
  switch (a.group_size) {
    case 32: qmv_dispatch_m<BITS, 32>(a, mm, n0, n1, xp, xs, out); break;
    case 64: qmv_dispatch_m<BITS, 64>(a, mm, n0, n1, xp, xs, out); break;
    default: qmv_dispatch_m<BITS, 128>(a, mm, n0, n1, xp, xs, out); break;
  }
}

#if defined(MLXCEL_DOT_I16)
#include "mlxcel-mlx/cpp/kernels/i16_impl.h"
#endif  // MLXCEL_DOT_I16

// The tasks of a qmv_multi job in parallel: task t covers rows n0 .. n1 of
// one matrix (`first[i]` is matrix i's first task), in runs of at most
// kQmvMaxM rows of x: `rows(args[i], m0, mm, n0, n1)`.
template <class F>
void qmv_tasks(const QmmArgs* args, const int* first, int count, int chunk, int M, const F& rows) {
  parallel_for(first[count], [&](int t) {
    int i = 0;
    while (t >= first[i + 1]) ++i;
    const QmmArgs& ai = args[i];
    const int n0 = (t - first[i]) * chunk, n1 = imin(ai.N, n0 + chunk);
    for (int m0 = 0; m0 < M; m0 += kQmvMaxM) rows(ai, m0, imin(kQmvMaxM, M - m0), n0, n1);
  });
}

// How a matvec job over `count` matrices splits into tasks: returns the rows
// per task (~8 tasks per thread over all matrices, multiples of 4) and sets
// `first[i]`, matrix i's first task (`first` has count + 1 entries).
inline int qmv_plan(const QmmArgs* args, int count, int* first) {
  int64_t total = 0;
  for (int i = 0; i < count; ++i) total += args[i].N;
  const int threads = pool_threads();
  const bool parallel = threads > 1 && args[0].M * total * args[0].K >= kParallelWork * 4;
  const int chunk = parallel ? imax(16, round_up(static_cast<int>((total + threads * 8 - 1) / (threads * 8)), 4))
                             : static_cast<int>(total);
  first[0] = 0;
  for (int i = 0; i < count; ++i) first[i + 1] = first[i] + ceil_div(args[i].N, chunk);
  return chunk;
}

// Several matrices against the same x (q, k and v; gate and up) in one
// parallel pass: x is permuted once and all rows share one pool dispatch.
template <int BITS>
void qmv_multi(const QmmArgs* args, int count) {
  const QmmArgs& a = args[0];
  const int K = a.K, gs = a.group_size, G = K / gs, M = a.M;
  int first[8 + 1];  // first task of each matrix (count <= 8)
  const int chunk = qmv_plan(args, count, first);
#if defined(MLXCEL_DOT_I16)
  if constexpr (BITS == 4 || BITS == 8) {
    if (K % kI16Chunk<BITS> == 0) {
      // int16 x (K / 2 floats' room per row), the blocks' steps, the group sums.
      const int dxr = K / kI16Block<BITS>;
      float* buf = scratch(kScratchX, static_cast<size_t>(M) * (K / 2 + dxr + G) + 16);
      int16_t* xq = reinterpret_cast<int16_t*>(buf);
      float* dx = buf + static_cast<size_t>(M) * K / 2;
      float* xs = dx + static_cast<size_t>(M) * dxr;
      for (int m = 0; m < M; ++m)
        quantize_x_i16<BITS>(a.x + m * a.ldx, K, gs, xq + static_cast<int64_t>(m) * K, dx + m * dxr, xs + m * G);
      qmv_tasks(args, first, count, chunk, M, [&](const QmmArgs& ai, int m0, int mm, int n0, int n1) {
        qmv_i16<BITS>(ai, mm, n0, n1, xq + static_cast<int64_t>(m0) * K, dx + m0 * dxr, xs + m0 * G,
                      ai.out + m0 * ai.ldo);
      });
      return;
    }
  }
#endif
  float* xp = scratch(kScratchX, static_cast<size_t>(M) * (K + G));
  float* xs = xp + static_cast<size_t>(M) * K;
  for (int m = 0; m < M; ++m) {
    const float* x = a.x + m * a.ldx;
    float* dst = xp + static_cast<int64_t>(m) * K;
    if constexpr (BITS == 4) {
      for (int c = 0; c < K; c += 2 * W)
        for (int j = 0; j < W; ++j) {
          dst[c + j] = x[c + 2 * j];
          dst[c + W + j] = x[c + 2 * j + 1];
        }
    } else {
      for (int k = 0; k < K; ++k) dst[k] = x[k];
    }
    for (int g = 0; g < G; ++g) {
      float s = 0.0f;
      for (int k = g * gs; k < (g + 1) * gs; ++k) s += x[k];
      xs[m * G + g] = s;
    }
  }
  qmv_tasks(args, first, count, chunk, M, [&](const QmmArgs& ai, int m0, int mm, int n0, int n1) {
    qmv_dispatch<BITS>(ai, mm, n0, n1, xp + static_cast<int64_t>(m0) * K, xs + m0 * G, ai.out + m0 * ai.ldo);
  });
}

// ---------------------------------------------------------------------------
// Quantized matmul, prefill shapes: dequantize a panel of W (transposed to
// k-major strips of NR columns) into scratch, then a register-blocked FMA
// micro-kernel computes MR x NR tiles of the output.

constexpr int kGemmKC = 256;  // k per panel (a multiple of every group size)

// Dequantizes rows n0 .. n0+NR of W, k in [k0, k0+kc), into Bp [kc][NR].
template <int BITS>
void pack_strip(const QmmArgs& a, int n0, int k0, int kc, float* Bp) {
  constexpr int NV = S::GEMM_NV, NR = NV * W;
  constexpr int SPAN = BITS == 4 ? 2 * W : W;
  const int G = a.K / a.group_size;
  const int64_t row_bytes = static_cast<int64_t>(a.K) * BITS / 8;
  const uint8_t* wb = static_cast<const uint8_t*>(a.w);
  for (int v = 0; v < NV; ++v) {
    const int r0 = n0 + v * W;
    for (int k = k0; k < k0 + kc; k += SPAN) {
      V lo[W], hi[W];
      const int g = k / a.group_size;
      for (int r = 0; r < W; ++r) {
        const int n = r0 + r;
        if (n < a.N) {
          const uint8_t* p = wb + n * row_bytes + static_cast<int64_t>(k) * BITS / 8;
          const V s = S::set1(scale_at(a.scales, static_cast<int64_t>(n) * G + g, a.scale_type));
          const V b = S::set1(scale_at(a.biases, static_cast<int64_t>(n) * G + g, a.scale_type));
          if constexpr (BITS == 4) {
            S::nib(p, lo[r], hi[r]);
            lo[r] = S::fma(lo[r], s, b);
            hi[r] = S::fma(hi[r], s, b);
          } else {
            lo[r] = S::fma(load_codes<BITS>(wb + n * row_bytes, k), s, b);
            hi[r] = S::zero();
          }
        } else {
          lo[r] = S::zero();
          hi[r] = S::zero();
        }
      }
      // Lane t of row r is element k + 2t (4-bit even), k + 2t + 1 (odd) or k + t (8-bit).
      S::transpose(lo);
      float* dst = Bp + static_cast<int64_t>(k - k0) * NR + v * W;
      if constexpr (BITS == 4) {
        S::transpose(hi);
        for (int t = 0; t < W; ++t) {
          S::store(dst + (2 * t) * NR, lo[t]);
          S::store(dst + (2 * t + 1) * NR, hi[t]);
        }
      } else {
        for (int t = 0; t < W; ++t) S::store(dst + t * NR, lo[t]);
      }
    }
  }
}

// C[MR, ncols] (+)= A[MR, kc] · B[kc, NR] (B packed k-major).
template <int MR>
void ukernel(int kc, const float* A, int64_t lda, const float* B, float* C, int64_t ldc, bool accumulate, int ncols) {
  constexpr int NV = S::GEMM_NV, NR = NV * W;
  V c[MR][NV];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) c[i][v] = S::zero();
  for (int k = 0; k < kc; ++k) {
    V b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) b[v] = S::load(B + static_cast<int64_t>(k) * NR + v * W);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const V ai = S::set1(A[i * lda + k]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) c[i][v] = S::fma(ai, b[v], c[i][v]);
    }
  }
  for (int i = 0; i < MR; ++i) {
    for (int v = 0; v < NV; ++v) {
      float* p = C + i * ldc + v * W;
      const int nc = ncols - v * W;
      if (nc >= W) {
        S::store(p, accumulate ? S::add(c[i][v], S::load(p)) : c[i][v]);
      } else if (nc > 0) {
        S::store_n(p, accumulate ? S::add(c[i][v], S::load_n(p, nc)) : c[i][v], nc);
      }
    }
  }
}

inline void ukernel_rows(int mr, int kc, const float* A, int64_t lda, const float* B, float* C, int64_t ldc,
                         bool accumulate, int ncols) {
  static_assert(S::GEMM_MR <= 12, "ukernel_rows covers up to 12 rows");
  switch (mr) {
    case 1: ukernel<1>(kc, A, lda, B, C, ldc, accumulate, ncols); break;
    case 2: ukernel<2>(kc, A, lda, B, C, ldc, accumulate, ncols); break;
    case 3: ukernel<3>(kc, A, lda, B, C, ldc, accumulate, ncols); break;
    case 4: ukernel<4>(kc, A, lda, B, C, ldc, accumulate, ncols); break;
    case 5: ukernel<5>(kc, A, lda, B, C, ldc, accumulate, ncols); break;
    case 6: ukernel<6>(kc, A, lda, B, C, ldc, accumulate, ncols); break;
    case 7: ukernel<7>(kc, A, lda, B, C, ldc, accumulate, ncols); break;
    case 8: ukernel<8>(kc, A, lda, B, C, ldc, accumulate, ncols); break;
    case 9: ukernel<9>(kc, A, lda, B, C, ldc, accumulate, ncols); break;
    case 10: ukernel<10>(kc, A, lda, B, C, ldc, accumulate, ncols); break;
    case 11: ukernel<11>(kc, A, lda, B, C, ldc, accumulate, ncols); break;
    default: ukernel<12>(kc, A, lda, B, C, ldc, accumulate, ncols); break;
  }
}

// The GEMM over panels of W: `pack(n0, k0, kc, Bp)` writes rows n0 .. n0+NR
// of W, k in [k0, k0+kc), k-major into Bp [kc][NR] (zero past N).
template <class Pack>
void gemm_panels(const QmmArgs& a, const Pack& pack) {
  constexpr int NR = S::GEMM_NV * W, MR = S::GEMM_MR;
  const int M = a.M, N = a.N, K = a.K;
  const int strips = ceil_div(N, NR);
  const int threads = pool_threads();
  // Panels of whole strips; at least ~4 per thread for balance, at most 8 strips.
  int panel = imax(1, imin(8, strips / imax(1, threads * 4)));
  const int npanels = ceil_div(strips, panel);
  // Too few panels for the threads: split the rows of x as well.
  int mchunks = 1;
  if (threads > 1 && npanels < 2 * threads) mchunks = imax(1, imin(ceil_div(2 * threads, npanels), M / (4 * MR)));
  const int mchunk = round_up(ceil_div(M, mchunks), MR);
  mchunks = ceil_div(M, mchunk);
  parallel_for(npanels * mchunks, [&](int t) {
    const int p = t % npanels, mc = t / npanels;
    const int s0 = p * panel, s1 = imin(strips, s0 + panel);
    const int m0 = mc * mchunk, m1 = imin(M, m0 + mchunk);
    float* Bp = scratch(kScratchPanel, static_cast<size_t>(panel) * NR * kGemmKC);
    for (int k0 = 0; k0 < K; k0 += kGemmKC) {
      const int kc = imin(kGemmKC, K - k0);
      for (int s = s0; s < s1; ++s) pack(s * NR, k0, kc, Bp + static_cast<int64_t>(s - s0) * kc * NR);
      for (int s = s0; s < s1; ++s) {
        const float* B = Bp + static_cast<int64_t>(s - s0) * kc * NR;
        const int ncols = imin(NR, N - s * NR);
        for (int m = m0; m < m1; m += MR) {
          ukernel_rows(imin(MR, m1 - m), kc, a.x + m * a.ldx + k0, a.ldx, B, a.out + m * a.ldo + s * NR, a.ldo,
                       k0 > 0, ncols);
        }
      }
    }
  });
}

template <int BITS>
void qgemm(const QmmArgs& a) {
  gemm_panels(a, [&](int n0, int k0, int kc, float* Bp) { pack_strip<BITS>(a, n0, k0, kc, Bp); });
}

template <int BITS>
void qmm_multi_bits(const QmmArgs* args, int count) {
  // The matvec computes each row of x on its own (in runs of kQmvMaxM rows),
  // so a row's bits do not depend on M; the GEMM's do differ from it.
  if (args[0].M <= kQmvMaxM || args[0].row_invariant) {
    qmv_multi<BITS>(args, count);
    return;
  }
  for (int i = 0; i < count; ++i)
    if (args[i].N > 0) qgemm<BITS>(args[i]);
}

// Products of float weights (float_impl.h, included after this file).
void fmm_multi(const QmmArgs* args, int count);
// Products and gathers of weights in the rows16 layout (rows16_impl.h, likewise).
void rows16_multi(const QmmArgs* args, int count);
void rows16_gather(const GatherArgs& a);

// `count` (at most 8) products of the same x (same M, K, bits and group size;
// or all of float weights).
void qmm_multi(const QmmArgs* args, int count) {
  if (count <= 0 || args[0].M <= 0) return;
  if (args[0].weight_type != kWeightQuantized) return fmm_multi(args, count);
  if (args[0].layout == WeightLayout::Rows16) return rows16_multi(args, count);
  switch (args[0].bits) {
    case 2: qmm_multi_bits<2>(args, count); break;
    case 3: qmm_multi_bits<3>(args, count); break;
    case 4: qmm_multi_bits<4>(args, count); break;
    case 5: qmm_multi_bits<5>(args, count); break;
    case 6: qmm_multi_bits<6>(args, count); break;
    default: qmm_multi_bits<8>(args, count); break;
  }
}

void qmm(const QmmArgs& a) {
  if (a.N > 0) qmm_multi(&a, 1);
}

// ---------------------------------------------------------------------------
// Quantized rows (embedding lookup): plain dequantization, scale * q + bias
// rounded twice as MLX's dequantize does.

void gather(const GatherArgs& a) {
  if (a.layout == WeightLayout::Rows16) return rows16_gather(a);
  const int K = a.K, gs = a.group_size, G = K / gs, bits = a.bits;
  const int64_t row_bytes = static_cast<int64_t>(K) * bits / 8;
  const uint8_t* wb = reinterpret_cast<const uint8_t*>(a.w);
  for (int i = 0; i < a.n_ids; ++i) {
    const int64_t n = a.ids[i];
    const uint8_t* p = wb + n * row_bytes;
    float* o = a.out + static_cast<int64_t>(i) * K;
    for (int k = 0; k < K; ++k) {
      const int q = code_at(p, k, bits);
      const float s = scale_at(a.scales, n * G + k / gs, a.scale_type);
      const float b = scale_at(a.biases, n * G + k / gs, a.scale_type);
      const float prod = s * static_cast<float>(q);
      o[k] = prod + b;
    }
  }
}

// ---------------------------------------------------------------------------
// RMS norm: x * (1 / sqrt(sum(x²) * (1/D) + eps)) * w, in that rounding order
// (MLX's fallback: mean as sum times 1/D, rsqrt as 1/sqrt).

void rms_norm(const float* x, int64_t ldx, const float* w, float* out, int rows, int dim, float eps) {
  const float inv_dim = static_cast<float>(1.0 / dim);
  auto body = [&](int r0, int r1) {
    for (int r = r0; r < r1; ++r) {
      const float* xr = x + r * ldx;
      float* o = out + static_cast<int64_t>(r) * dim;
      const float ss = dot(xr, xr, dim);
      const float scale = 1.0f / __builtin_sqrtf(ss * inv_dim + eps);
      const V sv = S::set1(scale);
      int i = 0;
      for (; i + W <= dim; i += W) {
        V y = S::mul(S::load(xr + i), sv);
        if (w) y = S::mul(y, S::load(w + i));
        S::store(o + i, y);
      }
      if (i < dim) {
        V y = S::mul(S::load_n(xr + i, dim - i), sv);
        if (w) y = S::mul(y, S::load_n(w + i, dim - i));
        S::store_n(o + i, y, dim - i);
      }
    }
  };
  const bool parallel = pool_threads() > 1 && static_cast<int64_t>(rows) * dim >= kParallelWork;
  const int chunk = parallel ? imax(1, ceil_div(rows, pool_threads() * 4)) : rows;
  parallel_for(ceil_div(rows, chunk), [&](int t) { body(t * chunk, imin(rows, (t + 1) * chunk)); });
}

// ---------------------------------------------------------------------------
// RoPE with a precomputed cos/sin table: x1 c - x2 s and x1 s + x2 c, each
// product rounded (as MLX's fallback computes it).

void rope(const RopeArgs& a) {
  const int half = a.dims / 2, D = a.D;
  const int rows = a.A * a.B * a.L;
  auto body = [&](int t0, int t1) {
    for (int t = t0; t < t1; ++t) {
      const int l = t % a.L, ib = (t / a.L) % a.B, ia = t / (a.L * a.B);
      const float* x = a.x + ia * a.sa + ib * a.sb + l * a.sl;
      float* o = a.out + static_cast<int64_t>(t) * D;
      const float* c = a.cos + static_cast<int64_t>(l) * half;
      const float* s = a.sin + static_cast<int64_t>(l) * half;
      if (!a.traditional) {
        int i = 0;
        for (; i + W <= half; i += W) {
          const V x1 = S::load(x + i), x2 = S::load(x + half + i), cv = S::load(c + i), sv = S::load(s + i);
          S::store(o + i, S::sub(S::mul(x1, cv), S::mul(x2, sv)));
          S::store(o + half + i, S::add(S::mul(x1, sv), S::mul(x2, cv)));
        }
        for (; i < half; ++i) {
          const float x1 = x[i], x2 = x[half + i];
          const float p1 = x1 * c[i], p2 = x2 * s[i], p3 = x1 * s[i], p4 = x2 * c[i];
          o[i] = p1 - p2;
          o[half + i] = p3 + p4;
        }
      } else {
        for (int i = 0; i < half; ++i) {
          const float x1 = x[2 * i], x2 = x[2 * i + 1];
          const float p1 = x1 * c[i], p2 = x2 * s[i], p3 = x1 * s[i], p4 = x2 * c[i];
          o[2 * i] = p1 - p2;
          o[2 * i + 1] = p3 + p4;
        }
      }
      for (int d = a.dims; d < D; ++d) o[d] = x[d];
    }
  };
  const bool parallel = pool_threads() > 1 && static_cast<int64_t>(rows) * D >= kParallelWork;
  const int chunk = parallel ? imax(1, ceil_div(rows, pool_threads() * 4)) : rows;
  parallel_for(ceil_div(rows, chunk), [&](int t) { body(t * chunk, imin(rows, (t + 1) * chunk)); });
}

// ---------------------------------------------------------------------------
// Gated activations: silu(a) * b and gelu_tanh(a) * b.

// MLX's sigmoid: y = 1 / (1 + exp(|x|)); x < 0 ? y : 1 - y.
inline V sigmoid(V x) {
  const V one = S::set1(1.0f);
  const V y = S::div(one, S::add(one, S::exp(S::abs(x))));
  return S::select_neg(x, y, S::sub(one, y));
}

// tanh(y) = sign(y) (1 - e) / (1 + e), e = exp(-2|y|).
inline V tanh_v(V y) {
  const V one = S::set1(1.0f);
  const V e = S::exp(S::mul(S::abs(y), S::set1(-2.0f)));
  const V t = S::div(S::sub(one, e), S::add(one, e));
  return S::select_neg(y, S::sub(S::zero(), t), t);
}

// mlxcel's gelu_approx: (x/2) (1 + tanh(sqrt(2/pi) (x + 0.044715 x³))).
inline V gelu_tanh(V x) {
  const V cube = S::mul(S::mul(x, x), x);
  const V inner = S::mul(S::add(x, S::mul(cube, S::set1(0.044715f))), S::set1(__builtin_sqrtf(2.0f / 3.14159265358979323846f)));
  return S::mul(S::mul(x, S::set1(0.5f)), S::add(tanh_v(inner), S::set1(1.0f)));
}

inline V gate_act(Activation kind, V x) { return kind == Activation::Silu ? S::mul(x, sigmoid(x)) : gelu_tanh(x); }

void gate(const GateArgs& g) {
  const int cols = g.cols;
  auto body = [&](int64_t e0, int64_t e1) {
    // Elements e0..e1 of the [rows, cols] output, row by row.
    while (e0 < e1) {
      const int r = static_cast<int>(e0 / cols);
      const int c0 = static_cast<int>(e0 % cols);
      const int c1 = static_cast<int>(imin(cols, static_cast<int>(c0 + (e1 - e0))));
      const float* a = g.a + r * g.lda;
      const float* b = g.b + r * g.ldb;
      float* o = g.out + static_cast<int64_t>(r) * cols;
      int c = c0;
      for (; c + W <= c1; c += W) S::store(o + c, S::mul(gate_act(g.kind, S::load(a + c)), S::load(b + c)));
      if (c < c1) {
        const int n = c1 - c;
        S::store_n(o + c, S::mul(gate_act(g.kind, S::load_n(a + c, n)), S::load_n(b + c, n)), n);
      }
      e0 += c1 - c0;
    }
  };
  const int64_t total = static_cast<int64_t>(g.rows) * cols;
  const int threads = pool_threads();
  const bool parallel = threads > 1 && total >= kParallelWork / 2;
  const int tasks = parallel ? threads * 2 : 1;
  const int64_t chunk = round_up(static_cast<int>((total + tasks - 1) / tasks), 64);
  parallel_for(static_cast<int>((total + chunk - 1) / chunk),
               [&](int t) { body(t * chunk, t * chunk + chunk < total ? t * chunk + chunk : total); });
}

// ---------------------------------------------------------------------------
// Attention.

// Masks scores s[0..n) of query (b, h, i) against keys j0..j0+n.
inline void apply_mask(const AttnArgs& a, int b, int h, int i, int j0, int n, float* s) {
  if (a.causal) {
    const int last = i + (a.Lk - a.Lq);
    for (int j = imax(0, last + 1 - j0); j < n; ++j) s[j] = kLowest;
  }
  if (a.mask_kind == MaskKind::Bool) {
    const uint8_t* m = static_cast<const uint8_t*>(a.mask) + b * a.ms[0] + h * a.ms[1] + i * a.ms[2];
    for (int j = 0; j < n; ++j)
      if (!m[(j0 + j) * a.ms[3]]) s[j] = kLowest;
  } else if (a.mask_kind == MaskKind::Additive) {
    const float* m = static_cast<const float*>(a.mask) + b * a.ms[0] + h * a.ms[1] + i * a.ms[2];
    for (int j = 0; j < n; ++j) s[j] += m[(j0 + j) * a.ms[3]];
  }
}

// Few queries (decode): dot products against each key, keys split across
// threads (each split keeps its own running max and sum; merged at the end).
void attention_dot(const AttnArgs& a) {
  const int n_rep = a.H / a.KVH, rows = n_rep * a.Lq, D = a.D, Dv = a.Dv;
  const int groups = a.B * a.KVH;
  const int threads = pool_threads();
  int nchunk = 1;
  if (threads > 1 && groups < 2 * threads &&
      static_cast<int64_t>(rows) * a.Lk * (D + Dv) * groups >= kParallelWork)
    nchunk = imax(1, imin(ceil_div(2 * threads, groups), a.Lk / 32));
  const int clen = ceil_div(a.Lk, nchunk);
  const int pstride = Dv + 2;
  float* part = scratch(kScratchShared, static_cast<size_t>(groups) * nchunk * rows * pstride);
  parallel_for(groups * nchunk, [&](int t) {
    const int gi = t / nchunk, c = t % nchunk;
    const int b = gi / a.KVH, kvh = gi % a.KVH;
    const int j0 = c * clen, nk = imin(a.Lk, j0 + clen) - j0;
    float* P = part + (static_cast<int64_t>(gi) * nchunk + c) * rows * pstride;
    if (nk <= 0) {
      for (int r = 0; r < rows; ++r) {
        P[r * pstride + Dv] = kNegInf;
        P[r * pstride + Dv + 1] = 0.0f;
      }
      return;
    }
    float* qs = scratch(kScratchAttn, static_cast<size_t>(rows) * (D + nk));
    float* sc = qs + static_cast<int64_t>(rows) * D;
    for (int r = 0; r < rows; ++r) {
      const int h = kvh * n_rep + r / a.Lq, i = r % a.Lq;
      scale_into(qs + r * D, a.q + b * a.qs[0] + h * a.qs[1] + i * a.qs[2], a.scale, D);
    }
    const float* kbase = a.k + b * a.ks[0] + kvh * a.ks[1] + static_cast<int64_t>(j0) * a.ks[2];
    // Scores, W keys at a time: a W x W block of keys (W keys by W features)
    // is transposed in registers, so each feature is one broadcast-FMA per
    // query row (no horizontal sums).
    int j = 0;
    for (; j + W <= nk; j += W) {
      for (int r0 = 0; r0 < rows; r0 += 8) {
        const int nr = imin(8, rows - r0);
        V acc[8];
#pragma GCC unroll 8
        for (int r = 0; r < 8; ++r) acc[r] = S::zero();
        for (int d0 = 0; d0 < D; d0 += W) {
          const int nd = imin(W, D - d0);
          V blk[W];
          for (int t = 0; t < W; ++t) {
            const float* kt = kbase + (j + t) * a.ks[2] + d0;
            blk[t] = nd == W ? S::load(kt) : S::load_n(kt, nd);
          }
          S::transpose(blk);
          for (int dd = 0; dd < nd; ++dd)
#pragma GCC unroll 8
            for (int r = 0; r < 8; ++r)
              if (r < nr) acc[r] = S::fma(S::set1(qs[(r0 + r) * D + d0 + dd]), blk[dd], acc[r]);
        }
        for (int r = 0; r < nr; ++r) S::store(sc + (r0 + r) * nk + j, acc[r]);
      }
    }
    for (; j < nk; ++j) {
      const float* kj = kbase + j * a.ks[2];
      for (int r = 0; r < rows; ++r) sc[r * nk + j] = dot(qs + r * D, kj, D);
    }
    for (int r = 0; r < rows; ++r) {
      const int h = kvh * n_rep + r / a.Lq, i = r % a.Lq;
      float* s = sc + r * nk;
      apply_mask(a, b, h, i, j0, nk, s);
      const float m = vmax(s, nk);
      P[r * pstride + Dv] = m;
      P[r * pstride + Dv + 1] = exp_sub_sum(s, m, nk);
    }
    // P · V with the output rows in registers: 4 rows by 4 vectors of features
    // per pass, each value row loaded once per pass.
    const float* vbase = a.v + b * a.vs[0] + kvh * a.vs[1] + static_cast<int64_t>(j0) * a.vs[2];
    for (int dv0 = 0; dv0 < Dv; dv0 += 4 * W) {
      const int nv = imin(4, ceil_div(Dv - dv0, W));
      const int tail = Dv - dv0 - (nv - 1) * W;  // features in the last vector
      for (int r0 = 0; r0 < rows; r0 += 4) {
        const int nr = imin(4, rows - r0);
        V o[4][4];
#pragma GCC unroll 4
        for (int r = 0; r < 4; ++r)
#pragma GCC unroll 4
          for (int v = 0; v < 4; ++v) o[r][v] = S::zero();
        for (int jj = 0; jj < nk; ++jj) {
          const float* vj = vbase + jj * a.vs[2] + dv0;
          V vv[4];
#pragma GCC unroll 4
          for (int v = 0; v < 4; ++v)
            vv[v] = v < nv - 1 ? S::load(vj + v * W) : (v == nv - 1 ? S::load_n(vj + v * W, tail) : S::zero());
#pragma GCC unroll 4
          for (int r = 0; r < 4; ++r) {
            if (r >= nr) break;
            const V p = S::set1(sc[(r0 + r) * nk + jj]);
#pragma GCC unroll 4
            for (int v = 0; v < 4; ++v) o[r][v] = S::fma(p, vv[v], o[r][v]);
          }
        }
        for (int r = 0; r < nr; ++r)
          for (int v = 0; v < nv; ++v) {
            float* dst = P + (r0 + r) * pstride + dv0 + v * W;
            if (v < nv - 1) S::store(dst, o[r][v]); else S::store_n(dst, o[r][v], tail);
          }
      }
    }
  });
  // Merge the splits: out = sum_c e^(m_c - M) O_c / sum_c e^(m_c - M) l_c.
  for (int gi = 0; gi < groups; ++gi) {
    const int b = gi / a.KVH, kvh = gi % a.KVH;
    for (int r = 0; r < rows; ++r) {
      const int h = kvh * n_rep + r / a.Lq, i = r % a.Lq;
      float* o = a.out + b * a.os[0] + h * a.os[1] + i * a.os[2];
      const float* P0 = part + static_cast<int64_t>(gi) * nchunk * rows * pstride + r * pstride;
      if (nchunk == 1) {
        div_into(o, P0, P0[Dv + 1], Dv);
        continue;
      }
      float mmax = kNegInf;
      for (int c = 0; c < nchunk; ++c) {
        const float mc = P0[static_cast<int64_t>(c) * rows * pstride + Dv];
        mmax = mc > mmax ? mc : mmax;
      }
      float l = 0.0f;
      for (int d = 0; d < Dv; ++d) o[d] = 0.0f;
      for (int c = 0; c < nchunk; ++c) {
        const float* Pc = P0 + static_cast<int64_t>(c) * rows * pstride;
        if (Pc[Dv] == kNegInf) continue;
        const float f = __builtin_expf(Pc[Dv] - mmax);
        l += f * Pc[Dv + 1];
        axpy(o, f, Pc, Dv);
      }
      div_into(o, o, l, Dv);
    }
  }
}

// Many queries (prefill): flash attention. Keys are transposed once per
// (batch, kv head) into scratch (W x W blocks in registers); then per (batch,
// head, block of queries): tiles of RB queries by 2W keys with an online
// softmax, P·V accumulated in registers per 2W features. Key blocks entirely
// above the causal diagonal are skipped.
void attention_blocked(const AttnArgs& a) {
  constexpr int RB = S::ATT_RB, KB = 2 * W;
  const int n_rep = a.H / a.KVH, D = a.D, Dv = a.Dv, Dvp = round_up(Dv, 2 * W);
  const int offset = a.Lk - a.Lq;
  const bool skip = a.causal && offset >= 0;
  const int QB = round_up(64, RB);
  const int qblocks = ceil_div(a.Lq, QB);
  const int kpad = round_up(imax(a.Lk, 1), KB);
  const int64_t kt_size = static_cast<int64_t>(D) * kpad;
  float* kts = scratch(kScratchShared, static_cast<size_t>(a.B) * a.KVH * kt_size);
  // Transposed keys, kt[d][j], zero past Lk.
  const int jblocks = ceil_div(kpad, W);
  parallel_for(a.B * a.KVH, [&](int t) {
    const int b = t / a.KVH, kvh = t % a.KVH;
    const float* kbase = a.k + b * a.ks[0] + kvh * a.ks[1];
    float* kt = kts + t * kt_size;
    for (int jb = 0; jb < jblocks; ++jb) {
      const int j0 = jb * W, nj = imin(W, a.Lk - j0);
      for (int d0 = 0; d0 < D; d0 += W) {
        const int nd = imin(W, D - d0);
        V blk[W];
        for (int r = 0; r < W; ++r) {
          const float* kr = kbase + (j0 + r) * a.ks[2] + d0;
          blk[r] = r >= nj ? S::zero() : (nd == W ? S::load(kr) : S::load_n(kr, nd));
        }
        S::transpose(blk);
        for (int dd = 0; dd < nd; ++dd) S::store(kt + static_cast<int64_t>(d0 + dd) * kpad + j0, blk[dd]);
      }
    }
  });
  parallel_for(a.B * a.H * qblocks, [&](int t) {
    const int qb = t % qblocks, bh = t / qblocks;
    const int b = bh / a.H, h = bh % a.H, kvh = h / n_rep;
    const int i0 = qb * QB, i1 = imin(a.Lq, i0 + QB);
    const float* kt = kts + (static_cast<int64_t>(b) * a.KVH + kvh) * kt_size;
    float* qsb = scratch(kScratchAttn, static_cast<size_t>(RB) * D + RB * Dvp + RB * KB + 2 * RB);
    float* O = qsb + RB * D;
    float* Sb = O + RB * Dvp;
    float* mrow = Sb + RB * KB;
    float* lrow = mrow + RB;
    const float* vbase = a.v + b * a.vs[0] + kvh * a.vs[1];
    for (int ib = i0; ib < i1; ib += RB) {
      const int nr = imin(RB, i1 - ib);
      for (int r = 0; r < RB; ++r) {
        if (r < nr) {
          scale_into(qsb + r * D, a.q + b * a.qs[0] + h * a.qs[1] + (ib + r) * a.qs[2], a.scale, D);
        } else {
          for (int d = 0; d < D; ++d) qsb[r * D + d] = 0.0f;
        }
        mrow[r] = kNegInf;
        lrow[r] = 0.0f;
      }
      for (int e = 0; e < RB * Dvp; ++e) O[e] = 0.0f;
      const int jend = skip ? imin(a.Lk, ib + nr + offset) : a.Lk;
      for (int jb = 0; jb < jend; jb += KB) {
        V s[RB][2];
#pragma GCC unroll 8
        for (int r = 0; r < RB; ++r) s[r][0] = s[r][1] = S::zero();
        for (int d = 0; d < D; ++d) {
          const V k0 = S::load(kt + static_cast<int64_t>(d) * kpad + jb);
          const V k1 = S::load(kt + static_cast<int64_t>(d) * kpad + jb + W);
#pragma GCC unroll 8
          for (int r = 0; r < RB; ++r) {
            const V qv = S::set1(qsb[r * D + d]);
            s[r][0] = S::fma(qv, k0, s[r][0]);
            s[r][1] = S::fma(qv, k1, s[r][1]);
          }
        }
        for (int r = 0; r < RB; ++r) {
          S::store(Sb + r * KB, s[r][0]);
          S::store(Sb + r * KB + W, s[r][1]);
        }
        const int nk = imin(KB, a.Lk - jb);
        const bool need_mask = a.mask_kind != MaskKind::None || (a.causal && jb + KB - 1 > ib + offset);
        for (int r = 0; r < nr; ++r) {
          float* sr = Sb + r * KB;
          if (need_mask) apply_mask(a, b, h, ib + r, jb, nk, sr);
          for (int j = nk; j < KB; ++j) sr[j] = kNegInf;
          const float mx = vmax(sr, KB);
          const float mnew = mx > mrow[r] ? mx : mrow[r];
          const float corr = mrow[r] == kNegInf ? 0.0f : __builtin_expf(mrow[r] - mnew);
          const float sum = exp_sub_sum(sr, mnew, KB);
          lrow[r] = lrow[r] * corr + sum;
          mrow[r] = mnew;
          if (corr != 1.0f) scale_into(O + r * Dvp, O + r * Dvp, corr, Dvp);
        }
        for (int dv = 0; dv < Dv; dv += 2 * W) {
          const int w0 = imin(W, Dv - dv), w1 = imin(W, Dv - dv - W);
          V o[RB][2];
#pragma GCC unroll 8
          for (int r = 0; r < RB; ++r) {
            o[r][0] = S::load(O + r * Dvp + dv);
            o[r][1] = S::load(O + r * Dvp + dv + W);
          }
          for (int j = 0; j < nk; ++j) {
            const float* vj = vbase + (jb + j) * a.vs[2] + dv;
            const V v0 = w0 == W ? S::load(vj) : S::load_n(vj, w0);
            const V v1 = w1 >= W ? S::load(vj + W) : (w1 > 0 ? S::load_n(vj + W, w1) : S::zero());
#pragma GCC unroll 8
            for (int r = 0; r < RB; ++r) {
              const V pv = S::set1(Sb[r * KB + j]);
              o[r][0] = S::fma(pv, v0, o[r][0]);
              o[r][1] = S::fma(pv, v1, o[r][1]);
            }
          }
#pragma GCC unroll 8
          for (int r = 0; r < RB; ++r) {
            S::store(O + r * Dvp + dv, o[r][0]);
            S::store(O + r * Dvp + dv + W, o[r][1]);
          }
        }
      }
      for (int r = 0; r < nr; ++r) {
        float* o = a.out + b * a.os[0] + h * a.os[1] + (ib + r) * a.os[2];
        div_into(o, O + r * Dvp, lrow[r], Dv);
      }
    }
  });
}

void attention(const AttnArgs& a) {
  if (a.B == 0 || a.H == 0 || a.Lq == 0) return;
  if (a.Lk == 0) {
    // Softmax over no keys: MLX gives NaN (0/0); so do we.
    const int64_t n = static_cast<int64_t>(a.B) * a.H * a.Lq * a.Dv;
    for (int64_t e = 0; e < n; ++e) a.out[e] = __builtin_nanf("");
    return;
  }
  if (a.Lq <= 2) attention_dot(a); else attention_blocked(a);
}

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
