//! The functions a bundle's StableHLO module exports: prefill over a few
//! bucketed prompt lengths and decode steps of a few batch sizes, each traced
//! from the model code of `mlxcel-models` (through [`crate::model`]), with
//! the KV caches as arguments the function writes in place.
//!
//! Why buckets: IREE compiles static shapes ahead of time, so a prompt is
//! run as chunks of the bucket lengths, its last chunk padded. Padding is
//! harmless: the padded positions are written into the caches past the
//! prompt's end, where every later query's causal mask hides them until a
//! real token overwrites them; `last` picks the logits of the chunk's last
//! real token. A chunk must still fit the caches (`offset + bucket <=
//! capacity`): StableHLO clamps an update that does not, which would shift
//! it over earlier positions.
//!
//! Signatures (`C` the cache capacity, `B` a decode batch, per layer `i` a
//! key and a value cache `[rows, kv_heads, C, head_dim]` f32):
//!
//! - `prefill_T(tokens [1, T] i32, offset i32, last i32, keys_0, values_0, ...)`
//!   → `(logits [1, vocab] f32, keys_0, values_0, ...)`: the chunk's tokens
//!   at positions `offset..offset + T`, the logits of its row `last`.
//! - `decode_B(tokens [B, 1] i32, offsets [B] i32, keys_0, values_0, ...)`
//!   → `(logits [B, vocab] f32, keys_0, values_0, ...)`: one token per
//!   sequence, sequence `r` at position `offsets[r]` of its own cache row.
//!
//! Each written cache is the result whose storage is its argument's
//! (`iree.abi.output`): IREE updates the caller's caches where they lie.

use mlxcel_arch::ModelConfig;

use crate::builder::{Function, Module, Value};
use crate::error::{Error, Result};
use crate::model::{Hlo, LayerCache, ParameterLoader, StoredTensors, TracePass};
use crate::types::{ElementType, TensorType};

/// Which functions to trace, and the caches they work on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GraphPlan {
    capacity: i64,
    prefill: Vec<i64>,
    decode: Vec<i64>,
}

/// The prompt-chunk lengths traced by default (those above the capacity are left out).
pub const DEFAULT_PREFILL: [i64; 3] = [32, 128, 512];

/// The decode batch sizes traced by default.
pub const DEFAULT_DECODE: [i64; 2] = [1, 4];

impl GraphPlan {
    /// Caches of `capacity` positions, prompt chunks of the `prefill`
    /// lengths, decode batches of the `decode` sizes (each list sorted and
    /// deduplicated; at least one of each; chunks no longer than the caches).
    pub fn new(capacity: i64, mut prefill: Vec<i64>, mut decode: Vec<i64>) -> Result<GraphPlan> {
        prefill.sort_unstable();
        prefill.dedup();
        decode.sort_unstable();
        decode.dedup();
        let bad = |what: String| Err(Error::Model(format!("graph plan: {what}")));
        if capacity <= 0 {
            return bad(format!("a cache capacity of {capacity} positions"));
        }
        match (prefill.first(), prefill.last(), decode.first()) {
            (None, _, _) => bad("no prompt-chunk length".into()),
            (_, _, None) => bad("no decode batch size".into()),
            (Some(&p), _, _) if p <= 0 => bad(format!("a prompt chunk of {p} tokens")),
            (_, Some(&p), _) if p > capacity => {
                bad(format!("prompt chunks of {p} tokens with caches of {capacity} positions"))
            }
            (_, _, Some(&d)) if d <= 0 => bad(format!("a decode batch of {d} sequences")),
            _ => Ok(GraphPlan { capacity, prefill, decode }),
        }
    }

    /// The default plan for caches of `capacity` positions: chunks of
    /// [`DEFAULT_PREFILL`] (those that fit; the capacity itself when none
    /// does), batches of [`DEFAULT_DECODE`].
    pub fn with_capacity(capacity: i64) -> Result<GraphPlan> {
        let mut prefill: Vec<i64> = DEFAULT_PREFILL.into_iter().filter(|&p| p <= capacity).collect();
        if prefill.is_empty() {
            prefill.push(capacity);
        }
        GraphPlan::new(capacity, prefill, DEFAULT_DECODE.to_vec())
    }

    /// Positions each cache holds.
    pub fn capacity(&self) -> i64 {
        self.capacity
    }

    /// The prompt-chunk lengths, ascending.
    pub fn prefill(&self) -> &[i64] {
        &self.prefill
    }

    /// The decode batch sizes, ascending.
    pub fn decode(&self) -> &[i64] {
        &self.decode
    }

    /// The name of the prefill function over chunks of `len` tokens.
    pub fn prefill_name(len: i64) -> String {
        format!("prefill_{len}")
    }

    /// The name of the decode function over `batch` sequences.
    pub fn decode_name(batch: i64) -> String {
        format!("decode_{batch}")
    }
}

/// The model `config` over the stored `tensors`, traced into one module
/// holding every function of `plan`. Every stored tensor must be taken by
/// the model (as when the runtime loads the bundle).
pub fn trace(config: &ModelConfig, tensors: &StoredTensors, plan: &GraphPlan) -> Result<Module> {
    let mut module = Module::new("model");
    for &len in &plan.prefill {
        trace_one(&mut module, config, tensors, plan.capacity, Pass::Prefill { len })?;
    }
    for &batch in &plan.decode {
        trace_one(&mut module, config, tensors, plan.capacity, Pass::Decode { batch })?;
    }
    Ok(module)
}

