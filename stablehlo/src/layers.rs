//! The layers of mlxcel's models written in StableHLO ops: what the MLX
//! runtime's fused kernels compute (`mlxcel_mlx::fast`), expressed so IREE
//! can fuse it its own way. Activations are f32 throughout; stored weights
//! of other types are converted where they are read.
//!
//! Quantized weights stay packed in their parameters and are dequantized
//! inside the graph (MLX's affine layout: each row one little-endian bit
//! stream of `bits`-wide codes in u32 words, one scale and bias per `group` codes of
//! a row): the bundle's bytes are the parameters as they are, and a
//! compiler that fuses dequantization into products can (IREE 3.13's CPU
//! backend does not: docs/stablehlo.md "Speed").

use crate::builder::{Comparison, Function, Reduction, Value};
use crate::error::{Result, shape};
use crate::types::{ElementType, TensorType};

const F32: ElementType = ElementType::F32;

/// A weight matrix `[out, in]` as a graph reads it.
#[derive(Clone, Debug)]
pub enum Weight {
    /// Stored as floats (any float type).
    Dense(Value),
    /// MLX affine quantization.
    Quantized(Quantized),
}

/// An affine-quantized matrix: `w[o, i] = scales[o, i/group] · code + biases[o, i/group]`.
#[derive(Clone, Debug)]
pub struct Quantized {
    /// The packed codes, 32-bit words `[out, in · bits / 32]` (read as i32).
    pub packed: Value,
    /// Per-group scales `[out, in / group]` (any float type).
    pub scales: Value,
    /// Per-group biases `[out, in / group]`.
    pub biases: Value,
    /// Bits per code, 2 to 8.
    pub bits: u32,
    /// Codes per scale.
    pub group: i64,
}

impl Quantized {
    /// The quantized matrix `[out, inputs]` stored as the bundle names it:
    /// `NAME.weight` (the packed codes), `NAME.scales`, `NAME.biases` (of
    /// `scales` type), loaded from their parameters.
    pub fn parameters(
        f: &mut Function,
        name: &str,
        [out, inputs]: [i64; 2],
        bits: u32,
        group: i64,
        scales: ElementType,
    ) -> Result<Quantized> {
        if !(2..=8).contains(&bits) || group <= 0 || inputs % group != 0 || inputs * i64::from(bits) % 32 != 0 {
            return Err(shape("dequantize", format!("{name}: {inputs} inputs of {bits} bits in groups of {group}")));
        }
        let groups = TensorType::new(&[out, inputs / group], scales);
        Ok(Quantized {
            packed: f.parameter(
                &format!("{name}.weight"),
                TensorType::new(&[out, inputs * i64::from(bits) / 32], ElementType::I32),
            )?,
            scales: f.parameter(&format!("{name}.scales"), groups.clone())?,
            biases: f.parameter(&format!("{name}.biases"), groups)?,
            bits,
            group,
        })
    }
}

/// The gate's activation in a gated MLP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    /// `x · sigmoid(x)` (SwiGLU).
    Silu,
    /// GELU, tanh approximation (GeGLU).
    GeluTanh,
}

/// How RoPE turns positions into angles.
#[derive(Clone, Debug)]
pub struct Rope {
    /// The rotated features at the start of each head.
    pub dims: i64,
    /// Pairs are adjacent features (GPT-J) rather than the two halves.
    pub traditional: bool,
    /// The angle of pair `i` at position `p` is `p · inv_freq[i]`.
    pub inv_freq: Vec<f32>,
}

impl Rope {
    /// Plain RoPE: `inv_freq[i] = scale / base^(2i/dims)` (MLX's `fast.rope`).
    pub fn with_base(dims: i64, traditional: bool, base: f32, scale: f32) -> Rope {
        let inv_freq = (0..dims / 2).map(|i| scale / base.powf(2.0 * i as f32 / dims as f32)).collect();
        Rope { dims, traditional, inv_freq }
    }

    /// RoPE with explicit per-pair wavelengths (MLX's `freqs`: angle `p / freqs[i]`).
    pub fn with_wavelengths(dims: i64, traditional: bool, wavelengths: &[f32]) -> Rope {
        Rope { dims, traditional, inv_freq: wavelengths.iter().map(|w| 1.0 / w).collect() }
    }
}

/// `x` as f32 (weights stored narrower are widened where read).
fn f32_of(f: &mut Function, x: &Value) -> Value {
    f.convert(x, F32)
}

