// The AVX2 build's products of rows16 weights on int16 activations
// (vpmaddwd), included by rows16_impl.h inside `#if defined(MLXCEL_ROWS16_I16_AVX2)`
// (isa_avx2i16.cc defines it), in impl.h's namespace. Uses impl.h's and
// rows16_impl.h's helpers (imin, kRows16, kRows16Ahead, rows16_scales).
#pragma once
#include "mlxcel-mlx/cpp/kernels/rows16_i16_common.h"
// ---------------------------------------------------------------------------
// rows16 products on 16-bit integer activations without AVX-512.
//
// The same arithmetic as the avx512vnni kernel (rows16_i16_impl.h): x rounded
// once per call to int16 steps, one step per group of each row (plus a second
// pass of the rounding residual for outlier groups), the codes of one row for
// a pair of k held as two int16 in a 32-bit lane, exact int32 sums per group,
// and the same epilogue, acc += float(Σ q X) · (s · dx), then acc += b · Σx.
// What differs is the instruction: AVX2 has no vpdpwssd, so a pair is
// `vpmaddwd` (both products of the pair, summed into the lane) and `vpaddd`,
// 8 rows a vector. Against the float kernel (rows16_impl.h), which spends a
// conversion and an FMA per code to dequantize and another FMA per code and
// row of x, a pair of k for 16 rows costs here 5 integer operations to unpack
// (shared by every row of x) and 4 per row of x, none on the FMA ports:
// decode (one row of x) is compute-bound on AVX2, so this is where it gains.
//
// Lane order: the 16-bit unpack interleaves within 128-bit halves, so a
// vector holds rows {0-3, 8-11} (half 0) or {4-7, 12-15} (half 1); the scales
// and biases are permuted the same way once per group and the outputs back
// once per row block.

// Rows of x one pass of the micro-kernel carries: two int32 and two f32
// accumulators each (12 of the 16 registers at 3 rows).
constexpr int kRows16I16MaxMM = 3;

// 16 floats at v0 (first 8) and v1 as int16 codes (round to nearest even), in order.
inline void rows16_store_i16(int16_t* q, __m256 v0, __m256 v1) {
  const __m256i packed = _mm256_packs_epi32(_mm256_cvtps_epi32(v0), _mm256_cvtps_epi32(v1));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), _mm256_permute4x64_epi64(packed, 0xD8));
}

// Row m of x as the kernel reads it (Rows16X, rows16_i16_common.h), as the
// avx512vnni build's rows16_quantize_x computes it.
inline void rows16_quantize_x(const float* x, int K, int gs, int16_t* q, float* dx, float* xs, int16_t* q2,
                              float* dx2) {
  const int G = K / gs;
  float mean = 0.0f;
  for (int g = 0; g < G; ++g) {
    const float* xg = x + static_cast<int64_t>(g) * gs;
    __m256 sum = _mm256_setzero_ps(), amax = _mm256_setzero_ps();
    for (int k = 0; k < gs; k += 8) {
      const __m256 v = _mm256_loadu_ps(xg + k);
      sum = _mm256_add_ps(sum, v);
      amax = _mm256_max_ps(amax, S::abs(v));
    }
    xs[g] = S::hsum(sum);
    dx[g] = S::hmax(amax);  // the group's max for now
    mean += dx[g];
  }
  mean /= static_cast<float>(G);
  for (int g = 0; g < G; ++g) {
    const float mx = dx[g];
    const float* xg = x + static_cast<int64_t>(g) * gs;
    const int64_t at = static_cast<int64_t>(g) * gs;
    const __m256 step = _mm256_set1_ps(mx / 32767.0f);
    const __m256 inv = _mm256_set1_ps(mx > 0.0f ? 32767.0f / mx : 0.0f);
    dx[g] = mx / 32767.0f;
    for (int k = 0; k < gs; k += 16)
      rows16_store_i16(q + at + k, _mm256_mul_ps(_mm256_loadu_ps(xg + k), inv),
                       _mm256_mul_ps(_mm256_loadu_ps(xg + k + 8), inv));
    dx2[g] = 0.0f;
    if (!(mx > kRows16OutlierRatio * mean)) {
      // Zeros, in case another row of the batch takes this group's second pass.
      for (int k = 0; k < gs; k += 16) _mm256_storeu_si256(reinterpret_cast<__m256i*>(q2 + at + k), _mm256_setzero_si256());
      continue;
    }
    // The residual x - c·dx (exact in f32: |x - c·dx| <= dx/2), rounded to
    // int16 steps of its own.
    auto residual = [&](int k) {
      const __m256 v = _mm256_loadu_ps(xg + k);
      return _mm256_fnmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtps_epi32(_mm256_mul_ps(v, inv))), step, v);
    };
    __m256 rmax = _mm256_setzero_ps();
    for (int k = 0; k < gs; k += 8) rmax = _mm256_max_ps(rmax, S::abs(residual(k)));
    const float rm = S::hmax(rmax);
    const __m256 rinv = _mm256_set1_ps(rm > 0.0f ? 32767.0f / rm : 0.0f);
    dx2[g] = rm / 32767.0f;
    for (int k = 0; k < gs; k += 16)
      rows16_store_i16(q2 + at + k, _mm256_mul_ps(residual(k), rinv), _mm256_mul_ps(residual(k + 8), rinv));
  }
}

