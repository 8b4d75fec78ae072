//! The model code (`mlxcel_models`) traced into StableHLO: the same
//! network the MLX runtime runs, recorded op by op into a [`Function`].
//!
//! - [`Hlo`] says how a traced model is represented: SSA values for
//!   tensors, and weights as the values of their parameter loads.
//! - [`ParameterLoader`] declares each weight the model code asks for as a
//!   named parameter of the function being traced, typed from
//!   [`StoredTensors`] (what the bundle holds: shapes, element types,
//!   quantization), so weights are never constants.
//! - [`TracePass`] implements the operations with [`crate::layers`]. The KV
//!   caches are explicit state: a function takes each layer's key and value
//!   caches as arguments and returns them written ([`TracePass::caches`]).

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};

use mlxcel_arch::Activation;
use mlxcel_models::decoder::Residual;
use mlxcel_models::rope::{Frequencies, RopeSpec};
use mlxcel_models::{Backend, Loader, Ops};

use crate::builder::{Function, Value};
use crate::error::{Error, Result, shape};
use crate::layers::{self, Attend, Gate, Quantized, Weight};
use crate::types::{ElementType, TensorType};

/// The model code's types when traced into StableHLO.
pub struct Hlo;

/// A traced linear map.
pub struct Linear {
    /// The matrix `[out, in]`.
    pub weight: Weight,
    /// The bias `[out]`.
    pub bias: Option<Value>,
}

/// A traced RMS norm.
pub struct Norm {
    /// The gain actually multiplied in (Gemma's `1 + w` added in the graph).
    pub gain: Value,
    /// Added to the mean square.
    pub eps: f32,
}

/// A traced embedding table.
pub struct Embedding {
    /// The table `[vocab, dim]`.
    pub table: Weight,
    /// Multiplies looked-up rows.
    pub scale: f32,
}

/// A traced rotary embedding.
pub struct Rope {
    /// The rotation.
    pub rope: layers::Rope,
    /// Multiplies the rotated features first (YaRN's and LongRoPE's mscale).
    pub input_scale: Option<f32>,
}

/// Stacked matrices `[experts, out, in]` (float, or quantized with codes
/// `[experts, out, words]` and scales and biases `[experts, out, groups]`).
pub type Experts = Weight;

impl Backend for Hlo {
    type Tensor = Value;
    type Linear = Linear;
    type Norm = Norm;
    type Embedding = Embedding;
    type Rope = Rope;
    type Experts = Experts;
    type Error = Error;
}

impl From<mlxcel_models::Error> for Error {
    fn from(e: mlxcel_models::Error) -> Error {
        Error::Model(e.to_string())
    }
}

/// What a bundle stores of one tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredTensor {
    /// Its shape.
    pub shape: Vec<i64>,
    /// Its element type (quantized codes: 32-bit words, [`ElementType::I32`]).
    pub element: ElementType,
}

/// How a quantized matrix is stored (MLX's row-major affine layout: codes
/// `NAME.weight`, one scale and bias per group in `NAME.scales`, `NAME.biases`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoredQuantization {
    /// Bits per code.
    pub bits: u32,
    /// Codes per scale.
    pub group: i64,
}

/// The tensors of a model as the tracer sees them: names, shapes, types,
/// and which matrices are quantized.
#[derive(Clone, Debug, Default)]
pub struct StoredTensors {
    tensors: HashMap<String, StoredTensor>,
    quantized: HashMap<String, StoredQuantization>,
}

impl StoredTensors {
    /// An empty set.
    pub fn new() -> StoredTensors {
        StoredTensors::default()
    }

    /// Adds the tensor `name`.
    pub fn insert(&mut self, name: impl Into<String>, tensor: StoredTensor) {
        self.tensors.insert(name.into(), tensor);
    }

    /// Marks the matrix `prefix` (`prefix.weight`, `.scales`, `.biases`) quantized.
    pub fn mark_quantized(&mut self, prefix: impl Into<String>, q: StoredQuantization) {
        self.quantized.insert(prefix.into(), q);
    }