/// `x` with `y [n]` broadcast along the last axis and combined by `op`.
fn along_last(
    f: &mut Function,
    x: &Value,
    y: &Value,
    op: fn(&mut Function, &Value, &Value) -> Result<Value>,
) -> Result<Value> {
    let last = x.shape().len().checked_sub(1).ok_or_else(|| shape("broadcast", "a scalar has no last axis"))?;
    let y = f.broadcast_in_dim(y, x.shape(), &[last])?;
    op(f, x, &y)
}

/// `x / sqrt(mean(x²) + eps) · weight` over the last axis (`weight [dim]`).
pub fn rms_norm(f: &mut Function, x: &Value, weight: &Value, eps: f32) -> Result<Value> {
    let rank = x.shape().len();
    let dim = *x.shape().last().ok_or_else(|| shape("rms_norm", "a scalar input"))?;
    if weight.shape() != [dim] {
        return Err(shape("rms_norm", format!("weight {} for input {}", weight.ty(), x.ty())));
    }
    let squares = f.multiply(x, x)?;
    let sum = f.reduce(&squares, &[rank - 1], Reduction::Sum)?;
    let n = f.splat(dim as f64, sum.ty().clone());
    let mean = f.divide(&sum, &n)?;
    let eps = f.splat(f64::from(eps), mean.ty().clone());
    let inv = f.add(&mean, &eps)?;
    let inv = f.rsqrt(&inv)?;
    let keep: Vec<usize> = (0..rank - 1).collect();
    let inv = f.broadcast_in_dim(&inv, x.shape(), &keep)?;
    let normed = f.multiply(x, &inv)?;
    let weight = f32_of(f, weight);
    along_last(f, &normed, &weight, Function::multiply)
}

/// The f32 matrix `[out, in]` a quantized weight holds.
pub fn dequantize(f: &mut Function, q: &Quantized) -> Result<Value> {
    let w = dequantize_grouped(f, q)?;
    let (out, groups, group) = (w.shape()[0], w.shape()[1], w.shape()[2]);
    f.reshape(&w, &[out, groups * group])
}

/// The f32 matrix a quantized weight holds, its rows split into groups:
/// `[out, in / group, group]`.
pub fn dequantize_grouped(f: &mut Function, q: &Quantized) -> Result<Value> {
    if !(2..=8).contains(&q.bits) || q.packed.element() != ElementType::I32 || q.packed.shape().len() != 2 {
        return Err(shape(
            "dequantize",
            format!("{}-bit codes in {} (2 to 8 bits in 32-bit words)", q.bits, q.packed.ty()),
        ));
    }
    let bits = i64::from(q.bits);
    // A row is one little-endian bit stream. Its codes repeat their
    // alignment every `period` words, which hold `codes` codes.
    let period = bits / gcd(bits, 32);
    let codes_per_period = period * 32 / bits;
    let (out, words) = (q.packed.shape()[0], q.packed.shape()[1]);
    if words % period != 0 {
        return Err(shape("dequantize", format!("{words} words a row for {}-bit codes", q.bits)));
    }
    let inputs = words / period * codes_per_period;
    if q.group <= 0
        || inputs % q.group != 0
        || q.scales.shape() != [out, inputs / q.group]
        || q.biases.shape() != q.scales.shape()
    {
        return Err(shape(
            "dequantize",
            format!(
                "scales {} and biases {} for {inputs} codes in groups of {}",
                q.scales.ty(),
                q.biases.ty(),
                q.group
            ),
        ));
    }
    let periods = words / period;
    // Code c of a period starts at bit c·bits: in word `lo` at `shift`, and
    // when it straddles a word boundary, its high bits open word `lo + 1`.
    let starts: Vec<i64> = (0..codes_per_period).map(|c| c * bits).collect();
    let lo_words: Vec<i64> = starts.iter().map(|b| b / 32).collect();
    let hi_words: Vec<i64> = starts.iter().map(|b| ((b + bits - 1) / 32).min(period - 1)).collect();
    let shifts: Vec<i64> = starts.iter().map(|b| b % 32).collect();
    // Shifting left by 32 gives zero: no high part for a code inside one word.
    let hi_shifts: Vec<i64> = starts.iter().map(|b| if b % 32 + bits > 32 { 32 - b % 32 } else { 32 }).collect();
    let spread = [out, periods, codes_per_period];
    let by_period = if period == 1 { q.packed.clone() } else { f.reshape(&q.packed, &[out, periods, period])? };
    let lo =
        if period == 1 { f.broadcast_in_dim(&q.packed, &spread, &[0, 1])? } else { f.take(&by_period, 2, &lo_words)? };
    let shifts = f.ints(&shifts, ElementType::I32)?;
    let shifts = f.broadcast_in_dim(&shifts, &spread, &[2])?;
    let mut codes = f.shift_right_logical(&lo, &shifts)?;
    if hi_shifts.iter().any(|&s| s < 32) {
        let hi = f.take(&by_period, 2, &hi_words)?;
        let hi_shifts = f.ints(&hi_shifts, ElementType::I32)?;
        let hi_shifts = f.broadcast_in_dim(&hi_shifts, &spread, &[2])?;
        let high = f.shift_left(&hi, &hi_shifts)?;
        codes = f.or(&codes, &high)?;
    }
    let mask = f.splat(f64::from((1u32 << q.bits) - 1), TensorType::new(&spread, ElementType::I32));
    let codes = f.and(&codes, &mask)?;
    let codes = f.convert(&codes, F32);
    let grouped = [out, inputs / q.group, q.group];
    let codes = f.reshape(&codes, &grouped)?;
    let scales = f32_of(f, &q.scales);
    let biases = f32_of(f, &q.biases);
    let scales = f.broadcast_in_dim(&scales, &grouped, &[0, 1])?;
    let biases = f.broadcast_in_dim(&biases, &grouped, &[0, 1])?;
    let w = f.multiply(&codes, &scales)?;
    f.add(&w, &biases)
}

