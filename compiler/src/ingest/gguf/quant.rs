//! ggml tensor types: their block layouts, dequantization to f32 (bit-exact
//! with the pip `gguf` package's numpy code: same operations in the same
//! order, all in f32), and the lossless transcode of the affine types to MLX's
//! affine quantization with group size 32.
//!
//! A ggml affine block of 32 values stores codes `q` and per-block constants
//! such that `w = scale · q + bias`:
//!
//! | type | bits | `w` | MLX scale | MLX bias |
//! |---|---|---|---|---|
//! | Q4_0 | 4 | `d·(q−8)` | `d` | `−8d` |
//! | Q4_1 | 4 | `d·q + m` | `d` | `m` |
//! | Q5_0 | 5 | `d·(q−16)` | `d` | `−16d` |
//! | Q5_1 | 5 | `d·q + m` | `d` | `m` |
//! | Q8_0 | 8 | `d·q`, `q` signed | `d` (codes `q+128`) | `−128d` |
//! | Q4_K | 4 | `(d·sc)·q − dmin·m` per 32 | `d·sc` | `−(dmin·m)` |
//! | Q5_K | 5 | `(d·sc)·q − dmin·m` per 32 | `d·sc` | `−(dmin·m)` |
//!
//! Scales and biases are kept in f32: `d` is an f16, `sc`/`m` are 6-bit, so
//! every product above is exact in f32 and MLX's `scale·q + bias` rounds (at
//! most once) exactly as the reference does. Q2_K, Q3_K and Q6_K use groups of
//! 16 and are only dequantized.

use std::fmt;

use super::super::tensor::FloatDtype;

/// The storage type of a ggml tensor.
#[allow(non_camel_case_types, missing_docs)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    IQ2_XXS,
    IQ2_XS,
    IQ3_XXS,
    IQ1_S,
    IQ4_NL,
    IQ3_S,
    IQ2_S,
    IQ4_XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1_M,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4,
}

const QK_K: u64 = 256;

impl GgmlType {
    /// The type with ggml's numeric id, if known.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        use GgmlType::*;
        Some(match id {
            0 => F32,
            1 => F16,
            2 => Q4_0,
            3 => Q4_1,
            6 => Q5_0,
            7 => Q5_1,
            8 => Q8_0,
            9 => Q8_1,
            10 => Q2_K,
            11 => Q3_K,
            12 => Q4_K,
            13 => Q5_K,
            14 => Q6_K,
            15 => Q8_K,
            16 => IQ2_XXS,
            17 => IQ2_XS,
            18 => IQ3_XXS,
            19 => IQ1_S,
            20 => IQ4_NL,
            21 => IQ3_S,
            22 => IQ2_S,
            23 => IQ4_XS,
            24 => I8,
            25 => I16,
            26 => I32,
            27 => I64,
            28 => F64,
            29 => IQ1_M,
            30 => BF16,
            34 => TQ1_0,
            35 => TQ2_0,
            39 => MXFP4,
            _ => return None,
        })
    }

    /// `(elements per block, bytes per block)`.
    pub fn block(self) -> (u64, u64) {
        use GgmlType::*;
        match self {
            F32 | I32 => (1, 4),
            F16 | BF16 | I16 => (1, 2),
            I8 => (1, 1),
            I64 | F64 => (1, 8),
            Q4_0 => (32, 18),
            Q4_1 => (32, 20),
            Q5_0 => (32, 22),
            Q5_1 => (32, 24),
            Q8_0 => (32, 34),
            Q8_1 => (32, 40),
            Q2_K => (QK_K, 2 + 2 + QK_K / 16 + QK_K / 4),
            Q3_K => (QK_K, 2 + QK_K / 4 + QK_K / 8 + 12),
            Q4_K => (QK_K, 2 + 2 + QK_K / 2 + 12),
            Q5_K => (QK_K, 2 + 2 + QK_K / 2 + QK_K / 8 + 12),
            Q6_K => (QK_K, 2 + QK_K / 2 + QK_K / 4 + QK_K / 16),
            Q8_K => (QK_K, 4 + QK_K + QK_K / 8),
            IQ2_XXS => (QK_K, 2 + QK_K / 4),
            IQ2_XS => (QK_K, 2 + QK_K / 4 + QK_K / 32),
            IQ3_XXS => (QK_K, 2 + QK_K / 4 + QK_K / 8),
            IQ1_S => (QK_K, 2 + QK_K / 8 + QK_K / 16),
            IQ4_NL => (32, 18),
            IQ3_S => (QK_K, 2 + QK_K / 4 + QK_K / 8 + QK_K / 32 + 4),
            IQ2_S => (QK_K, 2 + QK_K / 4 + QK_K / 16),
            IQ4_XS => (QK_K, 2 + 2 + QK_K / 2 + QK_K / 64),
            IQ1_M => (QK_K, QK_K / 8 + QK_K / 16 + QK_K / 32),
            TQ1_0 => (QK_K, 2 + 4 * 13),
            TQ2_0 => (QK_K, 2 + 64),
            MXFP4 => (32, 17),
        }
    }

    /// Whether ingest can dequantize this type to f32.
    pub fn can_dequantize(self) -> bool {
        use GgmlType::*;
        matches!(self, F32 | F16 | BF16 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q2_K | Q3_K | Q4_K | Q5_K | Q6_K)
    }

    /// The bit width of the lossless MLX affine transcode (group size 32), for
    /// the types that have one.
    pub fn affine_bits(self) -> Option<u32> {
        use GgmlType::*;
        match self {
            Q4_0 | Q4_1 | Q4_K => Some(4),
            Q5_0 | Q5_1 | Q5_K => Some(5),
            Q8_0 => Some(8),
            _ => None,
        }
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// The group size of every lossless transcode.
pub const AFFINE_GROUP: usize = 32;

fn f16_at(b: &[u8], i: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[i], b[i + 1]])).to_f32()
}

