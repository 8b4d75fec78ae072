// The avx512vnni build's rows16 products of several rows of x on AMX tiles,
// included by rows16_impl.h after rows16_i16_impl.h (same namespace; uses
// its Rows16X, rows16_scales and kRows16). Only CPUs with AMX-INT8 and
// AVX-512 VBMI whose kernel grants the tile state take it (amx_active());
// every function here is compiled for those extensions alone.
#pragma once
// ---------------------------------------------------------------------------
// rows16 products on AMX tiles.
//
// The int16 kernel is compute-bound once x has several rows (a batched
// decode step, a prefill): one vpdpwssd per pair of k, row block and row of
// x. A tile instruction multiplies a 16 x K block of x by a K x 16 block of
// W (K up to 64 bytes) in one go. Tiles take bytes, so each int16 step
// X = 256·hi + lo (hi = X >> 8 signed, lo = X & 255 unsigned) goes in as two
// byte tiles, hi and lo, against the same tile of codes (tdpbsud, tdpbuud);
// 256·Σ hi·q + Σ lo·q is Σ X·q exactly, the int32 sum the int16 kernel
// forms (at most 2^31 in magnitude, as it argues), and the group's epilogue
// is the int16 kernel's, operation for operation. So the outputs are the
// int16 kernel's bits, and the choice between the two for any number of
// rows keeps batch invariance.

// Rows of x from which a product takes the tiles: below it the int16
// kernel's register tiles cost less than a 16-row tile of mostly padding.
constexpr int kAmxMinRows = 16;
// Rows of x (and output columns) per tile.
constexpr int kAmxRows = 16;

#define MLXCEL_AMX_TARGET __attribute__((target("avx512vbmi,amx-tile,amx-int8")))

// Whether the tiles take products of `a`: the int16 kernel's groups, split
// into at most two 64-byte tile columns of k.
inline bool rows16_amx_applies(const QmmArgs& a) {
  return rows16_i16_applies(a) && (a.group_size == 32 || a.group_size == 64 || a.group_size == 128);
}

// x's int16 steps as AMX reads them: rows padded with zeros to a multiple of
// kAmxRows, row m at + m * K, codes and residual codes split into hi and lo;
// and, per tile of kAmxRows rows and group g, whether any of its rows has a
// residual pass there (`residual[tile * G + g]`). Every row block of W asks
// that of every tile and group: answered once here, it costs a byte load
// there instead of 16 scalar loads and compares (prefill 5-10% faster,
// docs/kernels.md "AMX tiles").
struct Rows16AmxX {
  const int8_t* hi;
  const uint8_t* lo;
  const int8_t* hi2;
  const uint8_t* lo2;
  const uint8_t* residual;
};

// Bytes of `buf` that rows16_amx_split needs for M rows of K (groups of gs).
inline size_t rows16_amx_bytes(int M, int K, int gs) {
  const size_t tiles = static_cast<size_t>(ceil_div(M, kAmxRows));
  return 4 * tiles * kAmxRows * static_cast<size_t>(K) + tiles * static_cast<size_t>(K / gs);
}

// Splits the M rows of x.q and x.q2 (K int16 each, groups of gs) into `buf`
// (rows16_amx_bytes; the padding rows zero).
inline Rows16AmxX rows16_amx_split(const Rows16X& x, int M, int K, int gs, uint8_t* buf) {
  const int64_t mp = static_cast<int64_t>(ceil_div(M, kAmxRows)) * kAmxRows, n = mp * K, used = static_cast<int64_t>(M) * K;
  int8_t* hi = reinterpret_cast<int8_t*>(buf);
  uint8_t* lo = buf + n;
  int8_t* hi2 = reinterpret_cast<int8_t*>(buf + 2 * n);
  uint8_t* lo2 = buf + 3 * n;
  uint8_t* residual = buf + 4 * n;
  const int G = K / gs;
  for (int mt = 0; mt < M; mt += kAmxRows) {
    uint8_t* flags = residual + static_cast<int64_t>(mt / kAmxRows) * G;
    for (int g = 0; g < G; ++g) flags[g] = 0;
    for (int m = mt; m < imin(M, mt + kAmxRows); ++m)
      for (int g = 0; g < G; ++g) flags[g] |= x.dx2[static_cast<int64_t>(m) * G + g] != 0.0f;
  }
  auto split = [&](const int16_t* q, int8_t* h, uint8_t* l) {
    int64_t i = 0;
    for (; i + 32 <= used; i += 32) {
      const __m512i v = _mm512_loadu_si512(q + i);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(h + i), _mm512_cvtepi16_epi8(_mm512_srai_epi16(v, 8)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(l + i),
                          _mm512_cvtepi16_epi8(_mm512_and_si512(v, _mm512_set1_epi16(0xFF))));
    }
    for (; i < used; ++i) {
      h[i] = static_cast<int8_t>(q[i] >> 8);
      l[i] = static_cast<uint8_t>(q[i] & 0xFF);
    }
    std::memset(h + used, 0, static_cast<size_t>(n - used));
    std::memset(l + used, 0, static_cast<size_t>(n - used));
  };
  split(x.q, hi, lo);
  split(x.q2, hi2, lo2);
  return Rows16AmxX{hi, lo, hi2, lo2, residual};
}