    fn get(&self, name: &str) -> Result<&StoredTensor> {
        self.tensors.get(name).ok_or_else(|| Error::Weight { name: name.to_string(), message: "missing".into() })
    }
}

/// Declares the weights the model code asks for as parameters of the
/// function being traced.
pub struct ParameterLoader<'a> {
    f: RefCell<&'a mut Function>,
    tensors: &'a StoredTensors,
    used: RefCell<BTreeSet<String>>,
}

impl<'a> ParameterLoader<'a> {
    /// A loader declaring parameters in `f`, typed from `tensors`.
    pub fn new(f: &'a mut Function, tensors: &'a StoredTensors) -> ParameterLoader<'a> {
        ParameterLoader { f: RefCell::new(f), tensors, used: RefCell::new(BTreeSet::new()) }
    }

    /// The tensors no weight took (a model that leaves some unused is a
    /// name-mapping bug, as in the runtime).
    pub fn unused(&self) -> Vec<String> {
        let used = self.used.borrow();
        let mut unused: Vec<String> = self.tensors.tensors.keys().filter(|n| !used.contains(*n)).cloned().collect();
        unused.sort_unstable();
        unused
    }

    /// The stored tensor `name`, which must have `shape`, as a parameter.
    fn tensor(&self, name: &str, shape_want: &[i64]) -> Result<Value> {
        let t = self.tensors.get(name)?;
        if t.shape != shape_want {
            return Err(Error::Weight {
                name: name.to_string(),
                message: format!("shape {:?}, expected {shape_want:?}", t.shape),
            });
        }
        self.used.borrow_mut().insert(name.to_string());
        self.f.borrow_mut().parameter(name, TensorType::new(&t.shape, t.element))
    }

    /// The matrix `prefix` `[..lead, rows, cols]` (`lead`: stacked experts),
    /// float or quantized; each stored part is declared with its stored type.
    fn matrix(&self, prefix: &str, lead: &[i64], rows: i64, cols: i64) -> Result<Weight> {
        let shape = |last: i64| [lead, &[rows, last]].concat();
        let Some(&q) = self.tensors.quantized.get(prefix) else {
            return Ok(Weight::Dense(self.tensor(&format!("{prefix}.weight"), &shape(cols))?));
        };
        let bits = i64::from(q.bits);
        if !(2..=8).contains(&q.bits) || q.group <= 0 || cols % q.group != 0 || cols * bits % 32 != 0 {
            return Err(Error::Weight {
                name: prefix.to_string(),
                message: format!("{cols} inputs of {bits} bits in groups of {}", q.group),
            });
        }
        Ok(Weight::Quantized(Quantized {
            packed: self.tensor(&format!("{prefix}.weight"), &shape(cols * bits / 32))?,
            scales: self.tensor(&format!("{prefix}.scales"), &shape(cols / q.group))?,
            biases: self.tensor(&format!("{prefix}.biases"), &shape(cols / q.group))?,
            bits: q.bits,
            group: q.group,
        }))
    }
}

fn i64_of(n: usize) -> i64 {
    // Sizes come from a validated config; they fit comfortably.
    n as i64
}

