// The avx512vnni build's quantized matvec on int16 activations (vpdpwssd),
// included by qmv_impl.h inside `#if defined(MLXCEL_DOT_I16)` (isa_avx512vnni.cc
// defines it), in impl.h's namespace, after the float matvec it replaces for
// 4- and 8-bit weights. Uses impl.h's and qmv_impl.h's helpers (imin,
// SpreadPrefetch, kQmvAhead, prefetch_row_scales, S::mask).
#pragma once
// ---------------------------------------------------------------------------
// Quantized matvec on 16-bit integer activations (the avx512vnni build).
//
// impl.h's float path (qmv_rows) spends ~5 cycles per group of 32 4-bit weights turning
// codes into floats, so a decode matvec runs at ~14 GB/s per core from cache:
// compute-bound, below DRAM bandwidth. Here x is rounded once per call to
// int16 steps, codes are widened to int16 (exact), and vpdpwssd sums code·x
// pairs straight into int32 lanes (no overflow: at most 128 · 255 · 32767 <
// 2^31 per group). Each int32 lane sums the products of 4 elements of x (4-bit)
// or 2 (8-bit), and each such block has its own step dx = max|x| / 32767, so
// every element is within dx/2 of x and an outlier of the activations (LLM
// residual streams have channels 100× the rest) coarsens only its own block.
// A lane's sum is scaled by its group's scale times its block's dx; the bias
// term b · Σx uses the exact f32 sums of x. 16-bit scales are widened as they
// are loaded (no scratch pass).

// Elements of x (and codes) per 32 bytes of codes.
template <int BITS>
constexpr int kI16Chunk = BITS == 4 ? 64 : 32;

// Elements of x per int32 lane of the kernel (the block one dx covers).
template <int BITS>
constexpr int kI16Block = BITS == 4 ? 4 : 2;

// |x| of 16 elements with each block's largest in all of the block's lanes.
template <int BITS>
inline __m512 block_max(__m512 v) {
  v = _mm512_abs_ps(v);
  v = _mm512_max_ps(v, _mm512_permute_ps(v, 0xB1));  // swap neighbours
  if constexpr (BITS == 4) v = _mm512_max_ps(v, _mm512_permute_ps(v, 0x4E));  // swap pairs
  return v;
}

// x · (32767 / block max) rounded to nearest-even: within [-32767, 32767].
inline __m512i step_codes(__m512 v, __m512 bmax) {
  const __mmask16 nz = _mm512_cmp_ps_mask(bmax, _mm512_setzero_ps(), _CMP_GT_OQ);
  const __m512 inv = _mm512_maskz_div_ps(nz, _mm512_set1_ps(32767.0f), bmax);
  return _mm512_cvtps_epi32(_mm512_mul_ps(v, inv));
}

// One row of x as the int16 kernel reads it: codes q in the order of the
// weights' nibbles (4-bit: per 64 elements, the 32 even ones, then the 32 odd
// ones; 8-bit: as is), the step of each block (lane order: 16 per chunk) and
// the exact sum of each group.
template <int BITS>
inline void quantize_x_i16(const float* x, int K, int gs, int16_t* q, float* dx, float* xs) {
  const int G = K / gs;
  for (int g = 0; g < G; ++g) {
    __m512 sum = _mm512_setzero_ps();
    for (int k = g * gs; k < (g + 1) * gs; k += 16) sum = _mm512_add_ps(sum, _mm512_loadu_ps(x + k));
    xs[g] = _mm512_reduce_add_ps(sum);
  }
  const __m512 step = _mm512_set1_ps(1.0f / 32767.0f);
  if constexpr (BITS == 4) {
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    const __m512i firsts = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 0, 0, 0, 0, 0, 0, 0);
    for (int c = 0; c < K; c += 64) {
      __m512 v[4], m[4];
      __m512i e[4];
      for (int i = 0; i < 4; ++i) {
        v[i] = _mm512_loadu_ps(x + c + 16 * i);
        m[i] = block_max<BITS>(v[i]);
        e[i] = step_codes(v[i], m[i]);
      }
      __m256i* out = reinterpret_cast<__m256i*>(q + c);
      _mm256_storeu_si256(out + 0, _mm512_cvtepi32_epi16(_mm512_permutex2var_epi32(e[0], even, e[1])));
      _mm256_storeu_si256(out + 1, _mm512_cvtepi32_epi16(_mm512_permutex2var_epi32(e[2], even, e[3])));
      _mm256_storeu_si256(out + 2, _mm512_cvtepi32_epi16(_mm512_permutex2var_epi32(e[0], odd, e[1])));
      _mm256_storeu_si256(out + 3, _mm512_cvtepi32_epi16(_mm512_permutex2var_epi32(e[2], odd, e[3])));
      // Lane i of the chunk sums elements 4i .. 4i+3.
      const __m512 lo = _mm512_permutex2var_ps(m[0], firsts, m[1]), hi = _mm512_permutex2var_ps(m[2], firsts, m[3]);
      _mm512_storeu_ps(dx + c / 4, _mm512_mul_ps(_mm512_shuffle_f32x4(lo, hi, 0x44), step));
    }
  } else {
    const __m512i evens = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    for (int c = 0; c < K; c += 32) {
      const __m512 v0 = _mm512_loadu_ps(x + c), v1 = _mm512_loadu_ps(x + c + 16);
      const __m512 m0 = block_max<BITS>(v0), m1 = block_max<BITS>(v1);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + c), _mm512_cvtepi32_epi16(step_codes(v0, m0)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + c + 16), _mm512_cvtepi32_epi16(step_codes(v1, m1)));
      // Lane i of the chunk sums elements 2i and 2i+1.
      _mm512_storeu_ps(dx + c / 2, _mm512_mul_ps(_mm512_permutex2var_ps(m0, evens, m1), step));
    }
  }
}

