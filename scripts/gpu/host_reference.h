// Host-side helpers shared by the programs that check mlxcel's CUDA
// kernels against f64 references: the CPU emulations (emulate/*.cc, built
// by g++ over emulate/cuda_shim.h) and product_bench.cu (built by nvcc):
// random data, quantized matrices with their exact dequantization, product
// arguments, the references and the error measure.
// Include after gpu_args.h (and cuda_shim.h or CUDA's headers).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace host {

using namespace mlxcel;

inline std::mt19937 rng(5);

inline std::vector<float> normal(size_t n, float mean = 0.0f, float sd = 1.0f) {
  std::normal_distribution<float> d(mean, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

inline uint16_t to_half_bits(float f) {
  // Round to nearest even. Biases come arbitrarily close to zero, so the
  // subnormals count (multiples of 2^-24; the nearest may be the smallest
  // normal number, whose bits follow on).
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const float a = std::fabs(f);
  if (a < 6.103515625e-05f) return uint16_t(sign | uint32_t(std::nearbyint(a * 16777216.0f)));
  const int e = int((u >> 23) & 0xff) - 127 + 15;
  uint32_t m = u & 0x7fffffu;
  uint32_t h = sign | (uint32_t(e) << 10) | (m >> 13);
  const uint32_t rest = m & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return uint16_t(h);
}

// One quantized matrix [n, k] with scales and biases of type S (float or __half).
template <class S>
struct Matrix {
  int n, k, bits, group;
  std::vector<unsigned> codes;
  std::vector<S> scales, biases;
  Matrix(int n_, int k_, int bits_, int group_) : n(n_), k(k_), bits(bits_), group(group_) {
    codes.resize(size_t(n) * k * bits / 32);
    for (auto& c : codes) c = rng();
    std::uniform_real_distribution<float> s(0.002f, 0.02f), b(-0.08f, 0.08f);
    for (size_t i = 0; i < size_t(n) * k / group; ++i) {
      scales.push_back(make(s(rng)));
      biases.push_back(make(b(rng)));
    }
  }
  static S make(float v) {
    if constexpr (std::is_same_v<S, float>) {
      return v;
    } else {
#ifdef __CUDACC__
      return __float2half_rn(v);  // CUDA's __half(unsigned short) converts a value, not bits
#else
      return S{to_half_bits(v)};
#endif
    }
  }
  static double value(S v) {
    if constexpr (std::is_same_v<S, float>) return v;
    else return __half2float(v);
  }
  unsigned code(int r, int c) const {
    const size_t bit = (size_t(r) * k + c) * bits, word = bit / 32, shift = bit % 32;
    uint64_t w = codes[word];
    if (shift + bits > 32) w |= uint64_t(codes[word + 1]) << 32;
    return unsigned(w >> shift) & ((1u << bits) - 1u);
  }
  double at(int r, int c) const {
    const size_t g = (size_t(r) * k + c) / group;
    return value(scales[g]) * code(r, c) + value(biases[g]);
  }
  GpuWeight weight(float* out, int heads = 0) const {
    return GpuWeight{codes.data(), scales.data(), biases.data(), out, n, heads};
  }
};

inline ProductArgs args(const float* x, int rows, int k, int group, std::vector<GpuWeight> ws) {
  ProductArgs a{};
  a.x = x;
  a.ldx = k;
  a.rows = rows;
  a.seq = 1;
  a.k = k;
  a.group = group;
  for (auto& w : ws) {
    a.w[a.count] = w;
    a.first_row[a.count + 1] = a.first_row[a.count] + w.n;
    ++a.count;
  }
  a.total = a.first_row[a.count];
  return a;
}

// The product's RMS norm: `gain` (of k values) and `eps`.
inline void with_norm(ProductArgs& a, const float* gain, float eps) {
  a.norm = 1;
  a.norm_eps = eps;
  a.norm_weight = gain;
}

// The f64 reference of x Wᵀ for x [rows, k], normed first with `gain` (and
// `eps`) when given: [rows, n], or only the rows listed in `only`,
// [only->size(), n].
template <class S>
std::vector<double> reference(const std::vector<float>& x, int rows, const Matrix<S>& w,
                              const std::vector<float>* gain, double eps, const std::vector<int>* only = nullptr) {
  std::vector<int> all;
  if (!only) {
    for (int m = 0; m < rows; ++m) all.push_back(m);
    only = &all;
  }
  std::vector<double> y(only->size() * w.n);
  for (size_t i = 0; i < only->size(); ++i) {
    const int m = (*only)[i];
    const float* xm = x.data() + size_t(m) * w.k;
    double scale = 1.0;
    if (gain) {
      double sq = 0;
      for (int c = 0; c < w.k; ++c) sq += double(xm[c]) * xm[c];
      scale = 1.0 / std::sqrt(sq / w.k + eps);
    }
    for (int r = 0; r < w.n; ++r) {
      double acc = 0;
      for (int c = 0; c < w.k; ++c) acc += w.at(r, c) * xm[c] * (gain ? (*gain)[c] : 1.0f);
      y[i * w.n + r] = acc * scale;
    }
  }
  return y;
}

// Largest |got - want| over the largest |want|; NaN when any output is
// not a number (which no bound passes).
inline double relative_error(const std::vector<float>& got, const std::vector<double>& want) {
  double worst = 0, top = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = std::abs(double(got[i]) - want[i]);
    if (std::isnan(d)) return d;
    worst = std::max(worst, d);
    top = std::max(top, std::abs(want[i]));
  }
  return worst / top;
}

// The bound of relative_error: f32 sums of at most 1536 terms.
constexpr double kErrorBound = 2e-5;

inline bool all_ok = true;

inline void check(const std::string& what, const std::vector<float>& got, const std::vector<double>& want) {
  const double e = relative_error(got, want);
  const bool pass = e <= kErrorBound;
  all_ok = all_ok && pass;
  std::printf("%-52s %.2e %s\n", what.c_str(), e, pass ? "ok" : "FAILED (bound 2e-5)");
}

inline void same_bits(const std::string& what, const std::vector<float>& alone, const std::vector<float>& batch) {
  const bool same = std::memcmp(alone.data(), batch.data(), alone.size() * sizeof(float)) == 0;
  all_ok = all_ok && same;
  std::printf("%-52s %s\n", what.c_str(), same ? "bit-identical ok" : "DIFFER (FAILED)");
}


}  // namespace host
