// Products and row gathers of 4- and 8-bit weights in the `rows16` layout
// (kernels.h, WeightLayout::Rows16): every block of 16 rows is stored k-major, so
// the 16 rows' codes for one k (8-bit) or one pair of k (4-bit) are 16
// consecutive bytes, and their scales and biases for one group are 16
// consecutive values. Included by each isa_*.cc after impl.h.
//
// Why this layout: a decode batch of M sequences must read each weight once
// for all M rows. With 16 outputs along the vector lanes, a weight is
// dequantized once, `w = fma(code, scale, bias)`, and multiplied into M
// accumulators; MLX's row-major layout puts k along the lanes instead, which
// leaves each row of x a horizontal sum per output and amortizes nothing.
//
// Numerics: output n of row m is `sum_k fma(code, s, b) * x[m, k]`, one fused
// multiply-add per k in increasing k, f32 throughout, so it is the same bits
// on every float ISA (scalar, avx2, avx512, neon), for every M, and for
// prefill and decode alike. The avx512vnni build rounds x to int16 steps per
// group instead (rows16_i16_impl.h): its bits are its own, and still the same
// for every M.

constexpr int kRows16 = 16;
// Rows of x one pass of the micro-kernel carries in registers.
constexpr int kRows16MaxMM = S::TILE_MM;
// Rows of x per task of a long (prefill) x: they stay in L2 while every block
// of W streams past them.
constexpr int kRows16Chunk = 64;
// Rows of x up to which rows16_multi splits a product into few tasks per
// thread (kRows16DecodeTasks) rather than about 8 (more rows: prefills and
// decode batches of 5 and more).
constexpr int kRows16DecodeRows = 4;
constexpr int kRows16DecodeTasks = 2;
// Bytes of a row block the software prefetch runs ahead (once per cache line).
constexpr int kRows16Ahead = 4096;

// The 16 scales (or biases) of row block `t`, group `g`, as 16 / W vectors.
template <int ST>
inline void rows16_scales(const void* p, int64_t at, V* out) {
  for (int u = 0; u < kRows16 / W; ++u) {
    if constexpr (ST == kScaleF32) {
      out[u] = S::load(static_cast<const float*>(p) + at + u * W);
    } else {
      out[u] = S::load_h(static_cast<const uint16_t*>(p) + at + u * W, ST);
    }
  }
}