// 16 scales of `type` from p[i..] as f32 (the lanes past n are zero).
inline __m512 load_scales16(const void* p, int64_t i, int n, int type) {
  const __mmask16 k = S::mask(n < 16 ? n : 16);
  if (type == kScaleF32) return _mm512_maskz_loadu_ps(k, static_cast<const float*>(p) + i);
  const __m256i h = _mm256_maskz_loadu_epi16(k, static_cast<const uint16_t*>(p) + i);
  return type == kScaleF16 ? _mm512_cvtph_ps(h) : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// Rows n .. n+R of W (4- or 8-bit) against MM rows of int16 x. Groups are
// taken 16 at a time: their scales fill one vector per row, from which each
// chunk picks its lanes with one permute, and the bias term of the 16 is one
// FMA per x row.
template <int BITS, int GS, int R, int MM>
inline void qmv_rows_i16(const QmmArgs& a, int n, const int16_t* xq, const float* dx, const float* xs, float* out) {
  constexpr int CHUNK = kI16Chunk<BITS>;
  constexpr int GPC = GS < CHUNK ? CHUNK / GS : 1;  // groups per chunk (2: 4-bit, group 32)
  constexpr int CPG = GS >= CHUNK ? GS / CHUNK : 1;  // chunks per group
  static_assert(GPC <= 2, "at most two groups per chunk");
  const int K = a.K, G = K / GS, NC = K / CHUNK;
  const int64_t row_bytes = static_cast<int64_t>(K) * BITS / 8;
  const uint8_t* wb = static_cast<const uint8_t*>(a.w) + static_cast<int64_t>(n) * row_bytes;
  const int st = a.scale_type;
  const int64_t srow = static_cast<int64_t>(n) * G;
  __m512 tot[R][MM];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int m = 0; m < MM; ++m) tot[r][m] = _mm512_setzero_ps();
  const __m512i low4 = _mm512_set1_epi16(15);
  // Lanes 0-7 take the first group of a chunk, lanes 8-15 the second.
  const __m512i halves = GPC == 2 ? _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1)
                                  : _mm512_setzero_si512();
  // The block kQmvAhead blocks ahead, spread over the chunks.
  const int ahead = kQmvAhead * R;
  const bool fetch = n + ahead + R <= a.N;
  const SpreadPrefetch pf(fetch ? wb + ahead * row_bytes : nullptr, R * row_bytes, NC);
  const int64_t DXR = static_cast<int64_t>(K) / kI16Block<BITS>;  // steps per row of x
  for (int g0 = 0; g0 < G; g0 += 16) {
    const int ng = imin(16, G - g0);
    __m512 s16[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      s16[r] = load_scales16(a.scales, srow + r * G + g0, ng, st);
      const __m512 b16 = load_scales16(a.biases, srow + r * G + g0, ng, st);
      const __mmask16 k = S::mask(ng);
#pragma GCC unroll 8
      for (int m = 0; m < MM; ++m)
        tot[r][m] = _mm512_fmadd_ps(b16, _mm512_maskz_loadu_ps(k, xs + m * G + g0), tot[r][m]);
    }
    const int c0 = g0 * CPG / GPC, c1 = imin(NC, (g0 + 16) * CPG / GPC);
    for (int c = c0; c < c1; ++c) {
      pf.step(c);
      if (fetch && c < 2 * R) prefetch_row_scales(a, n + ahead, c);
      // This chunk's group(s) among the 16.
      const __m512i idx = _mm512_add_epi32(halves, _mm512_set1_epi32((c - c0) * GPC / CPG));
      const int16_t* xc = xq + static_cast<int64_t>(c) * CHUNK;
      const float* dc = dx + static_cast<int64_t>(c) * 16;
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m512i d = _mm512_cvtepu8_epi16(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + r * row_bytes + static_cast<int64_t>(c) * 32)));
        __m512i acc[MM];
        if constexpr (BITS == 4) {
          const __m512i lo = _mm512_and_si512(d, low4), hi = _mm512_srli_epi16(d, 4);
#pragma GCC unroll 8
          for (int m = 0; m < MM; ++m) {
            const int16_t* xm = xc + static_cast<int64_t>(m) * K;
            acc[m] = _mm512_dpwssd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(xm));
            acc[m] = _mm512_dpwssd_epi32(acc[m], hi, _mm512_loadu_si512(xm + 32));
          }
        } else {
#pragma GCC unroll 8
          for (int m = 0; m < MM; ++m)
            acc[m] = _mm512_dpwssd_epi32(_mm512_setzero_si512(), d, _mm512_loadu_si512(xc + static_cast<int64_t>(m) * K));
        }
        // Lane sums times their blocks' steps, times their groups' scales.
        const __m512 sv = _mm512_permutexvar_ps(idx, s16[r]);
