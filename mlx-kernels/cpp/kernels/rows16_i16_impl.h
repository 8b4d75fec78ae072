// The avx512vnni build's products of rows16 weights on int16 activations
// (vpdpwssd), included by rows16_impl.h inside `#if defined(MLXCEL_DOT_I16)`
// (isa_avx512vnni.cc defines it), in impl.h's namespace. Uses impl.h's and
// rows16_impl.h's helpers (imin, kRows16, kRows16Ahead, rows16_scales).
#pragma once
#include "mlxcel-mlx/cpp/kernels/rows16_i16_common.h"
// ---------------------------------------------------------------------------
// rows16 products on 16-bit integer activations (the avx512vnni build).
//
// The float rows16 kernel spends two FMAs per pair of k per row of x (after
// dequantizing each weight with an FMA of its own), so a batched decode step
// or a prefill is compute-bound at 16 multiply-adds per instruction. Here x
// is rounded once per call to int16 steps, one step per group of each row
// (dx = max|x| / 32767 over the group's gs elements, so each element is
// within dx/2 of x), and a 32-bit lane of the weights holds the codes of one
// row for a pair of k, widened to int16 (exact): vpdpwssd with the pair of x
// broadcast adds both products into that row's int32 lane, 32 multiply-adds
// per instruction, with no per-pair dequantization. The int32 sums are exact
// (at most 128 · 255 · 32767 < 2^31 per group), so only the group's epilogue
// rounds: acc += float(Σ q X) · (s · dx), then acc += b · Σx with the exact
// f32 sum of the group's x. Each row of x is quantized and summed on its own
// and the epilogue is the same for any number of rows, so a row's bits do
// not depend on the batch (decode batch invariance holds as in the float
// kernel), but they are not the float kernel's bits.

// Rows of x one pass of the micro-kernel carries (an int32 and an f32
// accumulator each, 24 of the 32 registers).
constexpr int kRows16I16MaxMM = 12;


// Row m of x as the kernel reads it: q [K] int16 codes in k order, dx [G] the
// group steps, xs [G] the exact group sums, and for outlier groups the
// rounding residual x - dx·q as codes q2 [K] with steps dx2 [G] (0 elsewhere:
// the kernel skips a group's second pass when no row of it has one).
inline void rows16_quantize_x(const float* x, int K, int gs, int16_t* q, float* dx, float* xs, int16_t* q2,
                              float* dx2) {
  const int G = K / gs;
  float mean = 0.0f;
  for (int g = 0; g < G; ++g) {
    const float* xg = x + static_cast<int64_t>(g) * gs;
    __m512 sum = _mm512_setzero_ps(), amax = _mm512_setzero_ps();
    for (int k = 0; k < gs; k += 16) {
      const __m512 v = _mm512_loadu_ps(xg + k);
      sum = _mm512_add_ps(sum, v);
      amax = _mm512_max_ps(amax, _mm512_abs_ps(v));
    }
    xs[g] = _mm512_reduce_add_ps(sum);
    dx[g] = _mm512_reduce_max_ps(amax);  // the group's max for now
    mean += dx[g];
  }
  mean /= static_cast<float>(G);
  for (int g = 0; g < G; ++g) {
    const float mx = dx[g];
    const float* xg = x + static_cast<int64_t>(g) * gs;
    const int64_t at = static_cast<int64_t>(g) * gs;
    const __m512 step = _mm512_set1_ps(mx / 32767.0f);
    const __m512 inv = _mm512_set1_ps(mx > 0.0f ? 32767.0f / mx : 0.0f);
    dx[g] = mx / 32767.0f;
    for (int k = 0; k < gs; k += 16) {
      const __m512i c = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xg + k), inv));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + at + k), _mm512_cvtepi32_epi16(c));
    }
    dx2[g] = 0.0f;
    if (!(mx > kRows16OutlierRatio * mean)) {
      // Zeros, in case another row of the batch takes this group's second pass.
      for (int k = 0; k < gs; k += 16) _mm256_storeu_si256(reinterpret_cast<__m256i*>(q2 + at + k), _mm256_setzero_si256());
      continue;
    }
    // The residual x - c·dx (exact in f32: |x - c·dx| <= dx/2), rounded to
    // int16 steps of its own.
    auto residual = [&](int k) {
      const __m512 v = _mm512_loadu_ps(xg + k);
      return _mm512_fnmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtps_epi32(_mm512_mul_ps(v, inv))), step, v);
    };
    __m512 rmax = _mm512_setzero_ps();
    for (int k = 0; k < gs; k += 16) rmax = _mm512_max_ps(rmax, _mm512_abs_ps(residual(k)));
    const float rm = _mm512_reduce_max_ps(rmax);
    const __m512 rinv = _mm512_set1_ps(rm > 0.0f ? 32767.0f / rm : 0.0f);
    dx2[g] = rm / 32767.0f;
    for (int k = 0; k < gs; k += 16) {
      const __m512i c = _mm512_cvtps_epi32(_mm512_mul_ps(residual(k), rinv));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q2 + at + k), _mm512_cvtepi32_epi16(c));
    }
  }
}