// Row blocks t0 .. t0 + NB of W against MM rows of x (x rows at `x`, stride
// ldx; outputs at `out`, stride ldo, column t * 16).
template <int BITS, int ST, int MM, int NB>
void rows16_block(const QmmArgs& a, int t0, const float* x, int64_t ldx, float* out, int64_t ldo) {
  constexpr int VT = kRows16 / W;
  const int K = a.K, gs = a.group_size, G = K / gs;
  const int64_t block_bytes = static_cast<int64_t>(K) * BITS / 8 * kRows16;
  const uint8_t* w = static_cast<const uint8_t*>(a.w);
  V acc[NB][VT][MM];
  for (int r = 0; r < NB; ++r)
    for (int u = 0; u < VT; ++u)
      for (int m = 0; m < MM; ++m) acc[r][u][m] = S::zero();
  const V lut = S::iota();
  for (int g = 0; g < G; ++g) {
    V s[NB][VT], b[NB][VT];
    for (int r = 0; r < NB; ++r) {
      const int64_t at = (static_cast<int64_t>(t0 + r) * G + g) * kRows16;
      rows16_scales<ST>(a.scales, at, s[r]);
      rows16_scales<ST>(a.biases, at, b[r]);
    }
    // One cache line (64 bytes) of each row block per step: 8 inputs of
    // 4-bit codes, 4 of 8-bit; pointers advance instead of being recomputed.
    constexpr int kPerLine = 64 / kRows16 * 8 / BITS;
    const uint8_t* p[NB];
    for (int r = 0; r < NB; ++r) p[r] = w + (t0 + r) * block_bytes + static_cast<int64_t>(g) * gs * BITS / 8 * kRows16;
    for (int k = g * gs; k < (g + 1) * gs; k += kPerLine) {
      for (int r = 0; r < NB; ++r) S::prefetch(p[r] + kRows16Ahead);
      if constexpr (BITS == 4) {
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) {
#pragma GCC unroll 4
          for (int r = 0; r < NB; ++r) {
#pragma GCC unroll 16
            for (int u = 0; u < VT; ++u) {
              V lo, hi;
              if constexpr (S::kLut16) {
                S::nib_lut(p[r] + j * kRows16 + u * W, lut, lo, hi);
              } else {
                S::nib(p[r] + j * kRows16 + u * W, lo, hi);
              }
              const V w0 = S::fma(lo, s[r][u], b[r][u]);
              const V w1 = S::fma(hi, s[r][u], b[r][u]);
#pragma GCC unroll 16
              for (int m = 0; m < MM; ++m) {
                const float* xm = x + m * ldx + k + 2 * j;
                acc[r][u][m] = S::fma(w0, S::set1(xm[0]), acc[r][u][m]);
                acc[r][u][m] = S::fma(w1, S::set1(xm[1]), acc[r][u][m]);
              }
            }
          }
        }
      } else {
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) {
#pragma GCC unroll 4
          for (int r = 0; r < NB; ++r) {
#pragma GCC unroll 16
            for (int u = 0; u < VT; ++u) {
              const V wk = S::fma(S::u8(p[r] + j * kRows16 + u * W), s[r][u], b[r][u]);
#pragma GCC unroll 16
              for (int m = 0; m < MM; ++m) acc[r][u][m] = S::fma(wk, S::set1(x[m * ldx + k + j]), acc[r][u][m]);
            }
          }
        }
      }
      for (int r = 0; r < NB; ++r) p[r] += 64;
    }
  }
  for (int r = 0; r < NB; ++r)
    for (int u = 0; u < VT; ++u)
      for (int m = 0; m < MM; ++m) S::store(out + m * ldo + (t0 + r) * kRows16 + u * W, acc[r][u][m]);
}

// Row blocks t0 .. t1 of W against `mm` (at most kRows16MaxMM) rows of x,
// NB blocks at a time so that at least 8 accumulators are independent: an
// accumulator takes a chain of dependent FMAs (4 cycles each), and two FMAs
// issue per cycle.
template <int BITS, int ST, int MM>
void rows16_rows(const QmmArgs& a, int t0, int t1, const float* x, float* out) {
  constexpr int NB = MM <= 2 ? 2 : 1;
  int t = t0;
  for (; t + NB <= t1; t += NB) rows16_block<BITS, ST, MM, NB>(a, t, x, a.ldx, out, a.ldo);
  for (; t < t1; ++t) rows16_block<BITS, ST, MM, 1>(a, t, x, a.ldx, out, a.ldo);
}

// Rows m0 .. m1 of x in runs of MAXMM, 8, 4, 2 and 1 rows (the sizes below
// MAXMM only): `run.template operator()<MM>(m)` for the run starting at m.
template <int MAXMM, class Run>
inline void rows16_runs(int m0, int m1, const Run& run) {
  constexpr int kEight = MAXMM > 8 ? 8 : 1, kFour = MAXMM > 4 ? 4 : 1;
  for (int m = m0; m < m1;) {
    const int left = m1 - m;
    if (left >= MAXMM) {
      run.template operator()<MAXMM>(m);
      m += MAXMM;
    } else if (MAXMM > 8 && left >= 8) {
      run.template operator()<kEight>(m);
      m += kEight;
    } else if (MAXMM > 4 && left >= 4) {
      run.template operator()<kFour>(m);
      m += kFour;
    } else if (left >= 2) {
      run.template operator()<2>(m);
      m += 2;
    } else {
      run.template operator()<1>(m);
      m += 1;
    }
  }
}

// Row blocks t0 .. t1 of W against rows m0 .. m1 of x.
template <int BITS, int ST>
void rows16_range(const QmmArgs& a, int t0, int t1, int m0, int m1) {
  rows16_runs<kRows16MaxMM>(m0, m1, [&]<int MM>(int m) {
    rows16_rows<BITS, ST, MM>(a, t0, t1, a.x + m * a.ldx, a.out + m * a.ldo);
  });
}

