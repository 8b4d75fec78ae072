// Products of float weights: `out[M, N] = x[M, K] · Wᵀ` for a row-major
// `W [N, K]` of f32, f16 or bf16 (QmmArgs::weight_type), written once against
// the SIMD layer `S` like impl.h and included by each isa_*.cc right after
// it (same namespace, same target pragma). It reuses impl.h's matvec task
// split (`qmv_plan`, `qmv_tasks`) and its GEMM (`gemm_panels`, the MR×NR
// micro-kernel).
//
// Numerics: x is f32 and stays f32; 16-bit weights are widened to f32 as they
// are loaded (`S::load_h`: F16C's vcvtph2ps, NEON's fcvtl, or a 16-bit shift
// for bf16), which is exact; products and sums are f32 FMAs. So the result
// is MLX's f32 `x @ W.astype(f32).T` up to the order of the sums.

// W elements of row data `w` from element i, as f32 (`WT` is the ScaleType of
// the weights: kScaleF32, kScaleF16 or kScaleBF16).
template <int WT>
inline V load_w(const void* w, int64_t i) {
  if constexpr (WT == kScaleF32) {
    return S::load(static_cast<const float*>(w) + i);
  } else {
    return S::load_h(static_cast<const uint16_t*>(w) + i, WT);
  }
}

// The first n < W of them, the other lanes zero.
template <int WT>
inline V load_w_n(const void* w, int64_t i, int n) {
  if constexpr (WT == kScaleF32) {
    return S::load_n(static_cast<const float*>(w) + i, n);
  } else {
    uint16_t t[W];
    for (int j = 0; j < W; ++j) t[j] = j < n ? static_cast<const uint16_t*>(w)[i + j] : 0;
    return S::load_h(t, WT);
  }
}

// ---------------------------------------------------------------------------
// Matvec (decode): row n of W against MM rows of x, read in place. Each row
// of x has its own two accumulators (even and odd vectors of K, then the
// tail), so it gets the same operations, in the same order, whatever MM: its
// bits do not depend on the other rows of its run (batch invariance).

// How far ahead of its loads the float matvec prefetches W. 2, 4 and 8 KB
// measured alike within noise (8 KB a little ahead) on the AVX-512 host.
constexpr int64_t kFloatAheadBytes = 8192;

template <int WT, int MM>
inline void fmv_row(const QmmArgs& a, int n, const float* x, float* out) {
  const int K = a.K;
  const int64_t ldx = a.ldx;
  V acc[MM][2];
#pragma GCC unroll 8
  for (int m = 0; m < MM; ++m) acc[m][0] = acc[m][1] = S::zero();
  const int64_t row0 = static_cast<int64_t>(n) * K;
  // Software prefetch kFloatAheadBytes ahead in W, every cache line once or
  // more: the rows are contiguous, so this runs on into the rows after n.
  // Without it one core read bf16 weights at ~9 GB/s of its ~14 (the
  // hardware prefetcher alone keeps too few lines in flight behind these
  // loads); with it ~12, and two threads 18 -> 25 GB/s (docs/kernels.md).
  constexpr int64_t kEs = WT == kScaleF32 ? 4 : 2;
  constexpr int64_t kStepBytes = 2 * W * kEs;
  static_assert(kStepBytes <= 128, "a step of 2W weights spans at most two cache lines");
  // An address, not a pointer: it may run past the end of W.
  const uintptr_t ahead = reinterpret_cast<uintptr_t>(a.w) + static_cast<uintptr_t>(row0 * kEs + kFloatAheadBytes);
  int k = 0;
  for (; k + 2 * W <= K; k += 2 * W) {
    // A fixed distance in bytes, not SpreadPrefetch's blocks ahead: the rows
    // are one stream, so one or two prefetches a step and no bound checks
    // (this form is the one measured). SpreadPrefetch had compiled to
    // nothing here until S::prefetch became volatile asm (docs/kernels.md).
    // Prefetches never fault, so an address past the end of W is harmless.
    S::prefetch(reinterpret_cast<const void*>(ahead + k * kEs));
    if constexpr (kStepBytes > 64) S::prefetch(reinterpret_cast<const void*>(ahead + k * kEs + 64));
    const V w0 = load_w<WT>(a.w, row0 + k);
    const V w1 = load_w<WT>(a.w, row0 + k + W);
#pragma GCC unroll 8
    for (int m = 0; m < MM; ++m) {
      acc[m][0] = S::fma(w0, S::load(x + m * ldx + k), acc[m][0]);
      acc[m][1] = S::fma(w1, S::load(x + m * ldx + k + W), acc[m][1]);
    }
  }
  if (k + W <= K) {
    const V w0 = load_w<WT>(a.w, row0 + k);
#pragma GCC unroll 8
    for (int m = 0; m < MM; ++m) acc[m][0] = S::fma(w0, S::load(x + m * ldx + k), acc[m][0]);
    k += W;
  }
  if (k < K) {
    const int nk = K - k;
    const V w0 = load_w_n<WT>(a.w, row0 + k, nk);
#pragma GCC unroll 8
    for (int m = 0; m < MM; ++m) acc[m][1] = S::fma(w0, S::load_n(x + m * ldx + k, nk), acc[m][1]);
  }
  for (int m = 0; m < MM; ++m) out[static_cast<int64_t>(m) * a.ldo + n] = S::hsum(S::add(acc[m][0], acc[m][1]));
}

