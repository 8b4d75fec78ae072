// The kernels between the products: RMS norm, RoPE, gated activations and
// attention (decode and prefill), included by impl.h after gemm_impl.h.
#pragma once

// ---------------------------------------------------------------------------
// RMS norm: x * (1 / sqrt(sum(x²) * (1/D) + eps)) * w, in that rounding order
// (MLX's fallback: mean as sum times 1/D, rsqrt as 1/sqrt).

void rms_norm(const float* x, int64_t ldx, const float* w, float* out, int rows, int dim, float eps) {
  const float inv_dim = static_cast<float>(1.0 / dim);
  auto body = [&](int r0, int r1) {
    for (int r = r0; r < r1; ++r) {
      const float* xr = x + r * ldx;
      float* o = out + static_cast<int64_t>(r) * dim;
      const float ss = dot(xr, xr, dim);
      const float scale = 1.0f / __builtin_sqrtf(ss * inv_dim + eps);
      const V sv = S::set1(scale);
      int i = 0;
      for (; i + W <= dim; i += W) {
        V y = S::mul(S::load(xr + i), sv);
        if (w) y = S::mul(y, S::load(w + i));
        S::store(o + i, y);
      }
      if (i < dim) {
        V y = S::mul(S::load_n(xr + i, dim - i), sv);
        if (w) y = S::mul(y, S::load_n(w + i, dim - i));
        S::store_n(o + i, y, dim - i);
      }
    }
  };
  const bool parallel = pool_threads() > 1 && static_cast<int64_t>(rows) * dim >= kParallelWork;
  const int chunk = parallel ? imax(1, ceil_div(rows, pool_threads() * 4)) : rows;
  parallel_for(ceil_div(rows, chunk), [&](int t) { body(t * chunk, imin(rows, (t + 1) * chunk)); });
}

// ---------------------------------------------------------------------------
// RoPE with a precomputed cos/sin table: x1 c - x2 s and x1 s + x2 c, each
// product rounded (as MLX's fallback computes it).

void rope(const RopeArgs& a) {
  const int half = a.dims / 2, D = a.D;
  const int rows = a.A * a.B * a.L;
  auto body = [&](int t0, int t1) {
    for (int t = t0; t < t1; ++t) {
      const int l = t % a.L, ib = (t / a.L) % a.B, ia = t / (a.L * a.B);
      const float* x = a.x + ia * a.sa + ib * a.sb + l * a.sl;
      float* o = a.out + static_cast<int64_t>(t) * D;
      const float* c = a.cos + static_cast<int64_t>(l) * half;
      const float* s = a.sin + static_cast<int64_t>(l) * half;
      if (!a.traditional) {
        int i = 0;
        for (; i + W <= half; i += W) {
          const V x1 = S::load(x + i), x2 = S::load(x + half + i), cv = S::load(c + i), sv = S::load(s + i);
          S::store(o + i, S::sub(S::mul(x1, cv), S::mul(x2, sv)));
          S::store(o + half + i, S::add(S::mul(x1, sv), S::mul(x2, cv)));
        }
        for (; i < half; ++i) {
          const float x1 = x[i], x2 = x[half + i];
          const float p1 = x1 * c[i], p2 = x2 * s[i], p3 = x1 * s[i], p4 = x2 * c[i];
          o[i] = p1 - p2;
          o[half + i] = p3 + p4;
        }
      } else {
        for (int i = 0; i < half; ++i) {
          const float x1 = x[2 * i], x2 = x[2 * i + 1];
          const float p1 = x1 * c[i], p2 = x2 * s[i], p3 = x1 * s[i], p4 = x2 * c[i];
          o[2 * i] = p1 - p2;
          o[2 * i + 1] = p3 + p4;
        }
      }
      for (int d = a.dims; d < D; ++d) o[d] = x[d];
    }
  };
  const bool parallel = pool_threads() > 1 && static_cast<int64_t>(rows) * D >= kParallelWork;
  const int chunk = parallel ? imax(1, ceil_div(rows, pool_threads() * 4)) : rows;
  parallel_for(ceil_div(rows, chunk), [&](int t) { body(t * chunk, imin(rows, (t + 1) * chunk)); });
}

