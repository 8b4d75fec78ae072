// The arguments of mlxcel's CUDA kernels (kernels.cu), passed by value as
// each kernel's one parameter. Included by the kernels (NVRTC, as an
// in-memory header) and by the host code that fills them
// (cpp/nodes/gpu.cc), so both see one layout. Plain C++ without standard headers: NVRTC
// compiles it without a C++ library.
#pragma once

namespace mlxcel {

/// Weights one product node may fuse (q, k, v; gate and up).
constexpr int kMaxGpuWeights = 8;
/// Rows of x one product block applies its rows of W to (blockIdx.y picks
/// the chunk; gated launches of more rows take kGatedChunk): few, so that
/// a batch's rows spread over blocks instead of lengthening each thread's
/// chain of loads (docs/cuda.md "Wide products").
constexpr int kRowChunk = 2;
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
  /// Rows of W each thread of a plain product takes (1 or kWide), sharing
  /// its loads of x between them. 0 lets set_product_shape choose. The
  /// gated kernel takes 1 (of each of its two weights).
  int wide;
  /// Rows of x a block takes: kRowChunk, or kGatedChunk for a gated launch
  /// of more rows (set by set_product_shape).
  int chunk;
};

/// Rows of W a thread of a wide plain product takes (ProductArgs::wide).
constexpr int kWide = 4;
/// The fewest output rows a plain product of one chunk of x rows takes
/// wide: a vocabulary projection, not a layer's (whose few blocks would
/// then leave most multiprocessors idle; docs/cuda.md "Wide products").
constexpr int kWideMinRows = 8192;
/// Rows of x a gated block takes when x has more than kRowChunk: a gated
/// thread has two rows of W (gate and up) to share each load of x with, and
/// its loads of W then serve more rows of x (docs/cuda.md "Wide products").
constexpr int kGatedChunk = 8;

/// Which kernel a launch shape is for: `product` (every weight's rows) or
/// `gated` (the rows of weight 0, each with weight 1's row of that index).
enum class ProductLaunch { Plain, Gated };

/// A product launch's grid (x: blocks of W rows, y: chunks of x rows) and
/// block size.
struct ProductGrid {
  int blocks_x;
  int blocks_y;
  int threads;
};

/// Sets a product's launch shape from its input width `k` (a multiple of
/// 32) and returns its grid: one thread per 32-input segment of a row of W,
/// at most kProductThreads of them (each then over several segments), as
/// many whole rows of W per block as fit, and kWide rows of W per thread of
/// a plain product where W has at least kWideMinRows rows or x more than
/// kRowChunk (unless `a.wide` was set to 1 or kWide). The host code
/// that launches the products (cpp/nodes/gpu.cc,
/// scripts/gpu/product_bench.cu) calls this one definition. Host code only
/// (NVRTC, which compiles the kernels, takes no host function).
#ifndef __CUDACC_RTC__
inline ProductGrid set_product_shape(ProductArgs& a, ProductLaunch launch) {
  a.seg_threads = a.k / 32 < kProductThreads ? a.k / 32 : kProductThreads;
  a.rows_per_block = kProductThreads / a.seg_threads;
  const int rows_out = launch == ProductLaunch::Gated ? a.w[0].n : a.total;
  if (launch == ProductLaunch::Gated) {
    a.wide = 1;
    a.chunk = a.rows > kRowChunk ? kGatedChunk : kRowChunk;
  } else {
    if (a.wide != 1 && a.wide != kWide) a.wide = a.rows > kRowChunk || rows_out >= kWideMinRows ? kWide : 1;
    a.chunk = kRowChunk;
  }
  const int per_block = a.rows_per_block * a.wide;
  return ProductGrid{(rows_out + per_block - 1) / per_block, (a.rows + a.chunk - 1) / a.chunk,
                     a.seg_threads * a.rows_per_block};
}
#endif

/// Prompt products (prompt.cuh): rows of W a block's tile takes, threads
/// of a block, and the rows of x a tile may take (`ProductArgs::chunk` of a
/// prompt launch): kTileRows, or kTileRowsSmall where kTileRows would leave
/// fewer than kTileMinBlocks blocks (a 576-wide product of 512 rows: 72),
/// so that small products still occupy every multiprocessor.
constexpr int kTileN = 64;
constexpr int kTileThreads = 128;
constexpr int kTileRows = 64;
constexpr int kTileRowsSmall = 32;
constexpr int kTileMinBlocks = 256;

/// Sets a prompt product's launch shape (its tile's rows of x in
/// `a.chunk`) and returns its grid: x over tiles of kTileN rows of W (of
/// every weight concatenated, or of the gate's), y over tiles of `a.chunk`
/// rows of x. Host code only, as set_product_shape.
#ifndef __CUDACC_RTC__
inline ProductGrid set_prompt_shape(ProductArgs& a, ProductLaunch launch) {
  const int rows_out = launch == ProductLaunch::Gated ? a.w[0].n : a.total;
  const int tiles_n = (rows_out + kTileN - 1) / kTileN;
  a.chunk = tiles_n * ((a.rows + kTileRows - 1) / kTileRows) >= kTileMinBlocks ? kTileRows : kTileRowsSmall;
  a.wide = 1;
  return ProductGrid{tiles_n, (a.rows + a.chunk - 1) / a.chunk, kTileThreads};
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