fn gcd(a: i64, b: i64) -> i64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// `x Wᵀ + bias` over the last axis of `x` (`W [out, in]`, `bias [out]`).
///
/// A quantized weight is contracted in its groups (`x` viewed as
/// `[.., in / group, group]` against `[out, in / group, group]`), the
/// weight on the left: with `x` on the left IREE 3.13 also transposes the
/// dequantized matrix, ten times slower (docs/stablehlo.md "Speed").
pub fn linear(f: &mut Function, x: &Value, w: &Weight, bias: Option<&Value>) -> Result<Value> {
    let last = x.shape().len().checked_sub(1).ok_or_else(|| shape("linear", "a scalar input"))?;
    let y = match w {
        Weight::Dense(w) => {
            let w = f32_of(f, w);
            f.dot_general(x, &w, (&[], &[]), (&[last], &[1]))?
        }
        Weight::Quantized(q) => {
            let w = dequantize_grouped(f, q)?;
            let (out, groups, group) = (w.shape()[0], w.shape()[1], w.shape()[2]);
            let rows = x.shape()[..last].to_vec();
            let mut grouped = rows.clone();
            grouped.extend([groups, group]);
            let xg = f.reshape(x, &grouped)?;
            // The weight on the left: `[out, ..rows]`, moved to `[..rows, out]` after.
            let y = f.dot_general(&w, &xg, (&[], &[]), (&[1, 2], &[last, last + 1]))?;
            if rows.iter().all(|&n| n == 1) {
                let mut shape_to = rows;
                shape_to.push(out);
                f.reshape(&y, &shape_to)?
            } else {
                let mut perm: Vec<usize> = (1..=last).collect();
                perm.push(0);
                f.transpose(&y, &perm)?
            }
        }
    };
    match bias {
        Some(b) => {
            let b = f32_of(f, b);
            along_last(f, &y, &b, Function::add)
        }
        None => Ok(y),
    }
}

/// `act(gate) · up`, elementwise.
pub fn gated(f: &mut Function, gate: &Value, up: &Value, act: Gate) -> Result<Value> {
    let a = match act {
        Gate::Silu => {
            let s = f.logistic(gate)?;
            f.multiply(gate, &s)?
        }
        Gate::GeluTanh => {
            // 0.5 x (1 + tanh(sqrt(2/π) (x + 0.044715 x³))), as MLX's gelu_approx.
            let ty = gate.ty().clone();
            let cube = f.multiply(gate, gate)?;
            let cube = f.multiply(&cube, gate)?;
            let c = f.splat(0.044715, ty.clone());
            let inner = f.multiply(&cube, &c)?;
            let inner = f.add(gate, &inner)?;
            let k = f.splat((2.0 / std::f64::consts::PI).sqrt(), ty.clone());
            let inner = f.multiply(&inner, &k)?;
            let t = f.tanh(&inner)?;
            let one = f.splat(1.0, ty.clone());
            let t = f.add(&t, &one)?;
            let half = f.splat(0.5, ty);
            let h = f.multiply(gate, &half)?;
            f.multiply(&h, &t)?
        }
    };
    f.multiply(&a, up)
}