// The 16 rows' codes for k-pair j of a group (16 bytes of 4-bit pairs, or 2 x
// 16 bytes of 8-bit codes) as int16 pairs, lane = code(k) | code(k+1) << 16:
// h[0] rows {0-3, 8-11}, h[1] rows {4-7, 12-15}.
template <int BITS>
inline void rows16_pair_codes_avx2(const uint8_t* p, int j, __m256i (&h)[2]) {
  __m256i even, odd;
  if constexpr (BITS == 4) {
    const __m256i v = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + j * kRows16)));
    even = _mm256_and_si256(v, _mm256_set1_epi16(15));
    odd = _mm256_srli_epi16(v, 4);
  } else {
    even = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + j * 2 * kRows16)));
    odd = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + j * 2 * kRows16 + kRows16)));
  }
  h[0] = _mm256_unpacklo_epi16(even, odd);
  h[1] = _mm256_unpackhi_epi16(even, odd);
}

// Sums Σ code·X over one group's pairs for NB row blocks (codes at p[r]) and
// MM rows of int16 x (this group's pairs of row m at xg + m * K / 2).
template <int BITS, int MM, int NB>
inline void rows16_group_i16(const uint8_t* const (&p)[NB], const int32_t* xg, int K, int gs, bool prefetch,
                             __m256i (&sum)[NB][2][MM]) {
  constexpr int kPairBytes = BITS == 4 ? kRows16 : 2 * kRows16;  // weights of one k-pair of 16 rows
  constexpr int kPairsPerLine = 64 / kPairBytes;
#pragma GCC unroll 4
  for (int r = 0; r < NB; ++r)
    for (int h = 0; h < 2; ++h)
#pragma GCC unroll 4
      for (int m = 0; m < MM; ++m) sum[r][h][m] = _mm256_setzero_si256();
  for (int j = 0; j < gs / 2; ++j) {
    if (prefetch && j % kPairsPerLine == 0) {
#pragma GCC unroll 4
      for (int r = 0; r < NB; ++r) S::prefetch(p[r] + j * kPairBytes + kRows16Ahead);
    }
#pragma GCC unroll 4
    for (int r = 0; r < NB; ++r) {
      __m256i w[2];
      rows16_pair_codes_avx2<BITS>(p[r], j, w);
#pragma GCC unroll 4
      for (int m = 0; m < MM; ++m) {
        const __m256i xm = _mm256_set1_epi32(xg[static_cast<int64_t>(m) * (K / 2) + j]);
        sum[r][0][m] = _mm256_add_epi32(sum[r][0][m], _mm256_madd_epi16(w[0], xm));
        sum[r][1][m] = _mm256_add_epi32(sum[r][1][m], _mm256_madd_epi16(w[1], xm));
      }
    }
  }
}


// A group's 16 scales (or biases) of row block t in the kernel's lane order.
template <int ST>
inline void rows16_scales_i16(const void* p, int64_t at, __m256 (&h)[2]) {
  V v[2];
  rows16_scales<ST>(p, at, v);
  h[0] = _mm256_permute2f128_ps(v[0], v[1], 0x20);
  h[1] = _mm256_permute2f128_ps(v[0], v[1], 0x31);
}

