// MLX's CPU exp, sin and cos on x86 (mlx/backend/cpu/simd/math.h, one lane),
// ported operation for operation, so that tables built from them (RoPE's
// cos/sin, its inverse frequencies) hold exactly what MLX computes. MLX-free:
// `make isa-check` builds the kernels without MLX.
#pragma once

namespace mlxcel::kern {

/// MLX's `exp` of one f32 (its polynomial, `kExp2Poly` in kernels.h).
float mlx_exp(float x);
/// MLX's `sin` of one f32 (Cephes; arguments beyond 2^23 go to libm, as there).
float mlx_sin(float x);
/// MLX's `cos` of one f32 (as `mlx_sin`).
float mlx_cos(float x);

}  // namespace mlxcel::kern