/// Rows `ids` (i32, any shape) of an embedding table `[vocab, dim]`, times
/// `scale`: `[..ids, dim]` in f32. A quantized table's rows are gathered
/// packed and dequantized after, so only the rows used are expanded.
pub fn embedding(f: &mut Function, ids: &Value, table: &Weight, scale: f32) -> Result<Value> {
    let rows = match table {
        Weight::Dense(t) => {
            let rows = f.gather_rows(t, ids)?;
            f32_of(f, &rows)
        }
        Weight::Quantized(q) => {
            let n = ids.ty().elements();
            let flat = f.reshape(ids, &[n])?;
            let picked = Quantized {
                packed: f.gather_rows(&q.packed, &flat)?,
                scales: f.gather_rows(&q.scales, &flat)?,
                biases: f.gather_rows(&q.biases, &flat)?,
                bits: q.bits,
                group: q.group,
            };
            let rows = dequantize(f, &picked)?;
            let mut shape_to = ids.shape().to_vec();
            shape_to.push(rows.shape()[1]);
            f.reshape(&rows, &shape_to)?
        }
    };
    if scale == 1.0 {
        return Ok(rows);
    }
    let s = f.splat(f64::from(scale), rows.ty().clone());
    f.multiply(&rows, &s)
}

/// RoPE of `x [batch, heads, seq, head_dim]` for positions `offset + 0..seq`
/// (`offset` an i32 scalar for every row, or one per row `[batch]`: a
/// decode batch of sequences at different positions).
pub fn rope(f: &mut Function, x: &Value, offset: &Value, rope: &Rope) -> Result<Value> {
    let [b, h, l, d] = *x.shape() else {
        return Err(shape("rope", format!("input {} (need [batch, heads, seq, head_dim])", x.ty())));
    };
    let half = rope.dims / 2;
    if rope.dims > d || rope.dims % 2 != 0 || rope.inv_freq.len() as i64 != half {
        return Err(shape(
            "rope",
            format!("{} rotated features, {} frequencies, head_dim {d}", rope.dims, rope.inv_freq.len()),
        ));
    }
    let per_row = match offset.shape() {
        [] => false,
        [rows] if *rows == b => true,
        _ => return Err(shape("rope", format!("offsets {} for {b} rows", offset.ty()))),
    };
    let pairs = [b, h, l, half];
    let (cos, sin) = if per_row {
        // angles[r, l, i] = (offset[r] + l) · inv_freq[i]
        let grid = [b, l];
        let steps = f.iota(TensorType::new(&grid, ElementType::I32), 1)?;
        let offset = f.broadcast_in_dim(offset, &grid, &[0])?;
        let positions = f.add(&steps, &offset)?;
        let positions = f.convert(&positions, F32);
        let positions = f.broadcast_in_dim(&positions, &[b, l, half], &[0, 1])?;
        let inv_freq = f.floats(&rope.inv_freq)?;
        let inv_freq = f.broadcast_in_dim(&inv_freq, &[b, l, half], &[2])?;
        let angles = f.multiply(&positions, &inv_freq)?;
        let cos = f.cosine(&angles)?;
        let sin = f.sine(&angles)?;
        (f.broadcast_in_dim(&cos, &pairs, &[0, 2, 3])?, f.broadcast_in_dim(&sin, &pairs, &[0, 2, 3])?)
    } else {
        // angles[l, i] = (offset + l) · inv_freq[i]
        let steps = f.iota(TensorType::new(&[l], ElementType::I32), 0)?;
        let offset = f.broadcast_in_dim(offset, &[l], &[])?;
        let positions = f.add(&steps, &offset)?;
        let positions = f.convert(&positions, F32);
        let positions = f.broadcast_in_dim(&positions, &[l, half], &[0])?;
        let inv_freq = f.floats(&rope.inv_freq)?;
        let inv_freq = f.broadcast_in_dim(&inv_freq, &[l, half], &[1])?;
        let angles = f.multiply(&positions, &inv_freq)?;
        let cos = f.cosine(&angles)?;
        let sin = f.sine(&angles)?;
        (f.broadcast_in_dim(&cos, &pairs, &[2, 3])?, f.broadcast_in_dim(&sin, &pairs, &[2, 3])?)
    };
    let rotated = f.slice_axis(x, 3, 0, rope.dims)?;
    // The two features of each pair: halves, or adjacent features.
    let (x1, x2) = if rope.traditional {
        let r = f.reshape(&rotated, &[b, h, l, half, 2])?;
        let x1 = f.slice_axis(&r, 4, 0, 1)?;
        let x2 = f.slice_axis(&r, 4, 1, 2)?;
        (f.reshape(&x1, &pairs)?, f.reshape(&x2, &pairs)?)
    } else {
        (f.slice_axis(&rotated, 3, 0, half)?, f.slice_axis(&rotated, 3, half, rope.dims)?)
    };
    let a = f.multiply(&x1, &cos)?;
    let c = f.multiply(&x2, &sin)?;
    let y1 = f.subtract(&a, &c)?;
    let a = f.multiply(&x1, &sin)?;
    let c = f.multiply(&x2, &cos)?;
    let y2 = f.add(&a, &c)?;
    let out = if rope.traditional {
        let y1 = f.reshape(&y1, &[b, h, l, half, 1])?;
        let y2 = f.reshape(&y2, &[b, h, l, half, 1])?;
        let y = f.concatenate(&[&y1, &y2], 4)?;
        f.reshape(&y, &[b, h, l, rope.dims])?
    } else {
        f.concatenate(&[&y1, &y2], 3)?
    };
    if rope.dims == d {
        return Ok(out);
    }
    let rest = f.slice_axis(x, 3, rope.dims, d)?;
    f.concatenate(&[&out, &rest], 3)
}