impl Loader<Hlo> for ParameterLoader<'_> {
    fn has_weight(&self, name: &str) -> bool {
        self.tensors.tensors.contains_key(&format!("{name}.weight"))
    }

    fn linear(&self, name: &str, inputs: usize, outputs: usize, bias: bool) -> Result<Linear> {
        let weight = self.matrix(name, &[], i64_of(outputs), i64_of(inputs))?;
        let bias = if bias { Some(self.tensor(&format!("{name}.bias"), &[i64_of(outputs)])?) } else { None };
        Ok(Linear { weight, bias })
    }

    fn experts(&self, name: &str, count: usize, inputs: usize, outputs: usize) -> Result<Experts> {
        self.matrix(name, &[i64_of(count)], i64_of(outputs), i64_of(inputs))
    }

    fn embedding(&self, name: &str, vocab: usize, dim: usize, scale: f32) -> Result<Embedding> {
        Ok(Embedding { table: self.matrix(name, &[], i64_of(vocab), i64_of(dim))?, scale })
    }

    fn rms_norm(&self, name: &str, dim: usize, eps: f32, offset: bool) -> Result<Norm> {
        let w = self.tensor(&format!("{name}.weight"), &[i64_of(dim)])?;
        let mut f = self.f.borrow_mut();
        let mut gain = f.convert(&w, ElementType::F32);
        if offset {
            let one = f.splat(1.0, gain.ty().clone());
            gain = f.add(&gain, &one)?;
        }
        Ok(Norm { gain, eps })
    }

    fn rope(&self, spec: &RopeSpec) -> Result<Rope> {
        let dims = i64_of(spec.dims);
        let rope = match &spec.frequencies {
            Frequencies::Base { base, scale } => layers::Rope::with_base(dims, spec.traditional, *base, *scale),
            Frequencies::Wavelengths(w) => layers::Rope::with_wavelengths(dims, spec.traditional, w),
        };
        Ok(Rope { rope, input_scale: spec.input_scale })
    }
}

/// One layer's KV caches in a traced function: `[b, kv_heads, capacity, d]` each.
#[derive(Clone, Debug)]
pub struct LayerCache {
    /// The keys.
    pub keys: Value,
    /// The values.
    pub values: Value,
    /// The layer's window (`None`: global attention).
    pub window: Option<i64>,
}

/// A forward pass traced into a function: attention reads each layer's
/// caches and replaces them with the written ones. `offset` is where the
/// pass's positions start: an i32 scalar for every row, or one per row
/// `[batch]` (a decode batch of sequences at different positions).
pub struct TracePass<'f> {
    f: &'f mut Function,
    offset: Value,
    caches: Vec<LayerCache>,
}

impl<'f> TracePass<'f> {
    /// A pass recording into `f`, from position `offset` (scalar or per
    /// row), over `caches` (one per layer).
    pub fn new(f: &'f mut Function, offset: Value, caches: Vec<LayerCache>) -> TracePass<'f> {
        TracePass { f, offset, caches }
    }

    /// The function being recorded into (for ops around the model's, such
    /// as picking the last position).
    pub fn function(&mut self) -> &mut Function {
        self.f
    }

    /// The caches as the pass left them (written by every layer's attention).
    pub fn caches(&self) -> &[LayerCache] {
        &self.caches
    }
}

fn gate(act: Activation) -> Gate {
    match act {
        Activation::Silu => Gate::Silu,
        Activation::GeluTanh => Gate::GeluTanh,
    }
}

/// `[b, l, heads·d]` → `[b, heads, l, d]`.
fn to_heads(f: &mut Function, x: &Value, heads: i64, d: i64) -> Result<Value> {
    let (b, l) = (x.shape()[0], x.shape()[1]);
    let x = f.reshape(x, &[b, l, heads, d])?;
    f.transpose(&x, &[0, 2, 1, 3])
}

/// `x [n, in]`, row `r` through expert `ids[r]` of the stacked `w
/// [experts, out, in]`: `[n, out]`. Only the chosen experts' matrices are
/// read (gathered, then dequantized): right for decode steps; a long
/// prompt through a large mixture gathers a matrix per token and expert.
fn expert_products(f: &mut Function, x: &Value, w: &Weight, ids: &Value) -> Result<Value> {
    let n = ids.shape()[0];
    // Each expert's [out, cols] as one row of [experts, out · cols], gathered.
    let pick = |f: &mut Function, stacked: &Value| -> Result<Value> {
        let [e, out, cols] = *stacked.shape() else {
            return Err(shape("switch_glu", format!("stacked experts {}", stacked.ty())));
        };
        let flat = f.reshape(stacked, &[e, out * cols])?;
        let rows = f.gather_rows(&flat, ids)?;
        f.reshape(&rows, &[n * out, cols])
    };
    let matrices = match w {
        Weight::Dense(d) => {
            let rows = pick(f, d)?;
            f.convert(&rows, ElementType::F32)
        }
        Weight::Quantized(q) => {
            let picked = Quantized {
                packed: pick(f, &q.packed)?,
                scales: pick(f, &q.scales)?,
                biases: pick(f, &q.biases)?,
                bits: q.bits,
                group: q.group,
            };
            layers::dequantize(f, &picked)?
        }
    };
    let out = matrices.shape()[0] / n;
    let inputs = matrices.shape()[1];
    let matrices = f.reshape(&matrices, &[n, out, inputs])?;
    f.dot_general(x, &matrices, (&[0], &[0]), (&[1], &[2]))
}

/// `x[..., :dims] · s`, the other features as they are.
fn scale_leading(f: &mut Function, x: &Value, dims: i64, s: f32) -> Result<Value> {
    let last = x.shape().len() - 1;
    let d = x.shape()[last];
    let head = f.slice_axis(x, last, 0, dims)?;
    let k = f.splat(f64::from(s), head.ty().clone());
    let head = f.multiply(&head, &k)?;
    if dims == d {
        return Ok(head);
    }
    let rest = f.slice_axis(x, last, dims, d)?;
    f.concatenate(&[&head, &rest], last)
}

impl Ops<Hlo> for TracePass<'_> {
    fn embed(&mut self, table: &Embedding, ids: &Value) -> Result<Value> {
        layers::embedding(self.f, ids, &table.table, table.scale)
    }

