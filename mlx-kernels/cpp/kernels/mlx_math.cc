// MLX's CPU exp, sin and cos, one lane (see mlx_math.h). Compiled with
// -ffp-contract=off like every kernel: each fma here is one in MLX's code and
// each plain product or sum rounds where MLX's does.
#include "mlxcel-mlx/cpp/kernels/mlx_math.h"

#include <cmath>
#include <cstdint>
#include <cstring>

#include "mlxcel-mlx/cpp/kernels/kernels.h"

namespace mlxcel::kern {
namespace {

// Cephes sincos as MLX has it.
float mlx_sincos(float in, bool sine) {
  if (std::fabs(in) > 8388608.0f) return sine ? std::sin(in) : std::cos(in);
  bool sign_sin = in < 0;
  float x = std::fabs(in);
  float y = x * 1.27323954473516f;
  uint32_t emm2 = static_cast<uint32_t>(y);
  emm2 = (emm2 + 1) & ~1u;
  y = static_cast<float>(emm2);
  const bool poly = (emm2 & 2) != 0;
  x = std::fma(y, -0.78515625f, x);
  x = std::fma(y, -2.4187564849853515625e-4f, x);
  x = std::fma(y, -3.77489497744594108e-8f, x);
  sign_sin = sign_sin ^ ((emm2 & 4) != 0);
  const bool sign_cos = ((emm2 - 2) & 4) != 0;
  const float z = x * x;
  float y1 = std::fma(z, 2.443315711809948e-5f, -1.388731625493765e-3f);
  float y2 = std::fma(z, -1.9515295891e-4f, 8.3321608736e-3f);
  y1 = std::fma(y1, z, 4.166664568298827e-2f);
  y2 = std::fma(y2, z, -1.6666654611e-1f);
  y1 = y1 * z;
  y2 = y2 * z;
  y1 = y1 * z;
  y2 = std::fma(x, y2, x);
  y1 = std::fma(z, -0.5f, y1);
  y1 = y1 + 1.0f;
  if (sine) {
    const float ys = poly ? y1 : y2;
    return sign_sin ? -ys : ys;
  }
  const float yc = poly ? y2 : y1;
  return sign_cos ? yc : -yc;
}

}  // namespace

float mlx_exp(float x0) {
  const float x = x0 * 1.442695f;
  const float ip = std::floor(x + 0.5f);
  const float f = x - ip;
  float p = kExp2Poly[0];
  for (int i = 1; i < 7; ++i) p = std::fma(p, f, kExp2Poly[i]);
  if (std::isnan(x0)) return x0;
  if (x0 > 88.0f) return INFINITY;
  if (x0 < -88.0f) return 0.0f;
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(ip) + 127) << 23;
  float e;
  std::memcpy(&e, &bits, sizeof(e));
  return e * p;
}

float mlx_sin(float x) { return mlx_sincos(x, true); }
float mlx_cos(float x) { return mlx_sincos(x, false); }

}  // namespace mlxcel::kern