/// One attention step over an explicit KV cache.
pub struct CachedAttention {
    /// The output, heads merged: `[batch, seq, heads · head_dim]`.
    pub out: Value,
    /// The key cache with this step's keys written.
    pub keys: Value,
    /// The value cache with this step's values written.
    pub values: Value,
}

/// How [`cached_attention`] attends, besides its tensors.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Attend {
    /// Multiplies the scores (`1/sqrt(head_dim)` unless the config says otherwise).
    pub scale: f32,
    /// Keys more than this many positions behind a query are not seen
    /// (sliding-window layers); `None` for global attention.
    pub window: Option<i64>,
}

/// Scaled dot-product attention of `q [b, heads, l, d]` over a cache
/// `[b, kv_heads, capacity, d]` into which this step's `k`, `v`
/// (`[b, kv_heads, l, d]`) are first written at each row's position
/// `offsets` (an i32 scalar for every row, or one per row `[b]`): query `i`
/// of row `r` sees keys `0..=offsets[r] + i` (causal), and with a window
/// only the last `window` of them. Grouped-query heads share their kv head
/// (`heads` a multiple of `kv_heads`).
pub fn cached_attention(
    f: &mut Function,
    q: &Value,
    k: &Value,
    v: &Value,
    cache: (&Value, &Value),
    offsets: &Value,
    how: Attend,
) -> Result<CachedAttention> {
    let [b, heads, l, d] = *q.shape() else {
        return Err(shape("attention", format!("queries {} (need [batch, heads, seq, head_dim])", q.ty())));
    };
    let (cache_k, cache_v) = cache;
    let [_, kv_heads, capacity, _] = *cache_k.shape() else {
        return Err(shape("attention", format!("key cache {}", cache_k.ty())));
    };
    let fits = kv_heads > 0
        && heads % kv_heads == 0
        && k.shape() == [b, kv_heads, l, d]
        && v.shape() == k.shape()
        && cache_k.shape() == [b, kv_heads, capacity, d]
        && cache_v.shape() == cache_k.shape()
        && l <= capacity
        && offsets.element() == ElementType::I32
        && (offsets.shape().is_empty() || offsets.shape() == [b])
        && how.window.is_none_or(|w| w > 0);
    if !fits {
        return Err(shape(
            "attention",
            format!(
                "q {}, k {}, v {}, caches {} and {}, offsets {}, window {:?}",
                q.ty(),
                k.ty(),
                v.ty(),
                cache_k.ty(),
                cache_v.ty(),
                offsets.ty(),
                how.window
            ),
        ));
    }
    let keys = write_rows(f, cache_k, k, offsets)?;
    let values = write_rows(f, cache_v, v, offsets)?;
    let rep = heads / kv_heads;
    let qg = f.reshape(q, &[b, kv_heads, rep * l, d])?;
    let keys_f = f32_of(f, &keys);
    let values_f = f32_of(f, &values);
    // scores [b, kv_heads, rep·l, capacity]
    let scores = f.dot_general(&qg, &keys_f, (&[0, 1], &[0, 1]), (&[3], &[3]))?;
    let s = f.splat(f64::from(how.scale), scores.ty().clone());
    let scores = f.multiply(&scores, &s)?;
    // Query r of the grouped axis is query r mod l of its row: it sits at
    // position offset + r mod l and sees keys up to there.
    let grid = TensorType::new(&[b, rep * l, capacity], ElementType::I32);
    let rows = f.iota(grid.clone(), 1)?;
    let ls = f.splat(l as f64, grid.clone());
    let query = remainder(f, &rows, &ls)?;
    let offsets = f.broadcast_in_dim(offsets, &grid.shape, if offsets.shape().is_empty() { &[] } else { &[0] })?;
    let position = f.add(&query, &offsets)?;
    let key_index = f.iota(grid.clone(), 2)?;
    let mut visible = f.compare(&key_index, Comparison::Le, &position)?;
    if let Some(window) = how.window {
        let w = f.splat(window as f64, grid);
        let oldest = f.subtract(&position, &w)?;
        let recent = f.compare(&key_index, Comparison::Gt, &oldest)?;
        visible = f.and(&visible, &recent)?;
    }
    let visible = f.broadcast_in_dim(&visible, scores.shape(), &[0, 2, 3])?;
    let hidden = f.splat(f64::NEG_INFINITY, scores.ty().clone());
    let scores = f.select(&visible, &scores, &hidden)?;
    let probs = softmax_last(f, &scores)?;
    let out = f.dot_general(&probs, &values_f, (&[0, 1], &[0, 1]), (&[3], &[2]))?;
    // [b, kv_heads, rep·l, d] → [b, heads, l, d] → [b, l, heads·d]
    let out = f.reshape(&out, &[b, heads, l, d])?;
    let out = f.transpose(&out, &[0, 2, 1, 3])?;
    let out = f.reshape(&out, &[b, l, heads * d])?;
    Ok(CachedAttention { out, keys, values })
}