    fn embedding_logits(&mut self, table: &Embedding, x: &Value) -> Result<Value> {
        layers::linear(self.f, x, &table.table, None)
    }

    fn rms_norm(&mut self, norm: &Norm, x: &Value) -> Result<Value> {
        layers::rms_norm(self.f, x, &norm.gain, norm.eps)
    }

    fn linear(&mut self, x: &Value, map: &Linear) -> Result<Value> {
        layers::linear(self.f, x, &map.weight, map.bias.as_ref())
    }

    fn linear_heads(&mut self, x: &Value, maps: &[(&Linear, usize)], head_dim: usize) -> Result<Vec<Value>> {
        maps.iter()
            .map(|&(map, heads)| {
                let y = layers::linear(self.f, x, &map.weight, map.bias.as_ref())?;
                to_heads(self.f, &y, i64_of(heads), i64_of(head_dim))
            })
            .collect()
    }

    fn split_heads(&mut self, x: &Value, heads: &[usize], head_dim: usize) -> Result<Vec<Value>> {
        let last = x.shape().len() - 1;
        let d = i64_of(head_dim);
        let mut start = 0;
        let mut parts = Vec::with_capacity(heads.len());
        for &n in heads {
            let end = start + i64_of(n) * d;
            let part = self.f.slice_axis(x, last, start, end)?;
            parts.push(to_heads(self.f, &part, i64_of(n), d)?);
            start = end;
        }
        Ok(parts)
    }

    fn split_last(&mut self, x: &Value, parts: usize) -> Result<Vec<Value>> {
        let last = x.shape().len() - 1;
        let n = x.shape()[last];
        let parts = i64_of(parts);
        if parts == 0 || n % parts != 0 {
            return Err(shape("split", format!("{} into {parts} equal parts", x.ty())));
        }
        let size = n / parts;
        (0..parts).map(|i| self.f.slice_axis(x, last, i * size, (i + 1) * size)).collect()
    }

    fn residual(&mut self, x: &Value, y: &Value, _how: Residual) -> Result<Value> {
        // Activations are f32 here, where Gemma's f16 clipping does nothing.
        self.f.add(x, y)
    }

    fn gated_linear(&mut self, x: &Value, gate_map: &Linear, up: &Linear, act: Activation) -> Result<Value> {
        let g = self.linear(x, gate_map)?;
        let u = self.linear(x, up)?;
        layers::gated(self.f, &g, &u, gate(act))
    }

    fn gated(&mut self, g: &Value, up: &Value, act: Activation) -> Result<Value> {
        layers::gated(self.f, g, up, gate(act))
    }