/// Codes and constants of one group of 32 values: `w = scale·code + bias`.
struct Group {
    codes: [u8; 32],
    scale: f32,
    bias: f32,
}

/// The 6-bit scales and mins of a Q4_K/Q5_K super-block (`get_scale_min`).
fn k_scale_min(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut mn = [0u8; 8];
    for j in 0..4 {
        sc[j] = s[j] & 0x3F;
        mn[j] = s[4 + j] & 0x3F;
        sc[4 + j] = (s[8 + j] & 0x0F) | ((s[j] >> 2) & 0x30);
        mn[4 + j] = (s[8 + j] >> 4) | ((s[4 + j] >> 2) & 0x30);
    }
    (sc, mn)
}

/// Visits the affine groups of one block of a lossless type, in element order.
fn affine_groups(ty: GgmlType, b: &[u8], mut visit: impl FnMut(Group)) {
    let nibbles = |qs: &[u8], codes: &mut [u8; 32]| {
        for j in 0..16 {
            codes[j] = qs[j] & 0x0F;
            codes[j + 16] = qs[j] >> 4;
        }
    };
    let high_bits = |qh: u32, codes: &mut [u8; 32]| {
        for (j, c) in codes.iter_mut().enumerate() {
            *c |= (((qh >> j) & 1) as u8) << 4;
        }
    };
    match ty {
        GgmlType::Q4_0 => {
            let d = f16_at(b, 0);
            let mut g = Group { codes: [0; 32], scale: d, bias: -8.0 * d };
            nibbles(&b[2..18], &mut g.codes);
            visit(g);
        }
        GgmlType::Q4_1 => {
            let mut g = Group { codes: [0; 32], scale: f16_at(b, 0), bias: f16_at(b, 2) };
            nibbles(&b[4..20], &mut g.codes);
            visit(g);
        }
        GgmlType::Q5_0 => {
            let d = f16_at(b, 0);
            let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
            let mut g = Group { codes: [0; 32], scale: d, bias: -16.0 * d };
            nibbles(&b[6..22], &mut g.codes);
            high_bits(qh, &mut g.codes);
            visit(g);
        }
        GgmlType::Q5_1 => {
            let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
            let mut g = Group { codes: [0; 32], scale: f16_at(b, 0), bias: f16_at(b, 2) };
            nibbles(&b[8..24], &mut g.codes);
            high_bits(qh, &mut g.codes);
            visit(g);
        }
        GgmlType::Q8_0 => {
            let d = f16_at(b, 0);
            let mut g = Group { codes: [0; 32], scale: d, bias: -128.0 * d };
            for (c, &q) in g.codes.iter_mut().zip(&b[2..34]) {
                // Signed q to unsigned q + 128.
                *c = q ^ 0x80;
            }
            visit(g);
        }
        GgmlType::Q4_K | GgmlType::Q5_K => {
            let d = f16_at(b, 0);
            let dmin = f16_at(b, 2);
            let (sc, mn) = k_scale_min(&b[4..16]);
            let (qh, qs) = if ty == GgmlType::Q5_K { (Some(&b[16..48]), &b[48..176]) } else { (None, &b[16..144]) };
            for j in 0..8 {
                let chunk = &qs[(j / 2) * 32..(j / 2) * 32 + 32];
                let shift = 4 * (j % 2);
                let mut g = Group { codes: [0; 32], scale: d * f32::from(sc[j]), bias: -(dmin * f32::from(mn[j])) };
                for l in 0..32 {
                    let mut q = (chunk[l] >> shift) & 0x0F;
                    if let Some(qh) = qh {
                        q |= ((qh[l] >> j) & 1) << 4;
                    }
                    g.codes[l] = q;
                }
                visit(g);
            }
        }
        _ => {}
    }
}

