// The quantized GEMM (prefill shapes), the dispatch of every weight product
// (qmm_multi: matvec, GEMM, float weights, rows16) and the row gather,
// included by impl.h after qmv_impl.h.
#pragma once

// ---------------------------------------------------------------------------
// Quantized matmul, prefill shapes: dequantize a panel of W (transposed to
// k-major strips of NR columns) into scratch, then a register-blocked FMA
// micro-kernel computes MR x NR tiles of the output.

constexpr int kGemmKC = 256;  // k per panel (a multiple of every group size)

// Dequantizes rows n0 .. n0+NR of W, k in [k0, k0+kc), into Bp [kc][NR].
template <int BITS>
void pack_strip(const QmmArgs& a, int n0, int k0, int kc, float* Bp) {
  constexpr int NV = S::GEMM_NV, NR = NV * W;
  constexpr int SPAN = BITS == 4 ? 2 * W : W;
  const int G = a.K / a.group_size;
  const int64_t row_bytes = static_cast<int64_t>(a.K) * BITS / 8;
  const uint8_t* wb = static_cast<const uint8_t*>(a.w);
  for (int v = 0; v < NV; ++v) {
    const int r0 = n0 + v * W;
    for (int k = k0; k < k0 + kc; k += SPAN) {
      V lo[W], hi[W];
      const int g = k / a.group_size;
      for (int r = 0; r < W; ++r) {
        const int n = r0 + r;
        if (n < a.N) {
          const uint8_t* p = wb + n * row_bytes + static_cast<int64_t>(k) * BITS / 8;
          const V s = S::set1(scale_at(a.scales, static_cast<int64_t>(n) * G + g, a.scale_type));
          const V b = S::set1(scale_at(a.biases, static_cast<int64_t>(n) * G + g, a.scale_type));
          if constexpr (BITS == 4) {
            S::nib(p, lo[r], hi[r]);
            lo[r] = S::fma(lo[r], s, b);
            hi[r] = S::fma(hi[r], s, b);
          } else {
            lo[r] = S::fma(load_codes<BITS>(wb + n * row_bytes, k), s, b);
            hi[r] = S::zero();
          }
        } else {
          lo[r] = S::zero();
          hi[r] = S::zero();
        }
      }
      // Lane t of row r is element k + 2t (4-bit even), k + 2t + 1 (odd) or k + t (8-bit).
      S::transpose(lo);
      float* dst = Bp + static_cast<int64_t>(k - k0) * NR + v * W;
      if constexpr (BITS == 4) {
        S::transpose(hi);
        for (int t = 0; t < W; ++t) {
          S::store(dst + (2 * t) * NR, lo[t]);
          S::store(dst + (2 * t + 1) * NR, hi[t]);
        }
      } else {
        for (int t = 0; t < W; ++t) S::store(dst + t * NR, lo[t]);
      }
    }
  }
}

// C[MR, ncols] (+)= A[MR, kc] · B[kc, NR] (B packed k-major).
template <int MR>
void ukernel(int kc, const float* A, int64_t lda, const float* B, float* C, int64_t ldc, bool accumulate, int ncols) {
  constexpr int NV = S::GEMM_NV, NR = NV * W;
  V c[MR][NV];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) c[i][v] = S::zero();
  for (int k = 0; k < kc; ++k) {
    V b[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) b[v] = S::load(B + static_cast<int64_t>(k) * NR + v * W);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const V ai = S::set1(A[i * lda + k]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) c[i][v] = S::fma(ai, b[v], c[i][v]);
    }
  }
  for (int i = 0; i < MR; ++i) {
    for (int v = 0; v < NV; ++v) {
      float* p = C + i * ldc + v * W;
      const int nc = ncols - v * W;
      if (nc >= W) {
        S::store(p, accumulate ? S::add(c[i][v], S::load(p)) : c[i][v]);
      } else if (nc > 0) {
        S::store_n(p, accumulate ? S::add(c[i][v], S::load_n(p, nc)) : c[i][v], nc);
      }
    }
  }
}

inline void ukernel_rows(int mr, int kc, const float* A, int64_t lda, const float* B, float* C, int64_t ldc,
                         bool accumulate, int ncols) {
  static_assert(S::GEMM_MR <= 12, "ukernel_rows covers up to 12 rows");
  switch (mr) {
    case 1: ukernel<1>(kc, A, lda, B, C, ldc, accumulate, ncols); break;
    case 2: ukernel<2>(kc, A, lda, B, C, ldc, accumulate, ncols); break;
    case 3: ukernel<3>(kc, A, lda, B, C, ldc, accumulate, ncols); break;
    case 4: ukernel<4>(kc, A, lda, B, C, ldc, accumulate, ncols); break;
    case 5: ukernel<5>(kc, A, lda, B, C, ldc, accumulate, ncols); break;
    case 6: ukernel<6>(kc, A, lda, B, C, ldc, accumulate, ncols); break;
    case 7: ukernel<7>(kc, A, lda, B, C, ldc, accumulate, ncols); break;
    case 8: ukernel<8>(kc, A, lda, B, C, ldc, accumulate, ncols); break;
    case 9: ukernel<9>(kc, A, lda, B, C, ldc, accumulate, ncols); break;
    case 10: ukernel<10>(kc, A, lda, B, C, ldc, accumulate, ncols); break;
    case 11: ukernel<11>(kc, A, lda, B, C, ldc, accumulate, ncols); break;
    default: ukernel<12>(kc, A, lda, B, C, ldc, accumulate, ncols); break;
  }
}