// ---------------------------------------------------------------------------
// Gated activations: silu(a) * b and gelu_tanh(a) * b.

// MLX's sigmoid: y = 1 / (1 + exp(|x|)); x < 0 ? y : 1 - y.
inline V sigmoid(V x) {
  const V one = S::set1(1.0f);
  const V y = S::div(one, S::add(one, S::exp(S::abs(x))));
  return S::select_neg(x, y, S::sub(one, y));
}

// tanh(y) = sign(y) (1 - e) / (1 + e), e = exp(-2|y|).
inline V tanh_v(V y) {
  const V one = S::set1(1.0f);
  const V e = S::exp(S::mul(S::abs(y), S::set1(-2.0f)));
  const V t = S::div(S::sub(one, e), S::add(one, e));
  return S::select_neg(y, S::sub(S::zero(), t), t);
}

// mlxcel's gelu_approx: (x/2) (1 + tanh(sqrt(2/pi) (x + 0.044715 x³))).
inline V gelu_tanh(V x) {
  const V cube = S::mul(S::mul(x, x), x);
  const V inner = S::mul(S::add(x, S::mul(cube, S::set1(0.044715f))), S::set1(__builtin_sqrtf(2.0f / 3.14159265358979323846f)));
  return S::mul(S::mul(x, S::set1(0.5f)), S::add(tanh_v(inner), S::set1(1.0f)));
}

inline V gate_act(Activation kind, V x) { return kind == Activation::Silu ? S::mul(x, sigmoid(x)) : gelu_tanh(x); }

void gate(const GateArgs& g) {
  const int cols = g.cols;
  auto body = [&](int64_t e0, int64_t e1) {
    // Elements e0..e1 of the [rows, cols] output, row by row.
    while (e0 < e1) {
      const int r = static_cast<int>(e0 / cols);
      const int c0 = static_cast<int>(e0 % cols);
      const int c1 = static_cast<int>(imin(cols, static_cast<int>(c0 + (e1 - e0))));
      const float* a = g.a + r * g.lda;
      const float* b = g.b + r * g.ldb;
      float* o = g.out + static_cast<int64_t>(r) * cols;
      int c = c0;
      for (; c + W <= c1; c += W) S::store(o + c, S::mul(gate_act(g.kind, S::load(a + c)), S::load(b + c)));
      if (c < c1) {
        const int n = c1 - c;
        S::store_n(o + c, S::mul(gate_act(g.kind, S::load_n(a + c, n)), S::load_n(b + c, n)), n);
      }
      e0 += c1 - c0;
    }
  };
  const int64_t total = static_cast<int64_t>(g.rows) * cols;
  const int threads = pool_threads();
  const bool parallel = threads > 1 && total >= kParallelWork / 2;
  const int tasks = parallel ? threads * 2 : 1;
  const int64_t chunk = round_up(static_cast<int>((total + tasks - 1) / tasks), 64);
  parallel_for(static_cast<int>((total + chunk - 1) / chunk),
               [&](int t) { body(t * chunk, t * chunk + chunk < total ? t * chunk + chunk : total); });
}

// ---------------------------------------------------------------------------
// Attention.

// Masks scores s[0..n) of query (b, h, i) against keys j0..j0+n.
inline void apply_mask(const AttnArgs& a, int b, int h, int i, int j0, int n, float* s) {
  if (a.causal) {
    const int last = i + (a.Lk - a.Lq);
    for (int j = imax(0, last + 1 - j0); j < n; ++j) s[j] = kLowest;
  }
  if (a.mask_kind == MaskKind::Bool) {
    const uint8_t* m = static_cast<const uint8_t*>(a.mask) + b * a.ms[0] + h * a.ms[1] + i * a.ms[2];
    for (int j = 0; j < n; ++j)
      if (!m[(j0 + j) * a.ms[3]]) s[j] = kLowest;
  } else if (a.mask_kind == MaskKind::Additive) {
    const float* m = static_cast<const float*>(a.mask) + b * a.ms[0] + h * a.ms[1] + i * a.ms[2];
    for (int j = 0; j < n; ++j) s[j] += m[(j0 + j) * a.ms[3]];
  }
}

