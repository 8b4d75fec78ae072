// mlxcel's CPU kernels: the plain-pointer interface between the MLX
// graph nodes (../nodes/) and the per-ISA implementations (isa_*.cc). MLX-free.
//
// Every kernel reads f32 activations and accumulates in f32. Each ISA file
// compiles the same generic code (impl.h) against its own SIMD layer under a
// `#pragma GCC target`, so one x86-64 binary carries scalar, AVX2+FMA and
// AVX-512 versions and `table()` picks one at run time from cpuid; an AArch64
// binary carries scalar and NEON.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace mlxcel::kern {

/// The instruction sets the kernels are built for (src/ffi.rs declares the
/// same enum; cxx checks at compile time that the two agree).
enum class Isa : int { Scalar = 0, Avx2 = 1, Avx512 = 2, Avx512Vnni = 3, Neon = 4, Avx2I16 = 5 };

/// The activation of a gated MLP, `act(a) * b` (src/ffi.rs declares it too).
enum class Activation : int {
  Silu = 0,      // silu(a) = a * sigmoid(a) (SwiGLU)
  GeluTanh = 1,  // the tanh approximation of GELU (GeGLU)
};

/// How attention masks its scores besides causality.
enum class MaskKind : int {
  None = 0,
  Bool = 1,      // uint8, nonzero attends
  Additive = 2,  // f32 added to the scores
};

/// How scales and biases are stored: f32, or 16-bit (read as f32; a GGUF
/// Q4_0/Q4_1/Q8_0 transcode has f16 scales, so keeping them halves their bytes).
enum ScaleType : int { kScaleF32 = 0, kScaleF16 = 1, kScaleBF16 = 2 };

/// MLX's CPU exp (mlx/backend/cpu/simd/math.h) computes 2^f for the
/// fraction f of x·log2(e) by this polynomial, highest coefficient first, in
/// Horner's form with FMAs; every SIMD layer evaluates it the same way.
inline constexpr float kExp2Poly[7] = {1.535336188319500e-4f, 1.339887440266574e-3f, 9.618437357674640e-3f,
                                       5.550332471162809e-2f, 2.402264791363012e-1f, 6.931472028550421e-1f,
                                       1.0f};

/// IEEE half to float (exact; subnormals, infinities and NaN included).
inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {
    // Subnormal: normalise.
    exp = 113;
    while (!(man & 0x400)) {
      man <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((man & 0x3ff) << 13);
  }
  float f;
  __builtin_memcpy(&f, &bits, sizeof(f));
  return f;
}

inline float bf16_to_float(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  __builtin_memcpy(&f, &bits, sizeof(f));
  return f;
}

