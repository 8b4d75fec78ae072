// The AVX-512 SIMD layer (16 f32 lanes). Included only by isa_avx512.cc, inside
// its `#pragma GCC target` region and its own namespace.
#pragma once

struct S {
  static constexpr int W = 16;
  // GEMM micro-tile: 12 rows of x by 2 vectors (32 outputs): 24 accumulators.
  static constexpr int GEMM_MR = 12;
  static constexpr int GEMM_NV = 2;
  // Attention tile rows (queries) per pass: 8 rows by 2 vectors of keys.
  // Rows of x the rows16 micro-kernel keeps in registers (rows16_impl.h).
  static constexpr int TILE_MM = 16;
  static constexpr int ATT_RB = 8;
  using V = __m512;

  static inline V zero() { return _mm512_setzero_ps(); }
  static inline V set1(float x) { return _mm512_set1_ps(x); }
  static inline V load(const float* p) { return _mm512_loadu_ps(p); }
  static inline void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static inline __mmask16 mask(int n) { return static_cast<__mmask16>((1u << n) - 1u); }
  static inline V load_n(const float* p, int n) { return _mm512_maskz_loadu_ps(mask(n), p); }
  static inline void store_n(float* p, V v, int n) { _mm512_mask_storeu_ps(p, mask(n), v); }
  static inline V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static inline V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static inline V add(V a, V b) { return _mm512_add_ps(a, b); }
  static inline V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static inline V div(V a, V b) { return _mm512_div_ps(a, b); }
  static inline V max(V a, V b) { return _mm512_max_ps(a, b); }
  static inline V abs(V a) { return _mm512_abs_ps(a); }
  static inline float hsum(V v) { return _mm512_reduce_add_ps(v); }
  static inline float hmax(V v) { return _mm512_reduce_max_ps(v); }
  // r = (a < 0) ? x : y
  static inline V select_neg(V a, V x, V y) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, zero(), _CMP_LT_OQ), y, x);
  }

  // MLX's CPU exp (mlx/backend/cpu/simd/math.h), lane for lane: a Cephes
  // polynomial for 2^frac and the exponent in the bits. Same constants and
  // operation order, so the results are MLX's.
  static inline V exp(V x0) {
    V x = _mm512_mul_ps(x0, set1(1.442695f));
    V ip = _mm512_roundscale_ps(_mm512_add_ps(x, set1(0.5f)), _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    V f = _mm512_sub_ps(x, ip);
    V p = set1(kExp2Poly[0]);
#pragma GCC unroll 6
    for (int i = 1; i < 7; ++i) p = fma(p, f, set1(kExp2Poly[i]));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(ip), _mm512_set1_epi32(127)), 23);
    V r = _mm512_mul_ps(_mm512_castsi512_ps(e), p);
    r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x0, x0, _CMP_UNORD_Q), r, x0);
    r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x0, set1(88.0f), _CMP_GT_OQ), r,
                             set1(__builtin_huge_valf()));
    r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x0, set1(-88.0f), _CMP_LT_OQ), r, zero());
    return r;
  }

  // Moves the low bits of `v` to the set bits of `mask`, in order.
  static inline uint64_t pdep(uint64_t v, uint64_t mask) { return _pdep_u64(v, mask); }
  // W bytes held in W / 8 words (low byte first), as floats.
  static inline V u8x(const uint64_t* u) { return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_set_epi64x(static_cast<long long>(u[1]), static_cast<long long>(u[0])))); }
  // W bytes -> W floats.
  static inline V u8(const uint8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  // W bytes -> their low nibbles and their high nibbles, as floats.
  static inline void nib(const uint8_t* p, V& lo, V& hi) {
    __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    lo = _mm512_cvtepi32_ps(_mm512_and_si512(d, _mm512_set1_epi32(15)));
    hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(d, 4));
  }

  // 4-bit codes through a 16-entry table: vpermps reads the low 4 bits of each
  // lane, so a table of dequantized values (s * code + b) turns W bytes into
  // the values of their low and high nibbles with no integer-to-float work.
  static constexpr bool kLut16 = true;
  static inline V iota() { return _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15); }
  static inline void nib_lut(const uint8_t* p, V lut, V& lo, V& hi) {
    __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    lo = _mm512_permutexvar_ps(d, lut);
    hi = _mm512_permutexvar_ps(_mm512_srli_epi32(d, 4), lut);
  }
  // Volatile asm, not _mm_prefetch: GCC deletes a loop whose body is only
  // builtin prefetches (no side effect), as SpreadPrefetch::step's is.
  static inline void prefetch(const void* p) { asm volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(p))); }

  // W 16-bit floats (kScaleF16 or kScaleBF16) as f32 (exact).
  static inline V load_h(const uint16_t* p, int type) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return type == kScaleF16 ? _mm512_cvtph_ps(h) : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }

  // n 16-bit floats (kScaleF16 or kScaleBF16) to f32.
  static inline void widen(const uint16_t* src, float* dst, int n, int type) {
    for (int i = 0; i < n; i += 16) {
      const __mmask16 m = mask(n - i < 16 ? n - i : 16);
      __m256i h = _mm256_maskz_loadu_epi16(m, src + i);
      V f = type == kScaleF16 ? _mm512_cvtph_ps(h)
                              : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
      _mm512_mask_storeu_ps(dst + i, m, f);
    }
  }

  // The vector whose lane i is the sum of r[i]'s lanes (r is overwritten): a
  // tree that halves the vectors at each level, 31 shuffles and 15 adds
  // where a transpose and adds would take 48 and 15.
  static inline V row_sums(V* r) {
    for (int i = 0; i < 8; ++i)  // lanes 0-7: r[2i]'s halves added, 8-15: r[2i+1]'s
      r[i] = _mm512_add_ps(_mm512_shuffle_f32x4(r[2 * i], r[2 * i + 1], 0x44),
                           _mm512_shuffle_f32x4(r[2 * i], r[2 * i + 1], 0xEE));
    for (int i = 0; i < 4; ++i)  // 128-bit quarter q: r[4i+q]'s four partial sums
      r[i] = _mm512_add_ps(_mm512_shuffle_f32x4(r[2 * i], r[2 * i + 1], 0x88),
                           _mm512_shuffle_f32x4(r[2 * i], r[2 * i + 1], 0xDD));
    for (int i = 0; i < 2; ++i) {  // quarter q: r[8i'+q]'s two, r[8i'+4+q]'s two
      const __m512d a = _mm512_castps_pd(r[2 * i]), b = _mm512_castps_pd(r[2 * i + 1]);
      r[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
    }
    // Lane 4q + k: the sum of r[4k + q]; put it in lane 4k + q.
    const V s = _mm512_add_ps(_mm512_shuffle_ps(r[0], r[1], 0x88), _mm512_shuffle_ps(r[0], r[1], 0xDD));
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_ps(order, s);
  }

  // In-place transpose of a 16x16 block held as 16 row vectors.
  static inline void transpose(V* r) {
    V t[16], u[16];
    for (int i = 0; i < 8; ++i) {
      t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; ++i) {
      // Rows 4i..4i+3: u[4i + c] holds column c (+4, +8, +12) of those rows.
      u[4 * i + 0] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
      u[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
      u[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
      u[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    for (int c = 0; c < 4; ++c) {
      V v0 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x88);
      V v1 = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xDD);
      V v2 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x88);
      V v3 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xDD);
      r[c] = _mm512_shuffle_f32x4(v0, v2, 0x88);
      r[c + 8] = _mm512_shuffle_f32x4(v0, v2, 0xDD);
      r[c + 4] = _mm512_shuffle_f32x4(v1, v3, 0x88);
      r[c + 12] = _mm512_shuffle_f32x4(v1, v3, 0xDD);
    }
  }
};