// The tiles: the int32 sums of x's hi and lo halves, x's hi and lo tiles,
// and the codes for up to two 64-byte columns of k (a group of 128 is two).
// Macros: GCC's tile intrinsics paste the number into the instruction.
#define MLXCEL_TILE_SUM_HI 0
#define MLXCEL_TILE_SUM_LO 1
#define MLXCEL_TILE_X_HI 2
#define MLXCEL_TILE_X_LO 3
#define MLXCEL_TILE_W0 4
#define MLXCEL_TILE_W1 5

// GCC's _tile_loadd does not tell the compiler it reads memory: a barrier
// that names the address keeps the stores that fill it ahead of it.
#define MLXCEL_TILE_LOAD(tile, base, stride)     \
  do {                                           \
    __asm__ volatile("" ::"r"(base) : "memory"); \
    _tile_loadd(tile, base, stride);             \
  } while (0)

// LDTILECFG's 64-byte operand, palette 1 (Intel SDM, "LDTILECFG").
struct alignas(64) AmxConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Loads the tile shapes for columns of `kc` bytes of k, unless this thread
// has them already.
MLXCEL_AMX_TARGET inline void amx_configure(int kc) {
  static thread_local int loaded = 0;
  if (loaded == kc) return;
  AmxConfig c;
  c.rows[MLXCEL_TILE_SUM_HI] = c.rows[MLXCEL_TILE_SUM_LO] = kAmxRows;
  c.colsb[MLXCEL_TILE_SUM_HI] = c.colsb[MLXCEL_TILE_SUM_LO] = kRows16 * 4;
  c.rows[MLXCEL_TILE_X_HI] = c.rows[MLXCEL_TILE_X_LO] = kAmxRows;
  c.colsb[MLXCEL_TILE_X_HI] = c.colsb[MLXCEL_TILE_X_LO] = static_cast<uint16_t>(kc);
  c.rows[MLXCEL_TILE_W0] = c.rows[MLXCEL_TILE_W1] = static_cast<uint8_t>(kc / 4);
  c.colsb[MLXCEL_TILE_W0] = c.colsb[MLXCEL_TILE_W1] = kRows16 * 4;
  _tile_loadconfig(&c);
  loaded = kc;
}

// The codes of one 16-row block for k in [k0, k0 + kc) of a group (`p`: the
// group's codes in the rows16 layout) as an AMX tile of kc / 4 rows: row u
// holds, for each of the 16 rows n, the codes of k0 + 4u .. k0 + 4u + 3 as
// 4 bytes (the "VNNI" order tile products read).
template <int BITS>
MLXCEL_AMX_TARGET inline void amx_pack_codes(const uint8_t* p, int k0, int kc, uint8_t* tile) {
  if constexpr (BITS == 4) {
    // Two k-pairs, 16 bytes each (byte n: code(k) | code(k+1) << 4), to
    // lane n = byte n of the first | byte n of the second << 16 ...
    alignas(64) static constexpr uint8_t kIdx[64] = {
        0, 0, 16, 0, 1, 0, 17, 0, 2, 0, 18, 0, 3, 0, 19, 0, 4, 0, 20, 0, 5, 0, 21, 0, 6, 0, 22, 0, 7, 0, 23, 0,
        8, 0, 24, 0, 9, 0, 25, 0, 10, 0, 26, 0, 11, 0, 27, 0, 12, 0, 28, 0, 13, 0, 29, 0, 14, 0, 30, 0, 15, 0, 31, 0};
    const __m512i idx = _mm512_load_si512(kIdx);
    const __m512i low_nibbles = _mm512_set1_epi32(0x0F0F0F0F);
    for (int u = 0; u < kc / 4; ++u) {
      const uint8_t* src = p + static_cast<int64_t>(k0 / 2 + 2 * u) * kRows16;
      const __m512i v = _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src)));
      const __m512i t = _mm512_maskz_permutexvar_epi8(0x5555555555555555ull, idx, v);
      // ... then (t | t << 4) & 0x0F0F0F0F puts the four codes in bytes 0..3.
      _mm512_store_si512(tile + u * 64, _mm512_ternarylogic_epi32(t, _mm512_slli_epi32(t, 4), low_nibbles, 0xA8));
    }
  } else {
    // Two k-pairs of 32 bytes (k's 16 codes, then k+1's): a 4 x 16 byte
    // transpose, lane n = bytes n, 16 + n, 32 + n, 48 + n.
    alignas(64) static constexpr uint8_t kIdx[64] = {
        0,  16, 32, 48, 1,  17, 33, 49, 2,  18, 34, 50, 3,  19, 35, 51, 4,  20, 36, 52, 5,  21,
        37, 53, 6,  22, 38, 54, 7,  23, 39, 55, 8,  24, 40, 56, 9,  25, 41, 57, 10, 26, 42, 58,
        11, 27, 43, 59, 12, 28, 44, 60, 13, 29, 45, 61, 14, 30, 46, 62, 15, 31, 47, 63};
    const __m512i idx = _mm512_load_si512(kIdx);
    for (int u = 0; u < kc / 4; ++u) {
      const uint8_t* src = p + static_cast<int64_t>(k0 / 2 + 2 * u) * 2 * kRows16;
      _mm512_store_si512(tile + u * 64, _mm512_permutexvar_epi8(idx, _mm512_loadu_si512(src)));
    }
  }
}