    fn attend(&mut self, layer: usize, q: &Value, k: &Value, v: &Value, rope: &Rope, scale: f32) -> Result<Value> {
        let cache = self
            .caches
            .get(layer)
            .cloned()
            .ok_or_else(|| Error::Model(format!("no KV cache for layer {layer} in the traced function")))?;
        let (q, k) = match rope.input_scale {
            Some(s) => (scale_leading(self.f, q, rope.rope.dims, s)?, scale_leading(self.f, k, rope.rope.dims, s)?),
            None => (q.clone(), k.clone()),
        };
        let q = layers::rope(self.f, &q, &self.offset, &rope.rope)?;
        let k = layers::rope(self.f, &k, &self.offset, &rope.rope)?;
        let how = Attend { scale, window: cache.window };
        let step = layers::cached_attention(self.f, &q, &k, v, (&cache.keys, &cache.values), &self.offset, how)?;
        self.caches[layer] = LayerCache { keys: step.keys, values: step.values, window: cache.window };
        Ok(step.out)
    }

    fn softmax(&mut self, x: &Value) -> Result<Value> {
        layers::softmax_last(self.f, x)
    }

    fn top_k(&mut self, x: &Value, k: usize) -> Result<(Value, Value)> {
        // k rounds of: the row's largest value, its first index, then that
        // entry masked out. The routers' k is small (2 to 8).
        let f = &mut *self.f;
        let last = x.shape().len().checked_sub(1).ok_or_else(|| shape("top_k", "a scalar input"))?;
        let n = x.shape()[last];
        if k == 0 || i64_of(k) > n {
            return Err(shape("top_k", format!("the {k} largest of {}", x.ty())));
        }
        let keep: Vec<usize> = (0..last).collect();
        let mut one = x.shape().to_vec();
        one[last] = 1;
        let index = f.iota(TensorType::new(x.shape(), ElementType::F32), last)?;
        let past_end = f.splat(n as f64, index.ty().clone());
        let hidden = f.splat(f64::NEG_INFINITY, x.ty().clone());
        let (mut rest, mut values, mut indices) = (x.clone(), Vec::new(), Vec::new());
        for _ in 0..k {
            let max = f.reduce(&rest, &[last], crate::builder::Reduction::Max)?;
            let max_all = f.broadcast_in_dim(&max, x.shape(), &keep)?;
            let is_max = f.compare(&rest, crate::builder::Comparison::Eq, &max_all)?;
            // The first index holding the maximum: min over candidates = -max(-candidates).
            let candidates = f.select(&is_max, &index, &past_end)?;
            let negated = f.negate(&candidates)?;
            let first = f.reduce(&negated, &[last], crate::builder::Reduction::Max)?;
            let first = f.negate(&first)?;
            let first_all = f.broadcast_in_dim(&first, x.shape(), &keep)?;
            let taken = f.compare(&index, crate::builder::Comparison::Eq, &first_all)?;
            rest = f.select(&taken, &hidden, &rest)?;
            values.push(f.reshape(&max, &one)?);
            let first = f.convert(&first, ElementType::I32);
            indices.push(f.reshape(&first, &one)?);
        }
        let values: Vec<&Value> = values.iter().collect();
        let indices: Vec<&Value> = indices.iter().collect();
        Ok((f.concatenate(&values, last)?, f.concatenate(&indices, last)?))
    }

    fn normalize_sum(&mut self, x: &Value) -> Result<Value> {
        let rank = x.shape().len();
        let keep: Vec<usize> = (0..rank - 1).collect();
        let sum = self.f.reduce(x, &[rank - 1], crate::builder::Reduction::Sum)?;
        let sum = self.f.broadcast_in_dim(&sum, x.shape(), &keep)?;
        self.f.divide(x, &sum)
    }

