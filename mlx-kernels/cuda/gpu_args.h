// The arguments of mlxcel's CUDA kernels (kernels.cu), passed by value as
// each kernel's one parameter. Included by the kernels (NVRTC, as an
// in-memory header) and by the host code that fills them
// (cpp/nodes/gpu.cc), so both see one layout. Plain C++ without standard headers: NVRTC
// compiles it without a C++ library.
#pragma once

namespace mlxcel {

/// Weights one product node may fuse (q, k, v; gate and up).
constexpr int kMaxGpuWeights = 8;
/// Rows of x one block applies a weight row to (blockIdx.y picks the chunk).
constexpr int kRowChunk = 8;
/// The most threads of a product block: `rows_per_block` rows of W of
/// `seg_threads` threads each (ProductArgs).
constexpr int kProductThreads = 256;

/// The gated kernels' activations (kern::Activation's values, offset by one
/// so that 0 is no activation).
constexpr int kActSilu = 1;
constexpr int kActGeluTanh = 2;

/// One affine-quantized matrix `W [n, k]` and where its output goes.
struct GpuWeight {
  /// Codes, `[n, k · bits / 32]` words.
  const unsigned* codes;
  /// Scales and biases, `[n, k / group]` of the kernel's scale type.
  const void* scales;
  const void* biases;
  /// The output: `[rows, n]`, or `[B, heads, L, n / heads]` when heads > 0.
  float* out;
  int n;
  int heads;
};

/// One launch: x `[rows, k]` (row stride ldx) times every weight.
struct ProductArgs {
  const float* x;
  long long ldx;
  /// Rows of x (B · L) and the sequence length L (for the heads layout).
  int rows;
  int seq;
  int k;
  int group;
  /// Weights, and the first output row of each among all of them
  /// (`first_row[count]` = `total`).
  int count;
  int total;
  int first_row[kMaxGpuWeights + 1];
  GpuWeight w[kMaxGpuWeights];
  /// Added to the single plain output (`[rows, n]`), or null.
  const float* residual;
  /// An RMS norm of x applied first when `norm` is 1: each row scaled by
  /// 1 / sqrt(mean(x²) + norm_eps), then by `norm_weight` (`[k]`) unless null.
  int norm;
  float norm_eps;
  const float* norm_weight;
  /// Threads per row of W (each over every `seg_threads`-th segment of 32
  /// inputs) and rows of W per block: `seg_threads · rows_per_block` ≤
  /// kProductThreads (products.cuh).
  int seg_threads;
  int rows_per_block;
};

/// Sets a product's launch shape from its input width `k` (a multiple of
/// 32): one thread per 32-input segment of a row of W, at most
/// kProductThreads of them (each then over several segments), and as many
/// whole rows of W per block as fit. The host code that launches the
/// products (cpp/nodes/gpu.cc, scripts/gpu/product_bench.cu) calls this one
/// definition; the block is `seg_threads · rows_per_block` threads. Host
/// code only (NVRTC, which compiles the kernels, takes no host function).
#ifndef __CUDACC_RTC__
inline void set_product_shape(ProductArgs& a) {
  a.seg_threads = a.k / 32 < kProductThreads ? a.k / 32 : kProductThreads;
  a.rows_per_block = kProductThreads / a.seg_threads;
}
#endif

/// Threads of the RMS norm kernel (one block per row).
constexpr int kNormThreads = 256;

/// An RMS norm of x `[rows, dim]` (row stride ldx) into the row-major
/// `out`: x / sqrt(mean(x²) + eps), times `weight` (`[dim]`) unless null,
/// plus `residual` (`[rows, dim]`) unless null.
struct NormArgs {
  const float* x;
  long long ldx;
  const float* weight;
  const float* residual;
  float* out;
  int rows;
  int dim;
  float eps;
};

/// Sequences one attention launch serves (a decode step's batch).
constexpr int kMaxAttentionRows = 32;
/// Positions of one sequence one attention launch adds (at least gpu.h's
/// kMaxRows: each block keeps the step's rotated keys in shared memory).
constexpr int kMaxAttentionPositions = 32;
/// The largest head dimension of queries, keys and values.
constexpr int kMaxHeadDim = 256;
/// Threads of the attention kernel: eight warps, each over every eighth
/// position.
constexpr int kAttentionThreads = 256;
constexpr int kAttentionWarps = kAttentionThreads / 32;

/// One sequence's KV cache buffers (`[KVH, capacity, D]` and
/// `[KVH, capacity, Dv]`, row-major) and its step.
struct CacheRowArgs {
  float* keys;
  float* values;
  int capacity;
  /// Position of the step's first query and key (RoPE).
  int offset;
  /// First buffer position written.
  int slot;
  /// Positions attended over: [0, visible).
  int visible;
  /// Query i sees positions up to visible - L + i.
  int causal;
};

/// The part of a sequence's CacheRowArgs that changes from step to step.
/// A replayed step graph (cpp/nodes/gpu_graph.cc) copies each step's into
/// device memory that its attention launches read, instead of setting every
/// launch's arguments anew.
struct StepPositions {
  int offset;
  int slot;
  int visible;
  int causal;
};

/// One cached attention step of `batch` sequences: q `[B, H, L, D]`, k
/// `[B, KVH, L, D]`, v `[B, KVH, L, Dv]` (row-major, not yet rotated);
/// the output `[B, L, H · Dv]` (heads merged).
struct AttentionArgs {
  const float* q;
  const float* k;
  const float* v;
  float* out;
  /// RoPE: wavelengths `[rope_dims / 2]`, or null for base^(-2i/dims).
  const float* freqs;
  int batch;
  int heads;
  int kv_heads;
  int seq;
  int dim;
  int vdim;
  int rope_dims;
  int rope_traditional;
  float rope_base;
  float rope_scale;
  float scale;
  /// Row b's positions in device memory, overriding rows[b]'s, or null.
  const StepPositions* positions;
  CacheRowArgs rows[kMaxAttentionRows];
};

/// Threads of the row-gather kernel (one element each).
constexpr int kGatherThreads = 256;

/// Rows `ids` of an affine-quantized table `[n, k]` (codes, scales and
/// biases as in GpuWeight), dequantized as MLX's dequantize rounds
/// (s · q, then + b) and multiplied by `scale` unless it is 1, into the
/// row-major `out [count, k]`: a model's token embeddings.
struct GatherRowsArgs {
  /// Token ids, 32-bit, signed when `ids_signed` (negative ids count from
  /// the end, as MLX's take does); out of range ones are clamped.
  const int* ids;
  int ids_signed;
  int count;
  int n;
  int k;
  int group;
  const unsigned* codes;
  const void* scales;
  const void* biases;
  float scale;
  float* out;
};

}  // namespace mlxcel