/// Dequantizes one block into `out` (its element count), with the numpy
/// reference's operations and order.
fn dequantize_block(ty: GgmlType, b: &[u8], out: &mut [f32]) {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => {
            // Reference: `d * (q - offset)`, the product exact in f32.
            let (d, offset) = match ty {
                GgmlType::Q4_0 => (f16_at(b, 0), 8i32),
                GgmlType::Q5_0 => (f16_at(b, 0), 16),
                _ => (f16_at(b, 0), 128),
            };
            let mut i = 0;
            affine_groups(ty, b, |g| {
                for (o, &c) in out[i..i + 32].iter_mut().zip(&g.codes) {
                    *o = d * (i32::from(c) - offset) as f32;
                }
                i += 32;
            });
        }
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => {
            // Reference: `d * q + m` (Q4_1, Q5_1) and `d * q - dm` (K types):
            // `x - y` equals `x + (-y)` exactly.
            let mut i = 0;
            affine_groups(ty, b, |g| {
                for (o, &c) in out[i..i + 32].iter_mut().zip(&g.codes) {
                    *o = g.scale * f32::from(c) + g.bias;
                }
                i += 32;
            });
        }
        GgmlType::Q2_K => {
            let (scales, qs) = (&b[0..16], &b[16..80]);
            let d = f16_at(b, 80);
            let dmin = f16_at(b, 82);
            for (e, o) in out.iter_mut().enumerate().take(256) {
                let (h, s, l) = (e / 128, (e % 128) / 32, e % 32);
                let q = (qs[h * 32 + l] >> (2 * s)) & 3;
                let sc = scales[e / 16];
                let dl = d * f32::from(sc & 0x0F);
                let ml = dmin * f32::from(sc >> 4);
                *o = dl * f32::from(q) - ml;
            }
        }
        GgmlType::Q3_K => {
            let (hmask, qs, s) = (&b[0..32], &b[32..96], &b[96..108]);
            let d = f16_at(b, 108);
            let mut dl = [0f32; 16];
            for (i, v) in dl.iter_mut().enumerate() {
                let lo = (s[i % 8] >> (4 * (i / 8))) & 0x0F;
                let hi = (s[8 + i % 4] >> (2 * (i / 4))) & 0x03;
                let sc = ((lo | (hi << 4)) as i8).wrapping_sub(32);
                *v = d * f32::from(sc);
            }
            for (e, o) in out.iter_mut().enumerate().take(256) {
                let (h, sh, l) = (e / 128, (e % 128) / 32, e % 32);
                let ql = ((qs[h * 32 + l] >> (2 * sh)) & 3) as i8;
                let qh = ((hmask[l] >> (e / 32)) & 1) ^ 1;
                let q = ql - ((qh << 2) as i8);
                *o = dl[e / 16] * f32::from(q);
            }
        }
        GgmlType::Q6_K => {
            let (ql, qh, scales) = (&b[0..128], &b[128..192], &b[192..208]);
            let d = f16_at(b, 208);
            for (e, o) in out.iter_mut().enumerate().take(256) {
                let h = e / 128;
                let lo = (ql[h * 64 + e % 64] >> (4 * ((e % 128) / 64))) & 0x0F;
                let hi = (qh[h * 32 + e % 32] >> (2 * ((e % 128) / 32))) & 0x03;
                let q = ((lo | (hi << 4)) as i8) - 32;
                let di = d * f32::from(scales[e / 16] as i8);
                *o = di * f32::from(q);
            }
        }
        _ => {}
    }
}