    fn switch_glu(
        &mut self,
        x: &Value,
        [gate_w, up_w, down_w]: [&Experts; 3],
        chosen: &Value,
        act: Activation,
    ) -> Result<Value> {
        let f = &mut *self.f;
        let ([b, l, h], [_, _, k]) = (x.shape(), chosen.shape()) else {
            return Err(shape("switch_glu", format!("x {} and chosen experts {}", x.ty(), chosen.ty())));
        };
        let (b, l, h, k) = (*b, *l, *h, *k);
        // One row per (token, chosen expert).
        let n = b * l * k;
        let ids = f.reshape(chosen, &[n])?;
        let xs = f.broadcast_in_dim(x, &[b, l, k, h], &[0, 1, 3])?;
        let xs = f.reshape(&xs, &[n, h])?;
        let g = expert_products(f, &xs, gate_w, &ids)?;
        let u = expert_products(f, &xs, up_w, &ids)?;
        let hidden = layers::gated(f, &g, &u, gate(act))?;
        let y = expert_products(f, &hidden, down_w, &ids)?;
        let out = y.shape()[1];
        f.reshape(&y, &[b, l, k, out])
    }

    fn weighted_sum(&mut self, ys: &Value, weights: &Value) -> Result<Value> {
        let f = &mut *self.f;
        let rank = ys.shape().len();
        if rank < 2 || weights.shape() != &ys.shape()[..rank - 1] {
            return Err(shape("weighted_sum", format!("{} weighted by {}", ys.ty(), weights.ty())));
        }
        let keep: Vec<usize> = (0..rank - 1).collect();
        let w = f.broadcast_in_dim(weights, ys.shape(), &keep)?;
        let weighted = f.multiply(ys, &w)?;
        f.reduce(&weighted, &[rank - 2], crate::builder::Reduction::Sum)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builder::Module;

    fn f32s(shape: &[i64]) -> StoredTensor {
        StoredTensor { shape: shape.to_vec(), element: ElementType::F32 }
    }

    #[test]
    fn weights_are_parameters_checked_against_the_stored_tensors() {
        let mut stored = StoredTensors::new();
        stored.insert("a.weight", f32s(&[8, 4]));
        stored.insert("a.bias", f32s(&[8]));
        stored.insert("b.weight", f32s(&[4, 8]));
        stored.insert("extra.weight", f32s(&[2]));
        let module = Module::new("m");
        let mut f = module.function("f", &[]);
        let loader = ParameterLoader::new(&mut f, &stored);
        let a = loader.linear("a", 4, 8, true).unwrap();
        assert!(matches!(a.weight, Weight::Dense(ref w) if w.shape() == [8, 4]) && a.bias.is_some());
        let err = loader.linear("b", 4, 8, false).err().unwrap().to_string();
        assert_eq!(err, "weight b.weight: shape [4, 8], expected [8, 4]");
        let err = loader.linear("c", 4, 8, false).err().unwrap().to_string();
        assert_eq!(err, "weight c.weight: missing");
        assert_eq!(loader.unused(), ["b.weight", "extra.weight"]);
    }

    #[test]
    fn quantized_parts_are_declared_as_stored_and_their_shapes_checked() {
        let mut stored = StoredTensors::new();
        stored.insert("q.weight", StoredTensor { shape: vec![8, 4], element: ElementType::I32 });
        stored.insert("q.scales", StoredTensor { shape: vec![8, 1], element: ElementType::F16 });
        stored.insert("q.biases", f32s(&[8, 1]));
        stored.mark_quantized("q", StoredQuantization { bits: 4, group: 32 });
        stored.insert("r.weight", StoredTensor { shape: vec![8, 4], element: ElementType::I32 });
        stored.insert("r.scales", f32s(&[8, 2]));
        stored.insert("r.biases", f32s(&[8, 2]));
        stored.mark_quantized("r", StoredQuantization { bits: 4, group: 32 });
        let module = Module::new("m");
        let mut f = module.function("f", &[]);
        let loader = ParameterLoader::new(&mut f, &stored);
        let q = loader.linear("q", 32, 8, false).unwrap();
        let Weight::Quantized(q) = q.weight else { panic!("q is quantized") };
        assert_eq!((q.scales.element(), q.biases.element()), (ElementType::F16, ElementType::F32));
        let err = loader.linear("r", 32, 8, false).err().unwrap().to_string();
        assert_eq!(err, "weight r.scales: shape [8, 2], expected [8, 1]");
    }
}
