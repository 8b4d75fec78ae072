// mlxcel's CUDA RMS norm: the norms no product absorbs (a model's final norm
// before a head MLX multiplies, Gemma's post-norms with their residual, a
// prompt's norms before MLX's quantized matmul). Part of the module
// kernels.cu.
//
// One block per row: each thread sums the squares of every kNormThreads-th
// element, the warps' sums meet in shared memory, then each thread writes
// its elements x · (1 / sqrt(Σx² · (1/dim) + eps)) · w (+ residual), MLX's
// rounding order. The sum's order depends on the row alone, never on the
// number of rows.
#pragma once

namespace mlxcel {

__global__ void rms_norm(NormArgs a) {
  __shared__ float partial[kNormThreads / 32];
  const int r = blockIdx.x;
  const float* x = a.x + static_cast<long long>(r) * a.ldx;
  float sq = 0.0f;
  for (int i = threadIdx.x; i < a.dim; i += kNormThreads) {
    const float v = x[i];
    sq += v * v;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, o);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x / 32] = sq;
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < kNormThreads / 32; ++w) total += partial[w];
  const float scale = 1.0f / sqrtf(total * (1.0f / a.dim) + a.eps);
  float* out = a.out + static_cast<long long>(r) * a.dim;
  const float* residual = a.residual ? a.residual + static_cast<long long>(r) * a.dim : nullptr;
  for (int i = threadIdx.x; i < a.dim; i += kNormThreads) {
    float y = x[i] * scale;
    if (a.weight) y *= a.weight[i];
    if (residual) y += residual[i];
    out[i] = y;
  }
}

}  // namespace mlxcel