template <int BITS>
void rows16_dispatch(const QmmArgs& a, int t0, int t1, int m0, int m1) {
  switch (a.scale_type) {
    case kScaleF16: rows16_range<BITS, kScaleF16>(a, t0, t1, m0, m1); break;
    case kScaleBF16: rows16_range<BITS, kScaleBF16>(a, t0, t1, m0, m1); break;
    default: rows16_range<BITS, kScaleF32>(a, t0, t1, m0, m1); break;
  }
}

#if defined(MLXCEL_DOT_I16)
#include "mlxcel-mlx/cpp/kernels/rows16_i16_impl.h"
#include "mlxcel-mlx/cpp/kernels/rows16_amx_impl.h"
#define MLXCEL_ROWS16_I16 1
#elif defined(MLXCEL_ROWS16_I16_AVX2)
#include "mlxcel-mlx/cpp/kernels/rows16_i16_avx2_impl.h"
#define MLXCEL_ROWS16_I16 1
#endif

#if defined(MLXCEL_ROWS16_I16)
// Row blocks t0 .. t1 against rows m0 .. m1 of the int16 x (all M rows in
// `x`), in runs of the build's kRows16I16MaxMM rows and fewer.
template <int BITS, int ST>
void rows16_range_i16(const QmmArgs& a, int t0, int t1, int m0, int m1, const Rows16X& x) {
  const int K = a.K, G = K / a.group_size;
  rows16_runs<kRows16I16MaxMM>(m0, m1, [&]<int MM>(int m) {
    const int64_t qo = static_cast<int64_t>(m) * K, go = static_cast<int64_t>(m) * G;
    const Rows16X xm{x.q + qo, x.dx + go, x.xs + go, x.q2 + qo, x.dx2 + go};
    rows16_rows_i16<BITS, ST, MM>(a, t0, t1, xm, a.out + m * a.ldo);
  });
}

template <int BITS>
void rows16_dispatch_i16(const QmmArgs& a, int t0, int t1, int m0, int m1, const Rows16X& x) {
  switch (a.scale_type) {
    case kScaleF16: rows16_range_i16<BITS, kScaleF16>(a, t0, t1, m0, m1, x); break;
    case kScaleBF16: rows16_range_i16<BITS, kScaleBF16>(a, t0, t1, m0, m1, x); break;
    default: rows16_range_i16<BITS, kScaleF32>(a, t0, t1, m0, m1, x); break;
  }
}
#endif