/// Element `i` of a scale or bias array of `type`.
inline float scale_at(const void* p, int64_t i, int type) {
  switch (type) {
    case kScaleF16: return half_to_float(static_cast<const uint16_t*>(p)[i]);
    case kScaleBF16: return bf16_to_float(static_cast<const uint16_t*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

/// What `QmmArgs::w` holds: affine-quantized codes (with scales and biases),
/// or a float matrix `W [N, K]`, row-major, of f32, f16 or bf16 (read as f32,
/// exactly; float_impl.h).
enum WeightType : int { kWeightQuantized = 0, kWeightF32 = 1, kWeightF16 = 2, kWeightBF16 = 3 };
static_assert(kWeightF16 == kWeightF32 + int{kScaleF16} && kWeightBF16 == kWeightF32 + int{kScaleBF16},
              "a float WeightType is 1 + the ScaleType of the same storage");

/// How a quantized weight's codes, scales and biases are arranged (src/ffi.rs
/// declares the same enum).
///
/// - `RowMajor`: MLX's layout (codes `[N, K * bits / 8]` bytes,
///   scales and biases `[N, K / gs]`).
/// - `Rows16`: every block of 16 rows transposed: codes
///   `[N / 16, K * bits / 8, 16]` bytes (byte j of a 16-byte run belongs to row
///   16t + j), scales and biases `[N / 16, K / gs, 16]`. 4- and 8-bit codes
///   only, N a multiple of 16 and group size a multiple of 2 (the bundle's
///   `rows16` layout, docs/bundle-format.md). rows16_impl.h says why.
enum class WeightLayout : int { RowMajor = 0, Rows16 = 1 };

/// `out[M, N] = x[M, K] · Wᵀ` for an affine-quantized `W [N, K]` in MLX's
/// layout: row n is one little-endian bit stream of `bits`-bit codes (u32
/// words), `w[n, k] = scales[n, k / gs] * code + biases[n, k / gs]`; or, with
/// a float `weight_type`, for the float matrix `w` (scales, biases,
/// group_size and bits unused).
struct QmmArgs {
  const float* x;
  int64_t ldx;  // floats between rows of x
  const void* w;
  const void* scales;  // [N, K / gs] of `scale_type`
  const void* biases;
  float* out;
  int64_t ldo;
  int M, N, K, group_size, bits;
  int scale_type;  // ScaleType of scales and biases
  /// Each row of x is one sequence's (a decode step of a batch): compute
  /// every row exactly as if it were alone, whatever M (the matvec path in
  /// runs of at most 8 rows, never the GEMM). Otherwise M > 8 takes the GEMM.
  bool row_invariant;
  int weight_type;  // WeightType of w (kWeightQuantized when zero-initialised)
  WeightLayout layout;  // of a quantized w (row-major when zero-initialised)
};

/// Rotary embedding of `x [A, B, L, D]` (element strides sa, sb, sl; the last
/// axis is contiguous) into a contiguous `out` of the same shape, with the
/// cos/sin table `[L, dims/2]` of the positions.
struct RopeArgs {
  const float* x;
  int64_t sa, sb, sl;
  float* out;
  int A, B, L, D, dims;
  bool traditional;
  const float* cos;
  const float* sin;
};

/// `out = softmax(scale · q kᵀ + mask) v`, q `[B, H, Lq, D]`, k `[B, KVH, Lk, D]`,
/// v `[B, KVH, Lk, Dv]` (any strides, last axis contiguous); row (b, h, i) of
/// the output goes to `out + b·os[0] + h·os[1] + i·os[2]`. Masked-out scores
/// become the lowest f32 (as MLX does).
struct AttnArgs {
  const float* q;
  int64_t qs[4];
  const float* k;
  int64_t ks[4];
  const float* v;
  int64_t vs[4];
  float* out;
  int64_t os[3];
  int B, H, KVH, Lq, Lk, D, Dv;
  float scale;
  bool causal;
  MaskKind mask_kind;
  const void* mask;
  int64_t ms[4];  // element strides of the mask broadcast to [B, H, Lq, Lk]
};

/// `out[r, c] = act(a[r, c]) * b[r, c]`.
struct GateArgs {
  const float* a;
  int64_t lda;
  const float* b;
  int64_t ldb;
  float* out;
  int rows, cols;
  Activation kind;
};

/// Dequantizes the rows `ids` of an affine-quantized `W [N, K]` into `out [n_ids, K]`.
struct GatherArgs {
  const uint32_t* w;
  const void* scales;
  const void* biases;
  const int64_t* ids;  // already checked to lie in [0, N)
  float* out;
  int n_ids, K, group_size, bits;
  int scale_type;
  WeightLayout layout;  // row-major when zero-initialised
};

/// One ISA's kernels. All of them run on the calling thread plus the pool.
struct Table {
  Isa isa;
  const char* name;
  void (*qmm)(const QmmArgs&);
  /// Up to 8 products sharing x (same M, K, bits, group size), in one pass.
  void (*qmm_multi)(const QmmArgs* args, int count);
  void (*rms_norm)(const float* x, int64_t ldx, const float* w, float* out, int rows, int dim, float eps);
  void (*rope)(const RopeArgs&);
  void (*attention)(const AttnArgs&);
  void (*gate)(const GateArgs&);
  void (*gather)(const GatherArgs&);
  float (*read_sum)(const float* x, int64_t n);
};

const Table& table_scalar();
const Table& table_avx2();
const Table& table_avx2i16();
const Table& table_avx512();
const Table& table_avx512vnni();
const Table& table_neon();

/// The kernels in use (the best the CPU supports unless set otherwise).
const Table& table();
/// Whether this CPU (and OS) can run `isa`'s kernels.
bool isa_supported(Isa isa);
/// Uses `isa`'s kernels from now on; false (and no change) when unsupported.
bool set_isa(Isa isa);
/// The best ISA of this CPU.
Isa best_isa();
/// The ISA named `name` (`scalar`, `avx2`, `avx2i16`, `avx512`, `avx512vnni`, `neon`,
/// the names of `Isa::name` in src/fast/cpu.rs); false for any other name. For
/// tools without the Rust side (isa_check).
bool isa_from_name(const char* name, Isa& isa);

/// Best-of-`reps` read bandwidth (GB/s) of summing a `bytes` buffer on the pool's threads.
double read_bandwidth_gbs(size_t bytes, int reps);

// ---- Thread pool (pool.cc) ----

/// Threads a kernel uses (the calling thread included).
int pool_threads();
/// Sets the thread count; n <= 0 restores the default.
void set_pool_threads(int n);
/// The default thread count: set_default_threads's, else the number of
/// physical cores this process may run on.
int default_threads();
/// Sets the default thread count (n <= 0: the physical cores); a pool that
/// runs already takes it at once.
void set_default_threads(int n);
/// How long (µs) an idle worker spins before it parks, and whether it calls
/// sched_yield between polls; read by every idle loop, so a change applies
/// from the next one.
void set_spin(int spin_us, bool yield);
/// Runs `fn(ctx, t)` for every t in [0, n_tasks) on the pool, the calling
/// thread included; returns when all are done. Tasks are claimed dynamically.
void parallel_for_raw(int n_tasks, void (*fn)(void*, int), void* ctx);

template <class F>
inline void parallel_for(int n_tasks, F&& f) {
  if (n_tasks <= 0) return;
  if (n_tasks == 1) {
    f(0);
    return;
  }
  parallel_for_raw(n_tasks, [](void* c, int t) { (*static_cast<typename std::remove_reference<F>::type*>(c))(t); },
                   const_cast<void*>(static_cast<const void*>(&f)));
}

/// Whether this CPU has AMX tiles with 8-bit products (and AVX-512 VBMI,
/// which repacks the weights for them) and the kernel granted this process
/// the tile state (Linux: arch_prctl(ARCH_REQ_XCOMP_PERM), asked once).
/// A hypervisor may hide the tiles, then this is false.
bool amx_supported();
/// Lets the avx512vnni kernels take rows16 products of several rows of x on
/// AMX tiles (the default where supported); their bits are the vpdpwssd
/// products' (rows16_amx_impl.h). Off: vpdpwssd always.
void set_amx(bool on);
/// Whether rows16 products may use AMX: supported and not turned off.
bool amx_active();

/// A per-thread, 64-byte aligned scratch buffer of at least `n` floats; `slot`
/// tells independent buffers of one thread apart. Valid until the same thread
/// asks for the same slot again.
float* scratch(int slot, size_t n);

enum ScratchSlot : int {
  kScratchX = 0,
  kScratchPanel = 1,
  kScratchAttn = 2,
  kScratchScales = 3,
  kScratchShared = 4,
  kScratchStep = 5,  // rotated keys and queries of a cached attention step (nodes/attention.cc)
  kScratchAmx = 6,   // x's int16 steps split into int8 halves for AMX tiles (rows16_amx_impl.h)
  kScratchAmxCodes = 7,  // a row block's codes repacked as AMX tiles (rows16_amx_impl.h)
};

}  // namespace mlxcel::kern