// Row blocks t0 .. t0 + NB of W against MM rows of int16 x; outputs at
// `out`, stride ldo, column t * 16.
template <int BITS, int ST, int MM, int NB>
void rows16_block_i16(const QmmArgs& a, int t0, const Rows16X& x, float* out, int64_t ldo) {
  const int K = a.K, gs = a.group_size, G = K / gs;
  const int64_t block_bytes = static_cast<int64_t>(K) * BITS / 8 * kRows16;
  const int64_t group_bytes = static_cast<int64_t>(gs) * BITS / 8 * kRows16;
  const uint8_t* w = static_cast<const uint8_t*>(a.w);
  __m256 acc[NB][2][MM];
#pragma GCC unroll 4
  for (int r = 0; r < NB; ++r)
    for (int h = 0; h < 2; ++h)
#pragma GCC unroll 4
      for (int m = 0; m < MM; ++m) acc[r][h][m] = _mm256_setzero_ps();
  for (int g = 0; g < G; ++g) {
    const uint8_t* p[NB];
#pragma GCC unroll 4
    for (int r = 0; r < NB; ++r) p[r] = w + (t0 + r) * block_bytes + g * group_bytes;
    __m256i sum[NB][2][MM];
    rows16_group_i16<BITS, MM, NB>(p, reinterpret_cast<const int32_t*>(x.q + static_cast<int64_t>(g) * gs), K, gs,
                                   true, sum);
    __m256 s[NB][2];
#pragma GCC unroll 4
    for (int r = 0; r < NB; ++r) {
      const int64_t at = (static_cast<int64_t>(t0 + r) * G + g) * kRows16;
      __m256 b[2];
      rows16_scales_i16<ST>(a.scales, at, s[r]);
      rows16_scales_i16<ST>(a.biases, at, b);
      for (int h = 0; h < 2; ++h)
#pragma GCC unroll 4
        for (int m = 0; m < MM; ++m) {
          const int64_t mg = static_cast<int64_t>(m) * G + g;
          acc[r][h][m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[r][h][m]),
                                         _mm256_mul_ps(s[r][h], _mm256_set1_ps(x.dx[mg])), acc[r][h][m]);
          acc[r][h][m] = _mm256_fmadd_ps(b[h], _mm256_set1_ps(x.xs[mg]), acc[r][h][m]);
        }
    }
    // The outlier groups' residuals: a second pass where any row has one (the
    // others' residual codes are zeros).
    bool residual = false;
#pragma GCC unroll 4
    for (int m = 0; m < MM; ++m) residual |= x.dx2[static_cast<int64_t>(m) * G + g] != 0.0f;
    if (!residual) continue;
    rows16_group_i16<BITS, MM, NB>(p, reinterpret_cast<const int32_t*>(x.q2 + static_cast<int64_t>(g) * gs), K, gs,
                                   false, sum);
#pragma GCC unroll 4
    for (int r = 0; r < NB; ++r)
      for (int h = 0; h < 2; ++h)
#pragma GCC unroll 4
        for (int m = 0; m < MM; ++m) {
          const float d2 = x.dx2[static_cast<int64_t>(m) * G + g];
          if (d2 != 0.0f)
            acc[r][h][m] =
                _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[r][h][m]), _mm256_mul_ps(s[r][h], _mm256_set1_ps(d2)), acc[r][h][m]);
        }
  }
  for (int r = 0; r < NB; ++r)
    for (int m = 0; m < MM; ++m) {
      float* o = out + m * ldo + (t0 + r) * kRows16;
      _mm256_storeu_ps(o, _mm256_permute2f128_ps(acc[r][0][m], acc[r][1][m], 0x20));
      _mm256_storeu_ps(o + 8, _mm256_permute2f128_ps(acc[r][0][m], acc[r][1][m], 0x31));
    }
}

// Row blocks t0 .. t1 against MM rows: 2 blocks at a time for one row of x
// (more loads in flight while the weights stream), else 1.
template <int BITS, int ST, int MM>
void rows16_rows_i16(const QmmArgs& a, int t0, int t1, const Rows16X& x, float* out) {
  constexpr int NB = MM == 1 ? 2 : 1;
  int t = t0;
  for (; t + NB <= t1; t += NB) rows16_block_i16<BITS, ST, MM, NB>(a, t, x, out, a.ldo);
  for (; t < t1; ++t) rows16_block_i16<BITS, ST, MM, 1>(a, t, x, out, a.ldo);
}