// The 16 rows' codes for k-pair j of a group (16 bytes of 4-bit pairs, or 2 x
// 16 bytes of 8-bit codes), as int16 pairs: lane i = code(k) | code(k+1) << 16.
template <int BITS>
inline __m512i rows16_pair_codes(const uint8_t* p, int j) {
  if constexpr (BITS == 4) {
    const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + j * kRows16)));
    // (v | v << 12) & 0x000F000F: the low nibble stays, the high one moves to bit 16.
    return _mm512_ternarylogic_epi32(v, _mm512_slli_epi32(v, 12), _mm512_set1_epi32(0x000F000F), 0xA8);
  } else {
    // 32 bytes: k's 16 codes, then k+1's; interleave them as 16-bit pairs.
    const __m512i v = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + j * 2 * kRows16)));
    const __m512i pairs = _mm512_setr_epi32(0x00100000, 0x00110001, 0x00120002, 0x00130003, 0x00140004, 0x00150005,
                                            0x00160006, 0x00170007, 0x00180008, 0x00190009, 0x001A000A, 0x001B000B,
                                            0x001C000C, 0x001D000D, 0x001E000E, 0x001F000F);
    return _mm512_permutexvar_epi16(pairs, v);
  }
}

// Sums Σ code·X over one group's pairs for NB row blocks (codes at p[r]) and
// MM rows of int16 x (this group's pairs of row m at xg + m * K / 2), NA
// int32 accumulators per output taking alternate pairs, so that a single row
// still has independent chains.
template <int BITS, int MM, int NB, int NA>
inline void rows16_group_i16(const uint8_t* const (&p)[NB], const int32_t* xg, int K, int gs, bool prefetch,
                             __m512i (&sum)[NB][MM]) {
  constexpr int kPairBytes = BITS == 4 ? kRows16 : 2 * kRows16;  // weights of one k-pair of 16 rows
  constexpr int kPairsPerLine = 64 / kPairBytes;
  __m512i ia[NA][NB][MM];
#pragma GCC unroll 2
  for (int h = 0; h < NA; ++h)
#pragma GCC unroll 4
    for (int r = 0; r < NB; ++r)
#pragma GCC unroll 16
      for (int m = 0; m < MM; ++m) ia[h][r][m] = _mm512_setzero_si512();
  for (int j = 0; j < gs / 2; j += NA) {
    if (prefetch && j % kPairsPerLine < NA) {
#pragma GCC unroll 4
      for (int r = 0; r < NB; ++r) S::prefetch(p[r] + j * kPairBytes + kRows16Ahead);
    }
#pragma GCC unroll 2
    for (int h = 0; h < NA; ++h) {
#pragma GCC unroll 4
      for (int r = 0; r < NB; ++r) {
        const __m512i wv = rows16_pair_codes<BITS>(p[r], j + h);
#pragma GCC unroll 16
        for (int m = 0; m < MM; ++m)
          ia[h][r][m] =
              _mm512_dpwssd_epi32(ia[h][r][m], wv, _mm512_set1_epi32(xg[static_cast<int64_t>(m) * (K / 2) + j + h]));
      }
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < NB; ++r)
#pragma GCC unroll 16
    for (int m = 0; m < MM; ++m) {
      sum[r][m] = ia[0][r][m];
#pragma GCC unroll 2
      for (int h = 1; h < NA; ++h) sum[r][m] = _mm512_add_epi32(sum[r][m], ia[h][r][m]);
    }
}


// Row blocks t0 .. t0 + NB of W against MM rows of int16 x; outputs at
// `out`, stride ldo, column t * 16.
template <int BITS, int ST, int MM, int NB, int NA>
void rows16_block_i16(const QmmArgs& a, int t0, const Rows16X& x, float* out, int64_t ldo) {
  const int K = a.K, gs = a.group_size, G = K / gs;
  const int64_t block_bytes = static_cast<int64_t>(K) * BITS / 8 * kRows16;
  const int64_t group_bytes = static_cast<int64_t>(gs) * BITS / 8 * kRows16;
  const uint8_t* w = static_cast<const uint8_t*>(a.w);
  __m512 acc[NB][MM];
#pragma GCC unroll 4
  for (int r = 0; r < NB; ++r)
#pragma GCC unroll 16
    for (int m = 0; m < MM; ++m) acc[r][m] = _mm512_setzero_ps();
  for (int g = 0; g < G; ++g) {
    V s[NB], b[NB];
    const uint8_t* p[NB];
#pragma GCC unroll 4
    for (int r = 0; r < NB; ++r) {
      const int64_t at = (static_cast<int64_t>(t0 + r) * G + g) * kRows16;
      rows16_scales<ST>(a.scales, at, &s[r]);
      rows16_scales<ST>(a.biases, at, &b[r]);
      p[r] = w + (t0 + r) * block_bytes + g * group_bytes;
    }
    __m512i sum[NB][MM];
    rows16_group_i16<BITS, MM, NB, NA>(p, reinterpret_cast<const int32_t*>(x.q + static_cast<int64_t>(g) * gs), K, gs,
                                       true, sum);
#pragma GCC unroll 4
    for (int r = 0; r < NB; ++r)
#pragma GCC unroll 16
      for (int m = 0; m < MM; ++m) {
        const int64_t mg = static_cast<int64_t>(m) * G + g;
        acc[r][m] =
            _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[r][m]), _mm512_mul_ps(s[r], _mm512_set1_ps(x.dx[mg])), acc[r][m]);
        acc[r][m] = _mm512_fmadd_ps(b[r], _mm512_set1_ps(x.xs[mg]), acc[r][m]);
      }
    // The outlier groups' residuals: a second pass where any row has one (the
    // others' residual codes are zeros).
    bool residual = false;
#pragma GCC unroll 16
    for (int m = 0; m < MM; ++m) residual |= x.dx2[static_cast<int64_t>(m) * G + g] != 0.0f;
    if (!residual) continue;
    rows16_group_i16<BITS, MM, NB, NA>(p, reinterpret_cast<const int32_t*>(x.q2 + static_cast<int64_t>(g) * gs), K,
                                       gs, false, sum);
#pragma GCC unroll 4
    for (int r = 0; r < NB; ++r)
#pragma GCC unroll 16
      for (int m = 0; m < MM; ++m) {
        const float d2 = x.dx2[static_cast<int64_t>(m) * G + g];
        if (d2 != 0.0f)
          acc[r][m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[r][m]), _mm512_mul_ps(s[r], _mm512_set1_ps(d2)), acc[r][m]);
      }
  }
  for (int r = 0; r < NB; ++r)
    for (int m = 0; m < MM; ++m) _mm512_storeu_ps(out + m * ldo + (t0 + r) * kRows16, acc[r][m]);
}

// Row blocks t0 .. t1 against MM rows: 4 blocks at a time for one row of x, 2
// for two (independent accumulators to cover vpdpwssd's latency), else 1.
template <int BITS, int ST, int MM>
void rows16_rows_i16(const QmmArgs& a, int t0, int t1, const Rows16X& x, float* out) {
  constexpr int NB = MM == 1 ? 4 : (MM == 2 ? 2 : 1);
  constexpr int NA = MM <= 2 ? 2 : 1;
  int t = t0;
  for (; t + NB <= t1; t += NB) rows16_block_i16<BITS, ST, MM, NB, NA>(a, t, x, out, a.ldo);
  for (; t < t1; ++t) rows16_block_i16<BITS, ST, MM, 1, NA>(a, t, x, out, a.ldo);
}