/// Dequantizes `data` (whole blocks of `ty`) to f32. Float types convert
/// exactly. `None` when the type cannot be dequantized or the data is not a
/// whole number of blocks.
pub fn dequantize(ty: GgmlType, data: &[u8]) -> Option<Vec<f32>> {
    match ty {
        GgmlType::F32 => data
            .len()
            .is_multiple_of(4)
            .then(|| data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()),
        GgmlType::F16 => data
            .len()
            .is_multiple_of(2)
            .then(|| data.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect()),
        GgmlType::BF16 => data
            .len()
            .is_multiple_of(2)
            .then(|| data.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect()),
        _ if ty.can_dequantize() => {
            let (n, bytes) = ty.block();
            let (n, bytes) = (n as usize, bytes as usize);
            if !data.len().is_multiple_of(bytes) {
                return None;
            }
            let mut out = vec![0f32; data.len() / bytes * n];
            for (b, o) in data.chunks_exact(bytes).zip(out.chunks_exact_mut(n)) {
                dequantize_block(ty, b, o);
            }
            Some(out)
        }
        _ => None,
    }
}

/// Dequantizes `data` like [`dequantize`], straight into little-endian f32
/// bytes: the output is the only allocation, whatever the tensor's size.
pub fn dequantize_to_bytes(ty: GgmlType, data: &[u8]) -> Option<Vec<u8>> {
    let (n, bytes) = ty.block();
    let (n, bytes) = (n as usize, bytes as usize);
    if !ty.can_dequantize() || !data.len().is_multiple_of(bytes) {
        return None;
    }
    let mut out = Vec::with_capacity(data.len() / bytes * n * 4);
    let mut buf = [0f32; 256];
    for b in data.chunks_exact(bytes) {
        let block = &mut buf[..n];
        match ty {
            GgmlType::F32 => block[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            GgmlType::F16 => block[0] = half::f16::from_le_bytes([b[0], b[1]]).to_f32(),
            GgmlType::BF16 => block[0] = half::bf16::from_le_bytes([b[0], b[1]]).to_f32(),
            _ => dequantize_block(ty, b, block),
        }
        for v in block.iter() {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    Some(out)
}

/// A tensor in MLX's affine layout: per row, `bits`-bit codes packed
/// little-endian into u32 words (first element in the lowest bits, a group of
/// 32 codes filling exactly `bits` words), and one scale and bias per group,
/// f32 as transcoded ([`AffineParts::narrow_to_f16`] may halve them).
#[derive(Clone, Debug, PartialEq)]
pub struct AffineParts {
    /// Bits per code.
    pub bits: u32,
    /// The packed codes, `n_elements · bits / 32` u32 words, as little-endian bytes.
    pub weight: Vec<u8>,
    /// One scale per group of 32, little-endian, in `scale_dtype`.
    pub scales: Vec<u8>,
    /// One bias per group of 32, little-endian, in `scale_dtype`.
    pub biases: Vec<u8>,
    /// The dtype of `scales` and `biases`: F32 or F16.
    pub scale_dtype: FloatDtype,
}

impl AffineParts {
    /// The packed words.
    pub fn words(&self) -> Vec<u32> {
        self.weight.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
    }

    /// Stores the scales and biases as f16 when every one of them is exactly
    /// an f16 value (the GGUF legacy types: Q4_0, Q4_1, Q5_x and Q8_0 store an
    /// f16 scale, and their biases are it times a power of two or another
    /// f16), so nothing is rounded; returns whether it did. A K-quant's
    /// products of two scales rarely fit in f16's 11 bits and stay f32.
    /// Halving these bytes matters: a 4-bit group of 32 with f32 scale and bias
    /// carries 8 bytes beside 16 of codes, so this is 1/6 of the matrix.
    pub fn narrow_to_f16(&mut self) -> bool {
        if self.scale_dtype != FloatDtype::F32 {
            return false;
        }
        // The f16 bytes of an array, or None where a value is not an f16.
        let narrow = |bytes: &[u8]| -> Option<Vec<u8>> {
            let mut out = Vec::with_capacity(bytes.len() / 2);
            for c in bytes.chunks_exact(4) {
                let v = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                let h = half::f16::from_f32(v);
                if h.to_f32().to_bits() != v.to_bits() {
                    return None;
                }
                out.extend(h.to_le_bytes());
            }
            Some(out)
        };
        let (Some(scales), Some(biases)) = (narrow(&self.scales), narrow(&self.biases)) else {
            return false;
        };
        self.scales = scales;
        self.biases = biases;
        self.scale_dtype = FloatDtype::F16;
        true
    }
}

/// Transcodes `data` (whole blocks of `ty`) to MLX affine group-32 without
/// loss. `None` for types with no lossless transcode or partial blocks.
pub fn transcode_affine(ty: GgmlType, data: &[u8]) -> Option<AffineParts> {
    let bits = ty.affine_bits()?;
    let (n, bytes) = ty.block();
    let (n, bytes) = (n as usize, bytes as usize);
    if !data.len().is_multiple_of(bytes) {
        return None;
    }
    let groups = data.len() / bytes * n / AFFINE_GROUP;
    let mut out = AffineParts {
        bits,
        weight: Vec::with_capacity(groups * bits as usize * 4),
        scales: Vec::with_capacity(groups * 4),
        biases: Vec::with_capacity(groups * 4),
        scale_dtype: FloatDtype::F32,
    };
    for b in data.chunks_exact(bytes) {
        affine_groups(ty, b, |g| {
            pack_group(&g.codes, bits, &mut out.weight);
            out.scales.extend_from_slice(&g.scale.to_le_bytes());
            out.biases.extend_from_slice(&g.bias.to_le_bytes());
        });
    }
    Some(out)
}

/// Packs 32 codes of `bits` bits into `bits` u32 words, little-endian, as bytes.
fn pack_group(codes: &[u8; 32], bits: u32, out: &mut Vec<u8>) {
    let mut acc: u64 = 0;
    let mut filled = 0u32;
    for &c in codes {
        acc |= u64::from(c) << filled;
        filled += bits;
        if filled >= 32 {
            out.extend_from_slice(&(acc as u32).to_le_bytes());
            acc >>= 32;
            filled -= 32;
        }
    }
}

/// Unpacks MLX affine codes (the inverse of the packing above), for tests and
/// for dequantizing MLX-quantized sources without MLX.
pub fn unpack_codes(words: &[u32], bits: u32, n: usize) -> Vec<u8> {
    let mask = (1u64 << bits) - 1;
    let mut out = Vec::with_capacity(n);
    let mut acc: u64 = 0;
    let mut avail = 0u32;
    let mut it = words.iter();
    while out.len() < n {
        if avail < bits {
            match it.next() {
                Some(&w) => {
                    acc |= u64::from(w) << avail;
                    avail += 32;
                }
                None => break,
            }
        }
        out.push((acc & mask) as u8);
        acc >>= bits;
        avail -= bits;
    }
    out
}

/// Reorders the rows of raw ggml data: output row `r` is input row `perm[r]`.
/// Rows are whole blocks, so this works on quantized data as is.
pub fn permute_rows(data: &[u8], row_bytes: usize, perm: &[usize]) -> Option<Vec<u8>> {
    if row_bytes == 0 || data.len() != row_bytes * perm.len() {
        return None;
    }
    let mut out = Vec::with_capacity(data.len());
    for &src in perm {
        out.extend_from_slice(data.get(src * row_bytes..(src + 1) * row_bytes)?);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_unpack_round_trip_every_width() {
        for bits in [2u32, 3, 4, 5, 6, 8] {
            let mut codes = [0u8; 32];
            for (i, c) in codes.iter_mut().enumerate() {
                *c = ((i * 7 + 3) % (1 << bits)) as u8;
            }
            let mut bytes = Vec::new();
            pack_group(&codes, bits, &mut bytes);
            let words: Vec<u32> = bytes.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
            assert_eq!(words.len(), bits as usize);
            assert_eq!(unpack_codes(&words, bits, 32), codes.to_vec());
        }
    }

    #[test]
    fn q4_0_nibble_order_low_then_high() {
        // d = 1.0 (f16 0x3C00); byte j holds element j (low) and j + 16 (high).
        let mut b = vec![0x00, 0x3C];
        b.extend((0..16u8).map(|j| (j & 0x0F) | ((15 - j) << 4)));
        let w = dequantize(GgmlType::Q4_0, &b).unwrap();
        assert_eq!(w[0], -8.0);
        assert_eq!(w[5], -3.0);
        assert_eq!(w[16], 7.0);
        assert_eq!(w[31], -8.0);
        let t = transcode_affine(GgmlType::Q4_0, &b).unwrap();
        assert_eq!(t.scales, 1.0f32.to_le_bytes());
        assert_eq!(t.biases, (-8.0f32).to_le_bytes());
        let w = t.words();
        assert_eq!(w[0] & 0xF, 0);
        assert_eq!((w[0] >> 4) & 0xF, 1);
        assert_eq!(w[2] & 0xF, 15);
        assert_eq!(dequantize_to_bytes(GgmlType::Q4_0, &b).unwrap(), w_bytes(&dequantize(GgmlType::Q4_0, &b).unwrap()));
    }

    fn w_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    /// One Q4_0 block: scale `d` (f16 bits), codes all 3.
    fn q4_0_block(d: u16) -> Vec<u8> {
        let mut b = d.to_le_bytes().to_vec();
        b.extend([0x33u8; 16]);
        b
    }

    #[test]
    fn legacy_scales_narrow_to_f16_exactly() {
        // d = 1.5 and d = the smallest subnormal: both biases (-8d) are f16 values.
        for d in [0x3E00u16, 0x0001] {
            let b = q4_0_block(d);
            let mut t = transcode_affine(GgmlType::Q4_0, &b).unwrap();
            let wide = t.clone();
            assert!(t.narrow_to_f16());
            assert_eq!(t.scale_dtype, FloatDtype::F16);
            assert_eq!(t.scales, d.to_le_bytes());
            let bias = half::f16::from_le_bytes([t.biases[0], t.biases[1]]).to_f32();
            assert_eq!(bias.to_le_bytes().to_vec(), wide.biases);
            assert_eq!(t.weight, wide.weight);
            // Narrowing twice does nothing.
            assert!(!t.narrow_to_f16());
        }
        // Q8_0 with d = 8192: the bias -128d = -2^20 is past f16's range, so both stay f32.
        let mut b = 0x7000u16.to_le_bytes().to_vec(); // 8192
        b.extend([0u8; 32]);
        let mut t = transcode_affine(GgmlType::Q8_0, &b).unwrap();
        assert!(!t.narrow_to_f16());
        assert_eq!(t.scale_dtype, FloatDtype::F32);
        assert_eq!(t.scales.len(), 4);
    }

    #[test]
    fn k_quant_scales_that_need_f32_stay_f32() {
        // A Q4_K super-block: d = 1 + 2^-10 (f16 0x3C01), dmin = 0, every 6-bit
        // scale 63: the products d · 63 need 16 significant bits.
        let mut b = vec![0x01, 0x3C, 0x00, 0x00];
        b.extend([63u8, 63, 63, 63, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF]);
        b.extend([0u8; 128]);
        let mut t = transcode_affine(GgmlType::Q4_K, &b).unwrap();
        let before = t.clone();
        assert!(!t.narrow_to_f16());
        assert_eq!(t, before);
    }

    #[test]
    fn partial_blocks_are_refused() {
        assert!(dequantize(GgmlType::Q8_0, &[0u8; 33]).is_none());
        assert!(transcode_affine(GgmlType::Q4_1, &[0u8; 21]).is_none());
        assert!(transcode_affine(GgmlType::Q6_K, &[0u8; 210]).is_none());
    }
}