#pragma GCC unroll 8
        for (int m = 0; m < MM; ++m)
          tot[r][m] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(acc[m]), _mm512_loadu_ps(dc + m * DXR)), sv,
                                      tot[r][m]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int m = 0; m < MM; ++m) out[static_cast<int64_t>(m) * a.ldo + n + r] = _mm512_reduce_add_ps(tot[r][m]);
}

template <int BITS, int GS, int MM>
void qmv_range_i16(const QmmArgs& a, int n0, int n1, const int16_t* xq, const float* dx, const float* xs, float* out) {
  constexpr int R = MM == 1 ? 4 : (MM == 2 ? 2 : 1);
  int n = n0;
  for (; n + R <= n1; n += R) qmv_rows_i16<BITS, GS, R, MM>(a, n, xq, dx, xs, out);
  for (; n < n1; ++n) qmv_rows_i16<BITS, GS, 1, MM>(a, n, xq, dx, xs, out);
}

template <int BITS, int GS>
void qmv_i16_m(const QmmArgs& a, int mm, int n0, int n1, const int16_t* xq, const float* dx, const float* xs,
               float* out) {
  switch (mm) {
    case 1: qmv_range_i16<BITS, GS, 1>(a, n0, n1, xq, dx, xs, out); break;
    case 2: qmv_range_i16<BITS, GS, 2>(a, n0, n1, xq, dx, xs, out); break;
    case 3: qmv_range_i16<BITS, GS, 3>(a, n0, n1, xq, dx, xs, out); break;
    case 4: qmv_range_i16<BITS, GS, 4>(a, n0, n1, xq, dx, xs, out); break;
    case 5: qmv_range_i16<BITS, GS, 5>(a, n0, n1, xq, dx, xs, out); break;
    case 6: qmv_range_i16<BITS, GS, 6>(a, n0, n1, xq, dx, xs, out); break;
    case 7: qmv_range_i16<BITS, GS, 7>(a, n0, n1, xq, dx, xs, out); break;
    default: qmv_range_i16<BITS, GS, 8>(a, n0, n1, xq, dx, xs, out); break;
  }
}

template <int BITS>
void qmv_i16(const QmmArgs& a, int mm, int n0, int n1, const int16_t* xq, const float* dx, const float* xs,
             float* out) {
  switch (a.group_size) {
    case 32: qmv_i16_m<BITS, 32>(a, mm, n0, n1, xq, dx, xs, out); break;
    case 64: qmv_i16_m<BITS, 64>(a, mm, n0, n1, xq, dx, xs, out); break;
    default: qmv_i16_m<BITS, 128>(a, mm, n0, n1, xq, dx, xs, out); break;
  }
}
