// The AArch64 NEON SIMD layer (4 f32 lanes). Included only by isa_neon.cc,
// inside its own namespace. NEON (Advanced SIMD with f32 FMA and division) is
// part of every AArch64 CPU, so this build needs no run-time check there.
#pragma once

struct S {
  static constexpr int W = 4;
  // GEMM micro-tile: 8 rows by 2 vectors (8 outputs): 16 accumulators of the 32 registers.
  static constexpr int GEMM_MR = 8;
  static constexpr int GEMM_NV = 2;
  // Rows of x the rows16 micro-kernel keeps in registers (rows16_impl.h).
  static constexpr int TILE_MM = 4;
  static constexpr int ATT_RB = 4;
  using V = float32x4_t;

  static inline V zero() { return vdupq_n_f32(0.0f); }
  static inline V set1(float x) { return vdupq_n_f32(x); }
  static inline V load(const float* p) { return vld1q_f32(p); }
  static inline void store(float* p, V v) { vst1q_f32(p, v); }
  // Partial vectors go through a stack copy: tails are rare and short.
  static inline V load_n(const float* p, int n) {
    float t[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int i = 0; i < n && i < 4; ++i) t[i] = p[i];
    return vld1q_f32(t);
  }
  static inline void store_n(float* p, V v, int n) {
    float t[4];
    vst1q_f32(t, v);
    for (int i = 0; i < n && i < 4; ++i) p[i] = t[i];
  }
  static inline V fma(V a, V b, V c) { return vfmaq_f32(c, a, b); }
  static inline V mul(V a, V b) { return vmulq_f32(a, b); }
  static inline V add(V a, V b) { return vaddq_f32(a, b); }
  static inline V sub(V a, V b) { return vsubq_f32(a, b); }
  static inline V div(V a, V b) { return vdivq_f32(a, b); }
  static inline V max(V a, V b) { return vmaxq_f32(a, b); }
  static inline V abs(V a) { return vabsq_f32(a); }
  static inline float hsum(V v) { return vaddvq_f32(v); }
  static inline float hmax(V v) { return vmaxvq_f32(v); }
  static inline V select_neg(V a, V x, V y) { return vbslq_f32(vcltq_f32(a, zero()), x, y); }

  // MLX's CPU exp (mlx/backend/cpu/simd/math.h), lane for lane as the scalar layer.
  static inline V exp(V x0) {
    V x = vmulq_f32(x0, set1(1.442695f));
    V ip = vrndmq_f32(vaddq_f32(x, set1(0.5f)));
    V f = vsubq_f32(x, ip);
    V p = set1(kExp2Poly[0]);
#pragma GCC unroll 6
    for (int i = 1; i < 7; ++i) p = fma(p, f, set1(kExp2Poly[i]));
    int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(ip), vdupq_n_s32(127)), 23);
    V r = vmulq_f32(vreinterpretq_f32_s32(e), p);
    r = vbslq_f32(vceqq_f32(x0, x0), r, x0);
    r = vbslq_f32(vcgtq_f32(x0, set1(88.0f)), set1(__builtin_huge_valf()), r);
    r = vbslq_f32(vcltq_f32(x0, set1(-88.0f)), zero(), r);
    return r;
  }

  // Moves the low bits of `v` to the set bits of `mask`, in order (no pdep
  // instruction on AArch64).
  static inline uint64_t pdep(uint64_t v, uint64_t mask) {
    uint64_t r = 0;
    for (uint64_t bit = 1; mask; bit <<= 1, mask &= mask - 1)
      if (v & bit) r |= mask & (~mask + 1);
    return r;
  }
  // The low 4 bytes of u[0] (low byte first), as floats.
  static inline V u8x(const uint64_t* u) { return bytes4(vcreate_u8(u[0])); }
  static inline V u8(const uint8_t* p) {
    uint32_t w;
    __builtin_memcpy(&w, p, 4);
    return bytes4(vcreate_u8(w));
  }
  static inline void nib(const uint8_t* p, V& lo, V& hi) {
    uint32_t w;
    __builtin_memcpy(&w, p, 4);
    const uint32x4_t d = vmovl_u16(vget_low_u16(vmovl_u8(vcreate_u8(w))));
    lo = vcvtq_f32_u32(vandq_u32(d, vdupq_n_u32(15)));
    hi = vcvtq_f32_u32(vshrq_n_u32(d, 4));
  }

  // No 16-entry in-register table at 4 lanes: 4-bit codes are converted.
  static constexpr bool kLut16 = false;
  static inline V iota() {
    const float t[4] = {0.0f, 1.0f, 2.0f, 3.0f};
    return vld1q_f32(t);
  }
  static inline void nib_lut(const uint8_t*, V, V&, V&) {}
  // Volatile asm, not __builtin_prefetch: GCC deletes a loop whose body is
  // only builtin prefetches (no side effect), as SpreadPrefetch::step's is.
  static inline void prefetch(const void* p) { asm volatile("prfm pldl1keep, %0" : : "Q"(*static_cast<const char*>(p))); }

  // W 16-bit floats (kScaleF16 or kScaleBF16) as f32 (exact; bf16 is a shift).
  static inline V load_h(const uint16_t* p, int type) {
    const uint16x4_t h = vld1_u16(p);
    return type == kScaleF16 ? vcvt_f32_f16(vreinterpret_f16_u16(h)) : vreinterpretq_f32_u32(vshlq_n_u32(vmovl_u16(h), 16));
  }

  static inline void widen(const uint16_t* src, float* dst, int n, int type) {
    int i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(dst + i, load_h(src + i, type));
    for (; i < n; ++i) dst[i] = type == kScaleF16 ? half_to_float(src[i]) : bf16_to_float(src[i]);
  }

  // In-place transpose of a 4x4 block held as 4 row vectors.
  static inline void transpose(V* r) {
    const float32x4x2_t a = vtrnq_f32(r[0], r[1]);
    const float32x4x2_t b = vtrnq_f32(r[2], r[3]);
    r[0] = vcombine_f32(vget_low_f32(a.val[0]), vget_low_f32(b.val[0]));
    r[1] = vcombine_f32(vget_low_f32(a.val[1]), vget_low_f32(b.val[1]));
    r[2] = vcombine_f32(vget_high_f32(a.val[0]), vget_high_f32(b.val[0]));
    r[3] = vcombine_f32(vget_high_f32(a.val[1]), vget_high_f32(b.val[1]));
  }

 private:
  // The low 4 bytes of `b` as floats.
  static inline V bytes4(uint8x8_t b) { return vcvtq_f32_u32(vmovl_u16(vget_low_u16(vmovl_u8(b)))); }
};