// `count` (at most 8) products of the same x in `rows16` layout, any M: one
// parallel pass over (chunks of row blocks) x (chunks of kRows16Chunk rows of x).
void rows16_multi(const QmmArgs* args, int count) {
  const int M = args[0].M;
#if defined(MLXCEL_ROWS16_I16)
  // x as int16 steps once for all the products (rows16_i16_impl.h,
  // rows16_i16_avx2_impl.h).
  Rows16X xq{};
  const bool i16 = rows16_i16_applies(args[0]);
  if (i16) {
    const int K = args[0].K, gs = args[0].group_size, G = K / gs;
    const size_t mk = static_cast<size_t>(M) * K, mg = static_cast<size_t>(M) * G;
    float* buf = scratch(kScratchX, mk + 3 * mg + 16);  // two int16 codes per element, three floats per group
    int16_t* q = reinterpret_cast<int16_t*>(buf);
    int16_t* q2 = q + mk;
    float* dx = buf + mk;
    float* xs = dx + mg;
    float* dx2 = xs + mg;
    for (int m = 0; m < M; ++m)
      rows16_quantize_x(args[0].x + m * args[0].ldx, K, gs, q + static_cast<int64_t>(m) * K, dx + m * G, xs + m * G,
                        q2 + static_cast<int64_t>(m) * K, dx2 + m * G);
    xq = Rows16X{q, dx, xs, q2, dx2};
  }
#endif
#if defined(MLXCEL_DOT_I16)
  // And split into int8 halves once for the AMX tiles (rows16_amx_impl.h).
  Rows16AmxX xt{};
  const bool amx = i16 && M >= kAmxMinRows && rows16_amx_applies(args[0]) && amx_active();
  if (amx) {
    const int K = args[0].K, gs = args[0].group_size;
    float* buf = scratch(kScratchAmx, (rows16_amx_bytes(M, K, gs) + sizeof(float) - 1) / sizeof(float));
    xt = rows16_amx_split(xq, M, K, gs, reinterpret_cast<uint8_t*>(buf));
  }
#endif
  int64_t blocks = 0;
  for (int i = 0; i < count; ++i) blocks += args[i].N / kRows16;
  const int mchunks = ceil_div(M, kRows16Chunk);
  const int threads = pool_threads();
  const bool parallel =
      threads > 1 && static_cast<int64_t>(M) * blocks * kRows16 * args[0].K >= kParallelWork * 4;
  // At least 2 row blocks a task. Up to kRows16DecodeRows rows, about
  // kRows16DecodeTasks tasks per thread, each a long run of consecutive
  // blocks (the weights stream once, and the prefetchers restart at every
  // task); more rows, about 8 (each block is then many rows' work, and
  // balance matters more).
  const int per_thread = M <= kRows16DecodeRows ? kRows16DecodeTasks : 8;
  const int chunk =
      parallel ? imax(2, static_cast<int>(ceil_div(static_cast<int>(blocks) * mchunks, threads * per_thread)))
               : static_cast<int>(blocks);
  int first[8 + 1];
  first[0] = 0;
  for (int i = 0; i < count; ++i) first[i + 1] = first[i] + ceil_div(args[i].N / kRows16, chunk);
  auto task = [&](int t) {
    const int mc = t / first[count];
    int i = 0;
    t %= first[count];
    while (t >= first[i + 1]) ++i;
    const QmmArgs& a = args[i];
    const int b0 = (t - first[i]) * chunk, b1 = imin(a.N / kRows16, b0 + chunk);
    const int m0 = mc * kRows16Chunk, m1 = imin(M, m0 + kRows16Chunk);
#if defined(MLXCEL_DOT_I16)
    if (amx && m1 - m0 >= kAmxMinRows) {
      if (a.bits == 4) {
        rows16_dispatch_amx<4>(a, b0, b1, m0, m1, xq, xt);
      } else {
        rows16_dispatch_amx<8>(a, b0, b1, m0, m1, xq, xt);
      }
      return;
    }
#endif
#if defined(MLXCEL_ROWS16_I16)
    if (i16) {
      if (a.bits == 4) {
        rows16_dispatch_i16<4>(a, b0, b1, m0, m1, xq);
      } else {
        rows16_dispatch_i16<8>(a, b0, b1, m0, m1, xq);
      }
      return;
    }
#endif
    if (a.bits == 4) {
      rows16_dispatch<4>(a, b0, b1, m0, m1);
    } else {
      rows16_dispatch<8>(a, b0, b1, m0, m1);
    }
  };
  if (!parallel) {
    for (int t = 0; t < first[count] * mchunks; ++t) task(t);
    return;
  }
  parallel_for(first[count] * mchunks, task);
}

// Rows `ids` of a `rows16` table, dequantized as the products dequantize
// (`fma(code, scale, bias)`).
void rows16_gather(const GatherArgs& a) {
  const int K = a.K, gs = a.group_size, G = K / gs, bits = a.bits;
  const int64_t block_bytes = static_cast<int64_t>(K) * bits / 8 * kRows16;
  const uint8_t* wb = reinterpret_cast<const uint8_t*>(a.w);
  for (int i = 0; i < a.n_ids; ++i) {
    const int64_t n = a.ids[i], t = n / kRows16, j = n % kRows16;
    const uint8_t* p = wb + t * block_bytes + j;
    float* o = a.out + static_cast<int64_t>(i) * K;
    for (int k = 0; k < K; ++k) {
      const uint8_t byte = p[static_cast<int64_t>(k) * bits / 8 * kRows16];
      const int q = bits == 4 ? (k % 2 == 0 ? byte & 15 : byte >> 4) : byte;
      const int64_t at = (t * G + k / gs) * kRows16 + j;
      o[k] = __builtin_fmaf(static_cast<float>(q), scale_at(a.scales, at, a.scale_type),
                            scale_at(a.biases, at, a.scale_type));
    }
  }
}