// The int32 halves of Σ X·q over one group for the 16 rows of x at hi/lo
// (row stride K) against the group's code tiles at `codes` (`splits` tiles
// of kc / 4 rows), into part[0] (hi) and part[1] (lo), [16][16] each.
MLXCEL_AMX_TARGET inline void amx_group_sums(const int8_t* hi, const uint8_t* lo, const uint8_t* codes, int K,
                                             int kc, int splits, int32_t (*part)[kAmxRows][kRows16]) {
  _tile_zero(MLXCEL_TILE_SUM_HI);
  _tile_zero(MLXCEL_TILE_SUM_LO);
  MLXCEL_TILE_LOAD(MLXCEL_TILE_W0, codes, kRows16 * 4);
  MLXCEL_TILE_LOAD(MLXCEL_TILE_X_HI, hi, K);
  MLXCEL_TILE_LOAD(MLXCEL_TILE_X_LO, lo, K);
  _tile_dpbsud(MLXCEL_TILE_SUM_HI, MLXCEL_TILE_X_HI, MLXCEL_TILE_W0);
  _tile_dpbuud(MLXCEL_TILE_SUM_LO, MLXCEL_TILE_X_LO, MLXCEL_TILE_W0);
  if (splits == 2) {
    MLXCEL_TILE_LOAD(MLXCEL_TILE_W1, codes + kc * kRows16, kRows16 * 4);
    MLXCEL_TILE_LOAD(MLXCEL_TILE_X_HI, hi + kc, K);
    MLXCEL_TILE_LOAD(MLXCEL_TILE_X_LO, lo + kc, K);
    _tile_dpbsud(MLXCEL_TILE_SUM_HI, MLXCEL_TILE_X_HI, MLXCEL_TILE_W1);
    _tile_dpbuud(MLXCEL_TILE_SUM_LO, MLXCEL_TILE_X_LO, MLXCEL_TILE_W1);
  }
  _tile_stored(MLXCEL_TILE_SUM_HI, part[0], kRows16 * 4);
  _tile_stored(MLXCEL_TILE_SUM_LO, part[1], kRows16 * 4);
}

// Row r's Σ X·q from its two halves: 256·hi + lo, exact in int32.
MLXCEL_AMX_TARGET inline __m512 amx_row_sum(const int32_t (*part)[kAmxRows][kRows16], int r) {
  return _mm512_cvtepi32_ps(
      _mm512_add_epi32(_mm512_slli_epi32(_mm512_load_si512(part[0][r]), 8), _mm512_load_si512(part[1][r])));
}

