// The portable scalar "SIMD" layer (one lane). Included only by isa_scalar.cc.
// It is the fallback of every CPU without one of the vector layers.
#pragma once

struct S {
  static constexpr int W = 1;
  static constexpr int GEMM_MR = 4;
  static constexpr int GEMM_NV = 4;
  // Rows of x the rows16 micro-kernel keeps in registers (rows16_impl.h).
  static constexpr int TILE_MM = 4;
  static constexpr int ATT_RB = 4;
  using V = float;

  static inline V zero() { return 0.0f; }
  static inline V set1(float x) { return x; }
  static inline V load(const float* p) { return *p; }
  static inline void store(float* p, V v) { *p = v; }
  static inline V load_n(const float* p, int n) { return n > 0 ? *p : 0.0f; }
  static inline void store_n(float* p, V v, int n) {
    if (n > 0) *p = v;
  }
  static inline V fma(V a, V b, V c) { return __builtin_fmaf(a, b, c); }
  static inline V mul(V a, V b) { return a * b; }
  static inline V add(V a, V b) { return a + b; }
  static inline V sub(V a, V b) { return a - b; }
  static inline V div(V a, V b) { return a / b; }
  static inline V max(V a, V b) { return a > b ? a : b; }
  static inline V abs(V a) { return __builtin_fabsf(a); }
  static inline float hsum(V v) { return v; }
  static inline float hmax(V v) { return v; }
  static inline V select_neg(V a, V x, V y) { return a < 0.0f ? x : y; }

  // MLX's CPU exp (mlx/backend/cpu/simd/math.h).
  static inline V exp(V x0) {
    float x = x0 * 1.442695f;
    float ip = __builtin_floorf(x + 0.5f);
    float f = x - ip;
    float p = kExp2Poly[0];
#pragma GCC unroll 6
    for (int i = 1; i < 7; ++i) p = fma(p, f, kExp2Poly[i]);
    if (x0 != x0) return x0;
    if (x0 > 88.0f) return __builtin_huge_valf();
    if (x0 < -88.0f) return 0.0f;
    uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(ip) + 127) << 23;
    float e;
    __builtin_memcpy(&e, &bits, sizeof(e));
    return e * p;
  }

  // W bytes held in W / 8 words (low byte first), as floats.
  static inline V u8x(const uint64_t* u) { return static_cast<float>(u[0] & 0xff); }
  static inline V u8(const uint8_t* p) { return static_cast<float>(*p); }
  // Moves the low bits of `v` to the set bits of `mask`, in order (BMI2's pdep).
  static inline uint64_t pdep(uint64_t v, uint64_t mask) {
    uint64_t r = 0;
    for (uint64_t bit = 1; mask; bit <<= 1, mask &= mask - 1)
      if (v & bit) r |= mask & (~mask + 1);
    return r;
  }
  static inline void nib(const uint8_t* p, V& lo, V& hi) {
    lo = static_cast<float>(*p & 15);
    hi = static_cast<float>(*p >> 4);
  }
  static inline void transpose(V*) {}
  static constexpr bool kLut16 = false;
  static inline V iota() { return 0.0f; }
  static inline void nib_lut(const uint8_t*, V, V&, V&) {}
  static inline void prefetch(const void* p) { __builtin_prefetch(p); }
  static inline V load_h(const uint16_t* p, int type) { return type == kScaleF16 ? half_to_float(*p) : bf16_to_float(*p); }
  static inline void widen(const uint16_t* src, float* dst, int n, int type) {
    for (int i = 0; i < n; ++i) dst[i] = load_h(src + i, type);
  }
};
