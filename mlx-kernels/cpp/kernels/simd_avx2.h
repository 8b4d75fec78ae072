// The AVX2 + FMA SIMD layer (8 f32 lanes). Included only by isa_avx2.cc, inside
// its `#pragma GCC target` region and its own namespace.
#pragma once

struct S {
  static constexpr int W = 8;
  // GEMM micro-tile: 6 rows by 2 vectors (16 outputs): 12 accumulators of 16 registers.
  static constexpr int GEMM_MR = 6;
  static constexpr int GEMM_NV = 2;
  // Rows of x the rows16 micro-kernel keeps in registers (rows16_impl.h).
  static constexpr int TILE_MM = 4;
  static constexpr int ATT_RB = 4;
  using V = __m256;

  static inline V zero() { return _mm256_setzero_ps(); }
  static inline V set1(float x) { return _mm256_set1_ps(x); }
  static inline V load(const float* p) { return _mm256_loadu_ps(p); }
  static inline void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static inline __m256i mask(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static inline V load_n(const float* p, int n) { return _mm256_maskload_ps(p, mask(n)); }
  static inline void store_n(float* p, V v, int n) { _mm256_maskstore_ps(p, mask(n), v); }
  static inline V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static inline V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static inline V add(V a, V b) { return _mm256_add_ps(a, b); }
  static inline V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static inline V div(V a, V b) { return _mm256_div_ps(a, b); }
  static inline V max(V a, V b) { return _mm256_max_ps(a, b); }
  static inline V abs(V a) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a); }
  static inline float hsum(V v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static inline float hmax(V v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static inline V select_neg(V a, V x, V y) { return _mm256_blendv_ps(y, x, _mm256_cmp_ps(a, zero(), _CMP_LT_OQ)); }

  // MLX's CPU exp, lane for lane (see simd_avx512.h).
  static inline V exp(V x0) {
    V x = _mm256_mul_ps(x0, set1(1.442695f));
    V ip = _mm256_floor_ps(_mm256_add_ps(x, set1(0.5f)));
    V f = _mm256_sub_ps(x, ip);
    V p = set1(kExp2Poly[0]);
#pragma GCC unroll 6
    for (int i = 1; i < 7; ++i) p = fma(p, f, set1(kExp2Poly[i]));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(ip), _mm256_set1_epi32(127)), 23);
    V r = _mm256_mul_ps(_mm256_castsi256_ps(e), p);
    r = _mm256_blendv_ps(r, x0, _mm256_cmp_ps(x0, x0, _CMP_UNORD_Q));
    r = _mm256_blendv_ps(r, set1(__builtin_huge_valf()), _mm256_cmp_ps(x0, set1(88.0f), _CMP_GT_OQ));
    r = _mm256_blendv_ps(r, zero(), _mm256_cmp_ps(x0, set1(-88.0f), _CMP_LT_OQ));
    return r;
  }

  // Moves the low bits of `v` to the set bits of `mask`, in order.
  static inline uint64_t pdep(uint64_t v, uint64_t mask) { return _pdep_u64(v, mask); }
  // W bytes held in W / 8 words (low byte first), as floats.
  static inline V u8x(const uint64_t* u) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(u[0])))); }
  static inline V u8(const uint8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  static inline void nib(const uint8_t* p, V& lo, V& hi) {
    __m256i d = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    lo = _mm256_cvtepi32_ps(_mm256_and_si256(d, _mm256_set1_epi32(15)));
    hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(d, 4));
  }

  // No 16-entry in-register table at 8 lanes: 4-bit codes are converted.
  static constexpr bool kLut16 = false;
  static inline V iota() { return _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7); }
  static inline void nib_lut(const uint8_t*, V, V&, V&) {}
  // Volatile asm, not _mm_prefetch: GCC deletes a loop whose body is only
  // builtin prefetches (no side effect), as SpreadPrefetch::step's is.
  static inline void prefetch(const void* p) { asm volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(p))); }

  // W 16-bit floats (kScaleF16 or kScaleBF16) as f32 (exact).
  static inline V load_h(const uint16_t* p, int type) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return type == kScaleF16 ? _mm256_cvtph_ps(h) : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }

  static inline void widen(const uint16_t* src, float* dst, int n, int type) {
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load_h(src + i, type));
    for (; i < n; ++i) dst[i] = type == kScaleF16 ? _cvtsh_ss(src[i]) : bf16_to_float(src[i]);
  }

  // In-place transpose of an 8x8 block held as 8 row vectors.
  static inline void transpose(V* r) {
    V t[8], u[8];
    for (int i = 0; i < 4; ++i) {
      t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; ++i) {
      u[4 * i + 0] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
      u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
      u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
      u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    for (int c = 0; c < 4; ++c) {
      r[c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x20);
      r[c + 4] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x31);
    }
  }
};