// One row of W per pass, in order: the rows are contiguous, so the pass reads
// one sequential stream, which the hardware prefetcher follows. Interleaving
// 4 rows per pass (4 streams a row apart, for fewer horizontal sums) was
// 14-19% slower at decoding SmolLM2 bf16 on 2 threads (docs/kernels.md).
template <int WT, int MM>
void fmv_range(const QmmArgs& a, int n0, int n1, const float* x, float* out) {
  for (int n = n0; n < n1; ++n) fmv_row<WT, MM>(a, n, x, out);
}

template <int WT>
void fmv_dispatch_m(const QmmArgs& a, int mm, int n0, int n1, const float* x, float* out) {
  switch (mm) {
    case 1: fmv_range<WT, 1>(a, n0, n1, x, out); break;
    case 2: fmv_range<WT, 2>(a, n0, n1, x, out); break;
    case 3: fmv_range<WT, 3>(a, n0, n1, x, out); break;
    case 4: fmv_range<WT, 4>(a, n0, n1, x, out); break;
    case 5: fmv_range<WT, 5>(a, n0, n1, x, out); break;
    case 6: fmv_range<WT, 6>(a, n0, n1, x, out); break;
    case 7: fmv_range<WT, 7>(a, n0, n1, x, out); break;
    default: fmv_range<WT, 8>(a, n0, n1, x, out); break;
  }
}

// Rows n0 .. n1 of one matrix against mm (<= 8) rows of x.
inline void fmv(const QmmArgs& a, int mm, int n0, int n1, const float* x, float* out) {
  switch (a.weight_type) {
    case kWeightF16: fmv_dispatch_m<kScaleF16>(a, mm, n0, n1, x, out); break;
    case kWeightBF16: fmv_dispatch_m<kScaleBF16>(a, mm, n0, n1, x, out); break;
    default: fmv_dispatch_m<kScaleF32>(a, mm, n0, n1, x, out); break;
  }
}

// ---------------------------------------------------------------------------
// GEMM (prefill): W rows at a time are widened, transposed in registers and
// stored k-major, then impl.h's micro-kernel.

template <int WT>
void pack_strip_float(const QmmArgs& a, int n0, int k0, int kc, float* Bp) {
  constexpr int NV = S::GEMM_NV, NR = NV * W;
  const int64_t K = a.K;
  for (int v = 0; v < NV; ++v) {
    const int r0 = n0 + v * W;
    for (int k = k0; k < k0 + kc; k += W) {
      const int nk = imin(W, k0 + kc - k);
      V rows[W];
      for (int r = 0; r < W; ++r) {
        const int n = r0 + r;
        if (n >= a.N) {
          rows[r] = S::zero();
        } else {
          rows[r] = nk == W ? load_w<WT>(a.w, n * K + k) : load_w_n<WT>(a.w, n * K + k, nk);
        }
      }
      // Lane t of row r is element k + t of row r0 + r.
      S::transpose(rows);
      float* dst = Bp + static_cast<int64_t>(k - k0) * NR + v * W;
      for (int t = 0; t < nk; ++t) S::store(dst + t * NR, rows[t]);
    }
  }
}

template <int WT>
void fgemm(const QmmArgs& a) {
  gemm_panels(a, [&](int n0, int k0, int kc, float* Bp) { pack_strip_float<WT>(a, n0, k0, kc, Bp); });
}

// `count` (at most 8) products of the same x, each matrix of any float type.
// Up to kQmvMaxM rows of x, or any number of row-invariant ones (a decode
// batch), take the matvec in runs of at most kQmvMaxM rows; more take the GEMM.
void fmm_multi(const QmmArgs* args, int count) {
  if (args[0].M <= kQmvMaxM || args[0].row_invariant) {
    int first[8 + 1];
    const int chunk = qmv_plan(args, count, first);
    qmv_tasks(args, first, count, chunk, args[0].M, [&](const QmmArgs& ai, int m0, int mm, int n0, int n1) {
      fmv(ai, mm, n0, n1, ai.x + m0 * ai.ldx, ai.out + m0 * ai.ldo);
    });
    return;
  }
  for (int i = 0; i < count; ++i) {
    const QmmArgs& a = args[i];
    if (a.N <= 0) continue;
    switch (a.weight_type) {
      case kWeightF16: fgemm<kScaleF16>(a); break;
      case kWeightBF16: fgemm<kScaleBF16>(a); break;
      default: fgemm<kScaleF32>(a); break;
    }
  }
}