/// `cache [b, kv_heads, capacity, d]` with `new [b, kv_heads, l, d]` written
/// at each row's offset (a scalar for all rows, or one per row).
fn write_rows(f: &mut Function, cache: &Value, new: &Value, offsets: &Value) -> Result<Value> {
    let new = f.convert(new, cache.element());
    let zero = f.scalar(0.0, ElementType::I32);
    if offsets.shape().is_empty() {
        return f.dynamic_update_slice(cache, &new, &[&zero, &zero, offsets, &zero]);
    }
    // Rows at different positions: each row written on its own (decode
    // batches are small), then joined.
    let rows = cache.shape()[0];
    let mut written = Vec::new();
    for r in 0..rows {
        let row = f.slice_axis(cache, 0, r, r + 1)?;
        let update = f.slice_axis(&new, 0, r, r + 1)?;
        let at = f.slice_axis(offsets, 0, r, r + 1)?;
        let at = f.reshape(&at, &[])?;
        written.push(f.dynamic_update_slice(&row, &update, &[&zero, &zero, &at, &zero])?);
    }
    let refs: Vec<&Value> = written.iter().collect();
    f.concatenate(&refs, 0)
}

/// `a mod b` of non-negative i32s, elementwise.
fn remainder(f: &mut Function, a: &Value, b: &Value) -> Result<Value> {
    let q = f.divide(a, b)?;
    let m = f.multiply(&q, b)?;
    f.subtract(a, &m)
}

/// The softmax over the last axis, in f32, stable (the row's maximum subtracted first).
pub fn softmax_last(f: &mut Function, x: &Value) -> Result<Value> {
    let rank = x.shape().len();
    if rank == 0 {
        return Err(shape("softmax", "a scalar input"));
    }
    let keep: Vec<usize> = (0..rank - 1).collect();
    let max = f.reduce(x, &[rank - 1], Reduction::Max)?;
    let max = f.broadcast_in_dim(&max, x.shape(), &keep)?;
    let shifted = f.subtract(x, &max)?;
    let e = f.exp(&shifted)?;
    let sum = f.reduce(&e, &[rank - 1], Reduction::Sum)?;
    let sum = f.broadcast_in_dim(&sum, x.shape(), &keep)?;
    f.divide(&e, &sum)
}
