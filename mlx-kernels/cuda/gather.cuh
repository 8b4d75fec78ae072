// mlxcel's CUDA row gather: a decode step's token embeddings from an
// affine-quantized table, so that the whole step is mlxcel's kernels (a
// recorded step graph replays only those; gpu_graph.cc). Part of the module
// kernels.cu.
//
// One thread per output element: element k of row i reads its code from
// the row's bit stream, the scale and bias of its group, and writes
// s · q + b (two roundings, as MLX's dequantize and the CPU kernel), times
// the embedding scale unless that is 1.
#pragma once

namespace mlxcel {

template <int Bits, typename ScaleT>
__global__ void gather(GatherRowsArgs a) {
  const int i = blockIdx.y;
  const int k = blockIdx.x * kGatherThreads + threadIdx.x;
  if (i >= a.count || k >= a.k) return;
  long long id = a.ids_signed ? static_cast<long long>(a.ids[i]) : static_cast<long long>(static_cast<unsigned>(a.ids[i]));
  if (id < 0) id += a.n;
  id = id < 0 ? 0 : (id >= a.n ? a.n - 1 : id);
  // Code k of the row's little-endian bit stream (straddling two words for
  // some codes of 3, 5 or 6 bits).
  constexpr unsigned mask = (1u << Bits) - 1u;
  const long long words = static_cast<long long>(a.k) * Bits / 32;
  const int bit = k * Bits, shift = bit % 32;
  const unsigned* row = a.codes + id * words + bit / 32;
  unsigned q = __ldg(row) >> shift;
  if (shift + Bits > 32) q |= __ldg(row + 1) << (32 - shift);
  q &= mask;
  const long long g = id * (a.k / a.group) + k / a.group;
  const float s = to_float(static_cast<const ScaleT*>(a.scales)[g]);
  const float b = to_float(static_cast<const ScaleT*>(a.biases)[g]);
  float v = __fadd_rn(__fmul_rn(s, static_cast<float>(q)), b);
  if (a.scale != 1.0f) v = __fmul_rn(v, a.scale);
  a.out[static_cast<long long>(i) * a.k + k] = v;
}

}  // namespace mlxcel