/// One function's pass.
#[derive(Clone, Copy)]
enum Pass {
    Prefill { len: i64 },
    Decode { batch: i64 },
}

fn trace_one(
    module: &mut Module,
    config: &ModelConfig,
    tensors: &StoredTensors,
    capacity: i64,
    pass: Pass,
) -> Result<()> {
    let dim = |n: usize, what: &str| {
        i64::try_from(n).map_err(|_| Error::Model(format!("config: {what} of {n} does not fit a tensor dimension")))
    };
    let (rows, name, inputs) = match pass {
        Pass::Prefill { len } => (
            1,
            GraphPlan::prefill_name(len),
            vec![
                ("tokens".to_string(), TensorType::new(&[1, len], ElementType::I32)),
                ("offset".to_string(), TensorType::new(&[], ElementType::I32)),
                ("last".to_string(), TensorType::new(&[], ElementType::I32)),
            ],
        ),
        Pass::Decode { batch } => (
            batch,
            GraphPlan::decode_name(batch),
            vec![
                ("tokens".to_string(), TensorType::new(&[batch, 1], ElementType::I32)),
                ("offsets".to_string(), TensorType::new(&[batch], ElementType::I32)),
            ],
        ),
    };
    let cache = TensorType::new(
        &[rows, dim(config.num_key_value_heads, "num_key_value_heads")?, capacity, dim(config.head_dim, "head_dim")?],
        ElementType::F32,
    );
    let first_cache = inputs.len();
    let mut args = inputs;
    for i in 0..config.num_hidden_layers {
        args.push((format!("keys_{i}"), cache.clone()));
        args.push((format!("values_{i}"), cache.clone()));
    }
    let arg_refs: Vec<(&str, TensorType)> = args.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
    let mut f = module.function(&name, &arg_refs);
    let model = {
        let loader = ParameterLoader::new(&mut f, tensors);
        let model = mlxcel_models::build::<Hlo>(config, &loader)?;
        let unused = loader.unused();
        if !unused.is_empty() {
            return Err(Error::Model(format!("{name}: stored tensors the model does not take: {}", unused.join(", "))));
        }
        model
    };
    let caches = model
        .layers()
        .iter()
        .enumerate()
        .map(|(i, layer)| LayerCache {
            keys: f.arg(first_cache + 2 * i),
            values: f.arg(first_cache + 2 * i + 1),
            window: layer.window().map(|w| w.get() as i64),
        })
        .collect();
    let (tokens, offset) = (f.arg(0), f.arg(1));
    let last = matches!(pass, Pass::Prefill { .. }).then(|| f.arg(2));
    let mut trace = TracePass::new(&mut f, offset, caches);
    let hidden = model.hidden_states(&mut trace, &tokens)?;
    let hidden = match &last {
        Some(last) => last_row(trace.function(), &hidden, last)?,
        None => hidden,
    };
    let logits = model.logits(&mut trace, &hidden)?;
    let written: Vec<Value> = trace.caches().iter().flat_map(|c| [c.keys.clone(), c.values.clone()]).collect();
    drop(trace);
    let vocab = *logits.shape().last().unwrap_or(&0);
    let logits = f.reshape(&logits, &[rows, vocab])?;
    for i in 0..written.len() {
        f.write_result_into(first_cache + i, 1 + i)?;
    }
    let mut results = vec![&logits];
    results.extend(written.iter());
    f.finish(module, &results)
}

/// Row `last` of `hidden [1, len, d]`: `[1, 1, d]`.
fn last_row(f: &mut Function, hidden: &Value, last: &Value) -> Result<Value> {
    let d = *hidden.shape().last().unwrap_or(&0);
    let zero = f.scalar(0.0, ElementType::I32);
    f.dynamic_slice(hidden, &[&zero, last, &zero], &[1, 1, d])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_are_sorted_and_bad_ones_refused() {
        let p = GraphPlan::new(256, vec![128, 32, 32], vec![4, 1]).unwrap();
        assert_eq!((p.prefill(), p.decode(), p.capacity()), (&[32, 128][..], &[1, 4][..], 256));
        assert_eq!(GraphPlan::with_capacity(100).unwrap().prefill(), &[32]);
        assert_eq!(GraphPlan::with_capacity(16).unwrap().prefill(), &[16]);
        assert_eq!(GraphPlan::with_capacity(4096).unwrap().prefill(), &DEFAULT_PREFILL);
        for (capacity, prefill, decode, says) in [
            (0, vec![1], vec![1], "capacity of 0"),
            (64, vec![], vec![1], "no prompt-chunk"),
            (64, vec![8], vec![], "no decode batch"),
            (64, vec![0, 8], vec![1], "chunk of 0"),
            (64, vec![128], vec![1], "chunks of 128 tokens with caches of 64"),
            (64, vec![8], vec![-1, 2], "batch of -1"),
        ] {
            let e = GraphPlan::new(capacity, prefill, decode).unwrap_err().to_string();
            assert!(e.contains(says), "{e}");
        }
    }
}