// The GEMM over panels of W: `pack(n0, k0, kc, Bp)` writes rows n0 .. n0+NR
// of W, k in [k0, k0+kc), k-major into Bp [kc][NR] (zero past N).
template <class Pack>
void gemm_panels(const QmmArgs& a, const Pack& pack) {
  constexpr int NR = S::GEMM_NV * W, MR = S::GEMM_MR;
  const int M = a.M, N = a.N, K = a.K;
  const int strips = ceil_div(N, NR);
  const int threads = pool_threads();
  // Panels of whole strips; at least ~4 per thread for balance, at most 8 strips.
  int panel = imax(1, imin(8, strips / imax(1, threads * 4)));
  const int npanels = ceil_div(strips, panel);
  // Too few panels for the threads: split the rows of x as well.
  int mchunks = 1;
  if (threads > 1 && npanels < 2 * threads) mchunks = imax(1, imin(ceil_div(2 * threads, npanels), M / (4 * MR)));
  const int mchunk = round_up(ceil_div(M, mchunks), MR);
  mchunks = ceil_div(M, mchunk);
  parallel_for(npanels * mchunks, [&](int t) {
    const int p = t % npanels, mc = t / npanels;
    const int s0 = p * panel, s1 = imin(strips, s0 + panel);
    const int m0 = mc * mchunk, m1 = imin(M, m0 + mchunk);
    float* Bp = scratch(kScratchPanel, static_cast<size_t>(panel) * NR * kGemmKC);
    for (int k0 = 0; k0 < K; k0 += kGemmKC) {
      const int kc = imin(kGemmKC, K - k0);
      for (int s = s0; s < s1; ++s) pack(s * NR, k0, kc, Bp + static_cast<int64_t>(s - s0) * kc * NR);
      for (int s = s0; s < s1; ++s) {
        const float* B = Bp + static_cast<int64_t>(s - s0) * kc * NR;
        const int ncols = imin(NR, N - s * NR);
        for (int m = m0; m < m1; m += MR) {
          ukernel_rows(imin(MR, m1 - m), kc, a.x + m * a.ldx + k0, a.ldx, B, a.out + m * a.ldo + s * NR, a.ldo,
                       k0 > 0, ncols);
        }
      }
    }
  });
}

template <int BITS>
void qgemm(const QmmArgs& a) {
  gemm_panels(a, [&](int n0, int k0, int kc, float* Bp) { pack_strip<BITS>(a, n0, k0, kc, Bp); });
}

template <int BITS>
void qmm_multi_bits(const QmmArgs* args, int count) {
  // The matvec computes each row of x on its own (in runs of kQmvMaxM rows),
  // so a row's bits do not depend on M; the GEMM's do differ from it.
  if (args[0].M <= kQmvMaxM || args[0].row_invariant) {
    qmv_multi<BITS>(args, count);
    return;
  }
  for (int i = 0; i < count; ++i)
    if (args[i].N > 0) qgemm<BITS>(args[i]);
}

// Products of float weights (float_impl.h, included after this file).
void fmm_multi(const QmmArgs* args, int count);
// Products and gathers of weights in the rows16 layout (rows16_impl.h, likewise).
void rows16_multi(const QmmArgs* args, int count);
void rows16_gather(const GatherArgs& a);

// `count` (at most 8) products of the same x (same M, K, bits and group size;
// or all of float weights).
void qmm_multi(const QmmArgs* args, int count) {
  if (count <= 0 || args[0].M <= 0) return;
  if (args[0].weight_type != kWeightQuantized) return fmm_multi(args, count);
  if (args[0].layout == WeightLayout::Rows16) return rows16_multi(args, count);
  switch (args[0].bits) {
    case 2: qmm_multi_bits<2>(args, count); break;
    case 3: qmm_multi_bits<3>(args, count); break;
    case 4: qmm_multi_bits<4>(args, count); break;
    case 5: qmm_multi_bits<5>(args, count); break;
    case 6: qmm_multi_bits<6>(args, count); break;
    default: qmm_multi_bits<8>(args, count); break;
  }
}

void qmm(const QmmArgs& a) {
  if (a.N > 0) qmm_multi(&a, 1);
}

// ---------------------------------------------------------------------------
// Quantized rows (embedding lookup): plain dequantization, scale * q + bias
// rounded twice as MLX's dequantize does.

void gather(const GatherArgs& a) {
  if (a.layout == WeightLayout::Rows16) return rows16_gather(a);
  const int K = a.K, gs = a.group_size, G = K / gs, bits = a.bits;
  const int64_t row_bytes = static_cast<int64_t>(K) * bits / 8;
  const uint8_t* wb = reinterpret_cast<const uint8_t*>(a.w);
  for (int i = 0; i < a.n_ids; ++i) {
    const int64_t n = a.ids[i];
    const uint8_t* p = wb + n * row_bytes;
    float* o = a.out + static_cast<int64_t>(i) * K;
    for (int k = 0; k < K; ++k) {
      const int q = code_at(p, k, bits);
      const float s = scale_at(a.scales, n * G + k / gs, a.scale_type);
      const float b = scale_at(a.biases, n * G + k / gs, a.scale_type);
      const float prod = s * static_cast<float>(q);
      o[k] = prod + b;
    }
  }
}
