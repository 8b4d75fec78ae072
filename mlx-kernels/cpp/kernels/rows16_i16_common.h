// What the int16-activation rows16 kernels of every build share (the
// avx512vnni build's rows16_i16_impl.h and the avx2i16 build's
// rows16_i16_avx2_impl.h, each including this first), in impl.h's
// namespace: when they apply, the outlier rule, and the quantized x they
// read. rows16_impl.h runs them over rows and scale types.
#pragma once

// Largest group whose int32 sums cannot overflow (8-bit codes: at most
// 128 · 255 · 32767 < 2^31).
constexpr int kRows16I16MaxGroup = 128;

// Whether the int16 kernel takes products of `a` (else the float kernel).
inline bool rows16_i16_applies(const QmmArgs& a) {
  return (a.bits == 4 || a.bits == 8) && a.group_size % 16 == 0 && a.group_size <= kRows16I16MaxGroup;
}

// A group whose largest |x| exceeds this many times the mean of the row's
// group maxima (an activation outlier: LLM residual streams carry channels
// 100x the rest) also gets its rounding error as a second int16 pass.
constexpr float kRows16OutlierRatio = 4.0f;

// The int16 x of MM rows as rows16_quantize_x writes them: q [K] int16
// codes in k order, dx [G] the group steps, xs [G] the exact group sums,
// and for outlier groups the rounding residual x - dx·q as codes q2 [K] with
// steps dx2 [G] (0 elsewhere: the kernel skips a group's second pass when no
// row of it has one); row m at + m * K (codes) or + m * G (per group).
struct Rows16X {
  const int16_t* q;
  const float* dx;
  const float* xs;
  const int16_t* q2;
  const float* dx2;
};