// Row blocks t0 .. t1 of W against rows m0 .. m1 of x (m0 a multiple of
// kAmxRows), on tiles: per row block, its codes are repacked once for all
// tiles of x; per 16 rows of x, the tile products of group g + 1 are issued
// before the epilogue of group g (two buffers of sums), so that the tile
// unit and the vector units overlap, with the 16 rows' accumulators in
// registers.
template <int BITS, int ST>
MLXCEL_AMX_TARGET void rows16_range_amx(const QmmArgs& a, int t0, int t1, int m0, int m1, const Rows16X& x,
                                        const Rows16AmxX& t) {
  const int K = a.K, gs = a.group_size, G = K / gs;
  const int kc = gs < 64 ? gs : 64, splits = gs / kc;
  const int64_t block_bytes = static_cast<int64_t>(K) * BITS / 8 * kRows16;
  const int64_t group_bytes = static_cast<int64_t>(gs) * BITS / 8 * kRows16;
  const int64_t group_tiles = static_cast<int64_t>(gs) * kRows16;  // bytes of one group's code tiles
  const uint8_t* w = static_cast<const uint8_t*>(a.w);
  amx_configure(kc);
  uint8_t* codes = reinterpret_cast<uint8_t*>(scratch(kScratchAmxCodes, static_cast<size_t>(G * group_tiles / 4)));
  // [buffer][main or residual][hi, lo][row][column]
  alignas(64) int32_t part[2][2][2][kAmxRows][kRows16];
  for (int tb = t0; tb < t1; ++tb) {
    for (int g = 0; g < G; ++g) {
      const uint8_t* p = w + tb * block_bytes + g * group_bytes;
      for (int h = 0; h < splits; ++h) amx_pack_codes<BITS>(p, h * kc, kc, codes + g * group_tiles + h * kc * kRows16);
    }
    for (int mt = m0; mt < m1; mt += kAmxRows) {
      const int n = imin(kAmxRows, m1 - mt);
      // Whether group g has a residual pass in any of these rows; its sums.
      const uint8_t* has_residual = t.residual + static_cast<int64_t>(mt / kAmxRows) * G;
      auto residual = [&](int g) { return has_residual[g] != 0; };
      auto sums = [&](int g, bool with_residual) {
        const int64_t xo = static_cast<int64_t>(mt) * K + static_cast<int64_t>(g) * gs;
        amx_group_sums(t.hi + xo, t.lo + xo, codes + g * group_tiles, K, kc, splits, part[g & 1][0]);
        if (with_residual) amx_group_sums(t.hi2 + xo, t.lo2 + xo, codes + g * group_tiles, K, kc, splits, part[g & 1][1]);
      };
      __m512 acc[kAmxRows];
#pragma GCC unroll 16
      for (int r = 0; r < kAmxRows; ++r) acc[r] = _mm512_setzero_ps();
      bool res_next = residual(0);
      sums(0, res_next);
      for (int g = 0; g < G; ++g) {
        const bool res = res_next;
        if (g + 1 < G) {
          res_next = residual(g + 1);
          sums(g + 1, res_next);
        }
        // The int16 kernel's epilogue (rows16_block_i16), operation for operation.
        V s, b;
        const int64_t at = (static_cast<int64_t>(tb) * G + g) * kRows16;
        rows16_scales<ST>(a.scales, at, &s);
        rows16_scales<ST>(a.biases, at, &b);
        const auto& pg = part[g & 1];
#pragma GCC unroll 16
        for (int r = 0; r < kAmxRows; ++r) {
          if (r >= n) break;
          const int64_t mg = static_cast<int64_t>(mt + r) * G + g;
          acc[r] = _mm512_fmadd_ps(amx_row_sum(pg[0], r), _mm512_mul_ps(s, _mm512_set1_ps(x.dx[mg])), acc[r]);
          acc[r] = _mm512_fmadd_ps(b, _mm512_set1_ps(x.xs[mg]), acc[r]);
        }
        if (!res) continue;
#pragma GCC unroll 16
        for (int r = 0; r < kAmxRows; ++r) {
          if (r >= n) break;
          const float d2 = x.dx2[static_cast<int64_t>(mt + r) * G + g];
          if (d2 != 0.0f) acc[r] = _mm512_fmadd_ps(amx_row_sum(pg[1], r), _mm512_mul_ps(s, _mm512_set1_ps(d2)), acc[r]);
        }
      }
#pragma GCC unroll 16
      for (int r = 0; r < kAmxRows; ++r)
        if (r < n) _mm512_storeu_ps(a.out + static_cast<int64_t>(mt + r) * a.ldo + tb * kRows16, acc[r]);
    }
  }
}

template <int BITS>
void rows16_dispatch_amx(const QmmArgs& a, int t0, int t1, int m0, int m1, const Rows16X& x, const Rows16AmxX& t) {
  switch (a.scale_type) {
    case kScaleF16: rows16_range_amx<BITS, kScaleF16>(a, t0, t1, m0, m1, x, t); break;
    case kScaleBF16: rows16_range_amx<BITS, kScaleBF16>(a, t0, t1, m0, m1, x, t); break;
    default: rows16_range_amx<BITS, kScaleF32>(a, t0, t1, m0, m1, x, t); break;
  }
}
