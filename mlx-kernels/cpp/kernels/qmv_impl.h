// The quantized matvec (decode shapes) of the generic kernels, included by
// impl.h inside each ISA's namespace; uses impl.h's helpers (imin, W, V,
// scratch, parallel_for). In the avx512vnni build it includes i16_impl.h.
#pragma once

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

// Step i < 2R of a block's software prefetch (SpreadPrefetch) also fetches the
// first and last scale (even i) or bias (odd i) of row `row + i / 2`.
inline void prefetch_row_scales(const QmmArgs& a, int64_t row, int i) {
  const int G = a.K / a.group_size;
  const int es = a.scale_type == kScaleF32 ? 4 : 2;
  const char* sp = static_cast<const char*>(i & 1 ? a.biases : a.scales) + (row + i / 2) * G * es;
  S::prefetch(sp);
  S::prefetch(sp + (G - 1) * es);
}

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
  // The block kQmvAhead blocks ahead, spread over the groups.
  const int ahead = kQmvAhead * R;
  const bool fetch = n + ahead + R <= a.N;
  const SpreadPrefetch pf(fetch ? wb + ahead * row_bytes : nullptr, R * row_bytes, G);
  for (int g = 0; g < G; ++g) {
    const float* xg = xp + static_cast<int64_t>(g) * GS;
    pf.step(g);
    if (fetch && g < 2 * R) prefetch_row_scales(a, n + ahead, g);
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