// Few queries (decode): dot products against each key, keys split across
// threads (each split keeps its own running max and sum; merged at the end).
void attention_dot(const AttnArgs& a) {
  const int n_rep = a.H / a.KVH, rows = n_rep * a.Lq, D = a.D, Dv = a.Dv;
  const int groups = a.B * a.KVH;
  const int threads = pool_threads();
  int nchunk = 1;
  if (threads > 1 && groups < 2 * threads &&
      static_cast<int64_t>(rows) * a.Lk * (D + Dv) * groups >= kParallelWork)
    nchunk = imax(1, imin(ceil_div(2 * threads, groups), a.Lk / 32));
  const int clen = ceil_div(a.Lk, nchunk);
  const int pstride = Dv + 2;
  float* part = scratch(kScratchShared, static_cast<size_t>(groups) * nchunk * rows * pstride);
  parallel_for(groups * nchunk, [&](int t) {
    const int gi = t / nchunk, c = t % nchunk;
    const int b = gi / a.KVH, kvh = gi % a.KVH;
    const int j0 = c * clen, nk = imin(a.Lk, j0 + clen) - j0;
    float* P = part + (static_cast<int64_t>(gi) * nchunk + c) * rows * pstride;
    if (nk <= 0) {
      for (int r = 0; r < rows; ++r) {
        P[r * pstride + Dv] = kNegInf;
        P[r * pstride + Dv + 1] = 0.0f;
      }
      return;
    }
    float* qs = scratch(kScratchAttn, static_cast<size_t>(rows) * (D + nk));
    float* sc = qs + static_cast<int64_t>(rows) * D;
    for (int r = 0; r < rows; ++r) {
      const int h = kvh * n_rep + r / a.Lq, i = r % a.Lq;
      scale_into(qs + r * D, a.q + b * a.qs[0] + h * a.qs[1] + i * a.qs[2], a.scale, D);
    }
    const float* kbase = a.k + b * a.ks[0] + kvh * a.ks[1] + static_cast<int64_t>(j0) * a.ks[2];
    int j = 0;
    if (rows < 8 && D % W == 0) {
      // Few query rows (a decode step of a model with few query heads per
      // KV head): per row, W keys' dot products in W accumulators, then one
      // reduction tree gives their W scores; each key block is read once
      // per row from L1, and no transpose is spent on rows that are not there.
      for (; j + W <= nk; j += W) {
        for (int r = 0; r < rows; ++r) {
          const float* qr = qs + r * D;
          V acc[W];
#pragma GCC unroll 16
          for (int t = 0; t < W; ++t) acc[t] = S::zero();
          for (int d0 = 0; d0 < D; d0 += W) {
            const V qv = S::load(qr + d0);
#pragma GCC unroll 16
            for (int t = 0; t < W; ++t) acc[t] = S::fma(qv, S::load(kbase + (j + t) * a.ks[2] + d0), acc[t]);
          }
          S::store(sc + r * nk + j, row_sums(acc));
        }
      }
    }
    // Scores, W keys at a time: a W x W block of keys (W keys by W features)
    // is transposed in registers, so each feature is one broadcast-FMA per
    // query row (no horizontal sums).
    for (; j + W <= nk; j += W) {
      for (int r0 = 0; r0 < rows; r0 += 8) {
        const int nr = imin(8, rows - r0);
        V acc[8];
#pragma GCC unroll 8
        for (int r = 0; r < 8; ++r) acc[r] = S::zero();
        for (int d0 = 0; d0 < D; d0 += W) {
          const int nd = imin(W, D - d0);
          V blk[W];
          for (int t = 0; t < W; ++t) {
            const float* kt = kbase + (j + t) * a.ks[2] + d0;
            blk[t] = nd == W ? S::load(kt) : S::load_n(kt, nd);
          }
          S::transpose(blk);
          for (int dd = 0; dd < nd; ++dd)
#pragma GCC unroll 8
            for (int r = 0; r < 8; ++r)
              if (r < nr) acc[r] = S::fma(S::set1(qs[(r0 + r) * D + d0 + dd]), blk[dd], acc[r]);
        }
        for (int r = 0; r < nr; ++r) S::store(sc + (r0 + r) * nk + j, acc[r]);
      }
    }
    for (; j < nk; ++j) {
      const float* kj = kbase + j * a.ks[2];
      for (int r = 0; r < rows; ++r) sc[r * nk + j] = dot(qs + r * D, kj, D);
    }
    for (int r = 0; r < rows; ++r) {
      const int h = kvh * n_rep + r / a.Lq, i = r % a.Lq;
      float* s = sc + r * nk;
      apply_mask(a, b, h, i, j0, nk, s);
      const float m = vmax(s, nk);
      P[r * pstride + Dv] = m;
      P[r * pstride + Dv + 1] = exp_sub_sum(s, m, nk);
    }
    // P · V with the output rows in registers: 4 rows by 4 vectors of features
    // per pass, each value row loaded once per pass.
    const float* vbase = a.v + b * a.vs[0] + kvh * a.vs[1] + static_cast<int64_t>(j0) * a.vs[2];
    for (int dv0 = 0; dv0 < Dv; dv0 += 4 * W) {
      const int nv = imin(4, ceil_div(Dv - dv0, W));
      const int tail = Dv - dv0 - (nv - 1) * W;  // features in the last vector
      for (int r0 = 0; r0 < rows; r0 += 4) {
        const int nr = imin(4, rows - r0);
        V o[4][4];
#pragma GCC unroll 4
        for (int r = 0; r < 4; ++r)
#pragma GCC unroll 4
          for (int v = 0; v < 4; ++v) o[r][v] = S::zero();
        for (int jj = 0; jj < nk; ++jj) {
          const float* vj = vbase + jj * a.vs[2] + dv0;
          V vv[4];
#pragma GCC unroll 4
          for (int v = 0; v < 4; ++v)
            vv[v] = v < nv - 1 ? S::load(vj + v * W) : (v == nv - 1 ? S::load_n(vj + v * W, tail) : S::zero());
#pragma GCC unroll 4
          for (int r = 0; r < 4; ++r) {
            if (r >= nr) break;
            const V p = S::set1(sc[(r0 + r) * nk + jj]);
#pragma GCC unroll 4
            for (int v = 0; v < 4; ++v) o[r][v] = S::fma(p, vv[v], o[r][v]);
          }
        }
        for (int r = 0; r < nr; ++r)
          for (int v = 0; v < nv; ++v) {
            float* dst = P + (r0 + r) * pstride + dv0 + v * W;
            if (v < nv - 1) S::store(dst, o[r][v]); else S::store_n(dst, o[r][v], tail);
          }
      }
    }
  });
  // Merge the splits: out = sum_c e^(m_c - M) O_c / sum_c e^(m_c - M) l_c.
  for (int gi = 0; gi < groups; ++gi) {
    const int b = gi / a.KVH, kvh = gi % a.KVH;
    for (int r = 0; r < rows; ++r) {
      const int h = kvh * n_rep + r / a.Lq, i = r % a.Lq;
      float* o = a.out + b * a.os[0] + h * a.os[1] + i * a.os[2];
      const float* P0 = part + static_cast<int64_t>(gi) * nchunk * rows * pstride + r * pstride;
      if (nchunk == 1) {
        div_into(o, P0, P0[Dv + 1], Dv);
        continue;
      }
      float mmax = kNegInf;
      for (int c = 0; c < nchunk; ++c) {
        const float mc = P0[static_cast<int64_t>(c) * rows * pstride + Dv];
        mmax = mc > mmax ? mc : mmax;
      }
      float l = 0.0f;
      for (int d = 0; d < Dv; ++d) o[d] = 0.0f;
      for (int c = 0; c < nchunk; ++c) {
        const float* Pc = P0 + static_cast<int64_t>(c) * rows * pstride;
        if (Pc[Dv] == kNegInf) continue;
        const float f = __builtin_expf(Pc[Dv] - mmax);
        l += f * Pc[Dv + 1];
        axpy(o, f, Pc, Dv);
      }
      div_into(o, o, l, Dv);
    }
  }
}

// Many queries (prefill): flash attention. Keys are transposed once per
// (batch, kv head) into scratch (W x W blocks in registers); then per (batch,
// head, block of queries): tiles of RB queries by 2W keys with an online
// softmax, P·V accumulated in registers per 2W features. Key blocks entirely
// above the causal diagonal are skipped.
void attention_blocked(const AttnArgs& a) {
  constexpr int RB = S::ATT_RB, KB = 2 * W;
  const int n_rep = a.H / a.KVH, D = a.D, Dv = a.Dv, Dvp = round_up(Dv, 2 * W);
  const int offset = a.Lk - a.Lq;
  const bool skip = a.causal && offset >= 0;
  const int QB = round_up(64, RB);
  const int qblocks = ceil_div(a.Lq, QB);
  const int kpad = round_up(imax(a.Lk, 1), KB);
  const int64_t kt_size = static_cast<int64_t>(D) * kpad;
  float* kts = scratch(kScratchShared, static_cast<size_t>(a.B) * a.KVH * kt_size);
  // Transposed keys, kt[d][j], zero past Lk.
  const int jblocks = ceil_div(kpad, W);
  parallel_for(a.B * a.KVH, [&](int t) {
    const int b = t / a.KVH, kvh = t % a.KVH;
    const float* kbase = a.k + b * a.ks[0] + kvh * a.ks[1];
    float* kt = kts + t * kt_size;
    for (int jb = 0; jb < jblocks; ++jb) {
      const int j0 = jb * W, nj = imin(W, a.Lk - j0);
      for (int d0 = 0; d0 < D; d0 += W) {
        const int nd = imin(W, D - d0);
        V blk[W];
        for (int r = 0; r < W; ++r) {
          const float* kr = kbase + (j0 + r) * a.ks[2] + d0;
          blk[r] = r >= nj ? S::zero() : (nd == W ? S::load(kr) : S::load_n(kr, nd));
        }
        S::transpose(blk);
        for (int dd = 0; dd < nd; ++dd) S::store(kt + static_cast<int64_t>(d0 + dd) * kpad + j0, blk[dd]);
      }
    }
  });
  parallel_for(a.B * a.H * qblocks, [&](int t) {
    const int qb = t % qblocks, bh = t / qblocks;
    const int b = bh / a.H, h = bh % a.H, kvh = h / n_rep;
    const int i0 = qb * QB, i1 = imin(a.Lq, i0 + QB);
    const float* kt = kts + (static_cast<int64_t>(b) * a.KVH + kvh) * kt_size;
    float* qsb = scratch(kScratchAttn, static_cast<size_t>(RB) * D + RB * Dvp + RB * KB + 2 * RB);
    float* O = qsb + RB * D;
    float* Sb = O + RB * Dvp;
    float* mrow = Sb + RB * KB;
    float* lrow = mrow + RB;
    const float* vbase = a.v + b * a.vs[0] + kvh * a.vs[1];
    for (int ib = i0; ib < i1; ib += RB) {
      const int nr = imin(RB, i1 - ib);
      for (int r = 0; r < RB; ++r) {
        if (r < nr) {
          scale_into(qsb + r * D, a.q + b * a.qs[0] + h * a.qs[1] + (ib + r) * a.qs[2], a.scale, D);
        } else {
          for (int d = 0; d < D; ++d) qsb[r * D + d] = 0.0f;
        }
        mrow[r] = kNegInf;
        lrow[r] = 0.0f;
      }
      for (int e = 0; e < RB * Dvp; ++e) O[e] = 0.0f;
      const int jend = skip ? imin(a.Lk, ib + nr + offset) : a.Lk;
      for (int jb = 0; jb < jend; jb += KB) {
        V s[RB][2];
#pragma GCC unroll 8
        for (int r = 0; r < RB; ++r) s[r][0] = s[r][1] = S::zero();
        for (int d = 0; d < D; ++d) {
          const V k0 = S::load(kt + static_cast<int64_t>(d) * kpad + jb);
          const V k1 = S::load(kt + static_cast<int64_t>(d) * kpad + jb + W);
#pragma GCC unroll 8
          for (int r = 0; r < RB; ++r) {
            const V qv = S::set1(qsb[r * D + d]);
            s[r][0] = S::fma(qv, k0, s[r][0]);
            s[r][1] = S::fma(qv, k1, s[r][1]);
          }
        }
        for (int r = 0; r < RB; ++r) {
          S::store(Sb + r * KB, s[r][0]);
          S::store(Sb + r * KB + W, s[r][1]);
        }
        const int nk = imin(KB, a.Lk - jb);
        const bool need_mask = a.mask_kind != MaskKind::None || (a.causal && jb + KB - 1 > ib + offset);
        for (int r = 0; r < nr; ++r) {
          float* sr = Sb + r * KB;
          if (need_mask) apply_mask(a, b, h, ib + r, jb, nk, sr);
          for (int j = nk; j < KB; ++j) sr[j] = kNegInf;
          const float mx = vmax(sr, KB);
          const float mnew = mx > mrow[r] ? mx : mrow[r];
          const float corr = mrow[r] == kNegInf ? 0.0f : __builtin_expf(mrow[r] - mnew);
          const float sum = exp_sub_sum(sr, mnew, KB);
          lrow[r] = lrow[r] * corr + sum;
          mrow[r] = mnew;
          if (corr != 1.0f) scale_into(O + r * Dvp, O + r * Dvp, corr, Dvp);
        }
        for (int dv = 0; dv < Dv; dv += 2 * W) {
          const int w0 = imin(W, Dv - dv), w1 = imin(W, Dv - dv - W);
          V o[RB][2];
#pragma GCC unroll 8
          for (int r = 0; r < RB; ++r) {
            o[r][0] = S::load(O + r * Dvp + dv);
            o[r][1] = S::load(O + r * Dvp + dv + W);
          }
          for (int j = 0; j < nk; ++j) {
            const float* vj = vbase + (jb + j) * a.vs[2] + dv;
            const V v0 = w0 == W ? S::load(vj) : S::load_n(vj, w0);
            const V v1 = w1 >= W ? S::load(vj + W) : (w1 > 0 ? S::load_n(vj + W, w1) : S::zero());
#pragma GCC unroll 8
            for (int r = 0; r < RB; ++r) {
              const V pv = S::set1(Sb[r * KB + j]);
              o[r][0] = S::fma(pv, v0, o[r][0]);
              o[r][1] = S::fma(pv, v1, o[r][1]);
            }
          }
#pragma GCC unroll 8
          for (int r = 0; r < RB; ++r) {
            S::store(O + r * Dvp + dv, o[r][0]);
            S::store(O + r * Dvp + dv + W, o[r][1]);
          }
        }
      }
      for (int r = 0; r < nr; ++r) {
        float* o = a.out + b * a.os[0] + h * a.os[1] + (ib + r) * a.os[2];
        div_into(o, O + r * Dvp, lrow[r], Dv);
      }
    }
  });
}

void attention(const AttnArgs& a) {
  if (a.B == 0 || a.H == 0 || a.Lq == 0) return;
  if (a.Lk == 0) {
    // Softmax over no keys: MLX gives NaN (0/0); so do we.
    const int64_t n = static_cast<int64_t>(a.B) * a.H * a.Lq * a.Dv;
    for (int64_t e = 0; e < n; ++e) a.out[e] = __builtin_nanf("");
    return;
  }
  if (a.Lq <= 2) attention_dot(a); else attention_blocked(a);
}
