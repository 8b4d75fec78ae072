//! The IREE backend: the bundle's own compiled module (`mlxcel-compile
//! --target iree-llvm-cpu`, docs/bundle-format.md §4.2.3) run by IREE's
//! runtime, behind the same [`Backend`] seam as MLX.
//!
//! The module's functions have static shapes: prompts run as chunks of the
//! traced lengths (`prefill_T`, the last chunk padded; the padding lands in
//! cache positions past the prompt, which the causal mask hides until real
//! tokens overwrite them), and each decode step runs `decode_1` once per
//! sequence — one sequence per call keeps every sequence's logits
//! independent of its neighbours (the batch invariance of the MLX backend).
//! Each sequence owns its KV caches, one device buffer the functions write
//! in place, sized for the module's cache capacity, which is therefore the
//! context. Cutting a sequence back ([`Backend::truncate`]) only moves its
//! position: what lies past it is masked.
//!
//! The weights are the bundle's tensor sections, served to the module as
//! IREE parameters straight from the memory map ([`mlxcel_mlx::iree`]).

use mlxcel_bundle::{Bundle, SectionView, kinds};

use crate::error::{Error, Result};

/// Which bundle module this machine runs, and the functions it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModuleChoice {
    /// The section's target (`llvm-cpu:x86_64-unknown-linux-gnu:host`).
    pub target: String,
    /// Positions each KV cache holds (the context).
    pub capacity: usize,
    /// The prompt-chunk lengths traced, ascending.
    pub prefill: Vec<usize>,
    /// The decode batch sizes traced, ascending.
    pub decode: Vec<usize>,
}

/// The `iree-vmfb` section of `bundle` this CPU can run: compiled for this
/// triple and, when compiled for the compiling machine's CPU (`host`), only
/// using extensions this CPU has. An error names the modules the bundle has
/// and what this machine needs.
pub fn choose_cpu_module<'a>(bundle: &'a Bundle) -> Result<(SectionView<'a>, ModuleChoice)> {
    let triple = kinds::host_llvm_triple();
    let have = mlxcel_mlx::device::cpu_features();
    let modules: Vec<SectionView<'a>> =
        bundle.sections_of_kind(kinds::IREE_VMFB).filter(|s| s.key() == kinds::MODEL_GRAPH_KEY).collect();
    let mut refusals = Vec::new();
    for s in &modules {
        let Some(rest) = s.target().strip_prefix("llvm-cpu:") else {
            refusals.push(format!("{} (not a CPU module)", s.target()));
            continue;
        };
        let Some((t, cpu)) = rest.split_once(':') else {
            refusals.push(format!("{} (not TRIPLE:CPU)", s.target()));
            continue;
        };
        if t != triple {
            refusals.push(format!("{} (another triple)", s.target()));
            continue;
        }
        if cpu == "host" {
            let needs = s.property(kinds::CPU_FEATURES_KEY).unwrap_or("");
            let missing: Vec<&str> = needs.split(',').filter(|f| !f.is_empty() && !have.contains(f)).collect();
            if !missing.is_empty() {
                refusals.push(format!("{} (needs {}, which this CPU lacks)", s.target(), missing.join(", ")));
                continue;
            }
        }
        return Ok((*s, describe(s)?));
    }
    let has = if modules.is_empty() { "none".to_string() } else { refusals.join("; ") };
    Err(Error::Bundle(format!(
        "no IREE module this machine can run: it needs llvm-cpu:{triple} (CPU extensions {}); the bundle has: {has}. \
         Compile one here with `mlxcel-compile MODEL --target iree-llvm-cpu -o OUT`",
        if have.is_empty() { "none".into() } else { have.join(",") }
    )))
}

/// The functions and cache capacity a module section declares.
fn describe(s: &SectionView<'_>) -> Result<ModuleChoice> {
    let bad = |what: &str, why: String| Error::Bundle(format!("IREE module {}: {what}: {why}", s.target()));
    let number = |key: &str, text: &str| {
        text.parse::<usize>()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| bad(key, format!("{text:?} is not a positive number")))
    };
    let list = |key: &str| -> Result<Vec<usize>> {
        let text = s.property(key).ok_or_else(|| bad(key, "missing".into()))?;
        let mut v = text.split(',').map(|n| number(key, n)).collect::<Result<Vec<usize>>>()?;
        v.sort_unstable();
        v.dedup();
        Ok(v)
    };
    let capacity_text =
        s.property(kinds::CACHE_CAPACITY_KEY).ok_or_else(|| bad(kinds::CACHE_CAPACITY_KEY, "missing".into()))?;
    let capacity = number(kinds::CACHE_CAPACITY_KEY, capacity_text)?;
    let prefill = list(kinds::PREFILL_KEY)?;
    let decode = list(kinds::DECODE_KEY)?;
    if !decode.contains(&1) {
        return Err(bad(kinds::DECODE_KEY, format!("{decode:?} has no batch of one, which this runtime steps with")));
    }
    Ok(ModuleChoice { target: s.target().to_string(), capacity, prefill, decode })
}

/// The chunk to run next: with `remaining` prompt tokens at position `at`,
/// the traced length to call and how many real tokens it takes; `None` when
/// no traced length fits the caches any more (the rest goes one token at a
/// time through the decode function). A chunk never crosses the capacity:
/// StableHLO clamps an update that would, shifting it over earlier positions.
pub fn next_chunk(prefill: &[usize], capacity: usize, at: usize, remaining: usize) -> Option<(usize, usize)> {
    let fits = |&&len: &&usize| at + len <= capacity;
    // The shortest length that takes all that is left (least padding) ...
    if let Some(&len) = prefill.iter().filter(fits).find(|&&len| len >= remaining) {
        return Some((len, remaining));
    }
    // ... else the longest that fits, filled.
    prefill.iter().filter(fits).max().map(|&len| (len, len.min(remaining)))
}

/// How the IREE backend runs the module.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IreeOptions {
    /// IREE's HAL driver: `local-task` (its thread pool) or `local-sync`
    /// (the calling thread only).
    pub driver: String,
    /// Workers of `local-task`'s pool (0: IREE's default, one per physical
    /// core); `local-sync` has none.
    pub threads: usize,
}

impl Default for IreeOptions {
    fn default() -> Self {
        IreeOptions { driver: "local-task".into(), threads: 0 }
    }
}

#[cfg(feature = "iree")]
pub use session::IreeBackend;

#[cfg(feature = "iree")]
mod session {
    use std::collections::HashMap;

    use mlxcel_arch::ModelConfig;
    use mlxcel_bundle::Bundle;
    use mlxcel_mlx::iree::{Arg, Buffer, DeviceSpec, Parameter, Session};

    use super::{IreeOptions, ModuleChoice, choose_cpu_module, next_chunk};
    use crate::backend::{Backend, LogitRows, Logits, SeqId};
    use crate::error::{Error, Result};

    /// The module's parameter scope (what `#flow.parameter.named<"model"::...>` names).
    const SCOPE: &str = "model";

    /// The IREE backend (module docs).
    pub struct IreeBackend {
        session: Session,
        module: ModuleChoice,
        vocab: usize,
        /// `[1, kv_heads, capacity, head_dim]`: one cache of one sequence.
        cache_dims: [usize; 4],
        /// Key and value caches per layer.
        caches_per_sequence: usize,
        sequences: HashMap<SeqId, Sequence>,
        next_id: SeqId,
        /// Cache buffers of released sequences, reused (what they hold past
        /// a new sequence's position is masked, and finite).
        spare: Vec<Buffer>,
    }

    /// A started sequence: its caches come with its first tokens.
    struct Sequence {
        caches: Option<Buffer>,
        position: usize,
    }

    fn iree(e: mlxcel_mlx::iree::IreeError) -> Error {
        Error::Iree(e.to_string())
    }

    impl IreeBackend {
        /// The module of `bundle` this CPU runs, with the bundle's tensors as
        /// its parameters, for the model `config`.
        pub fn new(bundle: &Bundle, config: &ModelConfig, options: &IreeOptions) -> Result<IreeBackend> {
            let (section, module) = choose_cpu_module(bundle)?;
            let mapping = bundle.shared_bytes();
            let start = usize::try_from(section.offset()).map_err(|_| Error::Bundle("IREE module offset".into()))?;
            let vmfb = mapping.slice(start..start + section.data().len());
            let params: Vec<Parameter> = bundle
                .tensors()
                .map(|t| Parameter { name: t.name().to_string(), offset: t.offset(), length: t.byte_len() })
                .collect();
            let device = DeviceSpec { driver: &options.driver, threads: options.threads };
            let session = Session::new(device, vmfb, SCOPE, mapping, &params).map_err(iree)?;
            let cache_dims = [1, config.num_key_value_heads, module.capacity, config.head_dim];
            Ok(IreeBackend {
                session,
                module,
                vocab: config.vocab_size,
                cache_dims,
                caches_per_sequence: 2 * config.num_hidden_layers,
                sequences: HashMap::new(),
                next_id: 0,
                spare: Vec::new(),
            })
        }

        /// The module this backend runs.
        pub fn module(&self) -> &ModuleChoice {
            &self.module
        }

        fn cache_bytes_each(&self) -> u64 {
            self.cache_dims.iter().product::<usize>() as u64 * 4
        }

        fn sequence(&self, seq: SeqId) -> Result<&Sequence> {
            self.sequences.get(&seq).ok_or(Error::UnknownSequence(seq))
        }

        fn check_room(&self, seq: SeqId, new: usize) -> Result<()> {
            let pos = self.sequence(seq)?.position;
            if pos + new > self.module.capacity {
                return Err(Error::ContextOverflow { prompt: pos + new, requested: 0, context: self.module.capacity });
            }
            Ok(())
        }

        /// Calls `function` on `inputs` and `seq`'s caches; its logits.
        fn call<'a>(&'a self, function: &str, mut args: Vec<Arg<'a>>, seq: SeqId, rows: usize) -> Result<Vec<f32>> {
            let caches = self.sequence(seq)?.caches.as_ref().ok_or(Error::UnknownSequence(seq))?;
            let each = self.cache_bytes_each();
            for i in 0..self.caches_per_sequence {
                args.push(Arg::F32Buffer { buffer: caches, offset: i as u64 * each, dims: &self.cache_dims });
            }
            let mut logits = vec![0f32; rows * self.vocab];
            self.session.call(&format!("{SCOPE}.{function}"), &args, &mut logits).map_err(iree)?;
            Ok(logits)
        }

        fn decode_one(&mut self, seq: SeqId, token: u32) -> Result<Vec<f32>> {
            let position = self.sequence(seq)?.position;
            let tokens = [token_i32(token)?];
            let offsets = [position as i32];
            let logits = self.call(
                "decode_1",
                vec![Arg::I32 { data: &tokens, dims: &[1, 1] }, Arg::I32 { data: &offsets, dims: &[1] }],
                seq,
                1,
            )?;
            self.sequences.get_mut(&seq).ok_or(Error::UnknownSequence(seq))?.position += 1;
            Ok(logits)
        }
    }

    fn token_i32(t: u32) -> Result<i32> {
        i32::try_from(t).map_err(|_| Error::InvalidParameter { name: "token", message: format!("{t} is too large") })
    }

    impl Backend for IreeBackend {
        fn new_sequence(&mut self) -> SeqId {
            let id = self.next_id;
            self.next_id += 1;
            self.sequences.insert(id, Sequence { caches: None, position: 0 });
            id
        }

        fn release_sequence(&mut self, seq: SeqId) {
            if let Some(caches) = self.sequences.remove(&seq).and_then(|s| s.caches) {
                self.spare.push(caches);
            }
        }

        fn prefill(&mut self, seq: SeqId, tokens: &[u32], want_logits: bool) -> Result<Option<Logits>> {
            self.ensure_caches(seq)?;
            self.check_room(seq, tokens.len())?;
            let mut fed = 0;
            let mut logits = None;
            while fed < tokens.len() {
                let at = self.sequence(seq)?.position;
                let Some((len, take)) = next_chunk(&self.module.prefill, self.module.capacity, at, tokens.len() - fed)
                else {
                    logits = Some(self.decode_one(seq, tokens[fed])?);
                    fed += 1;
                    continue;
                };
                let mut chunk = vec![0i32; len];
                for (c, &t) in chunk.iter_mut().zip(&tokens[fed..fed + take]) {
                    *c = token_i32(t)?;
                }
                let (offset, last) = ([at as i32], [take as i32 - 1]);
                let out = self.call(
                    &format!("prefill_{len}"),
                    vec![
                        Arg::I32 { data: &chunk, dims: &[1, len] },
                        Arg::I32 { data: &offset, dims: &[] },
                        Arg::I32 { data: &last, dims: &[] },
                    ],
                    seq,
                    1,
                )?;
                self.sequences.get_mut(&seq).ok_or(Error::UnknownSequence(seq))?.position += take;
                fed += take;
                logits = Some(out);
            }
            Ok(if want_logits { logits } else { None })
        }

        fn decode(&mut self, batch: &[(SeqId, u32)]) -> Result<LogitRows> {
            for &(seq, _) in batch {
                self.ensure_caches(seq)?;
                self.check_room(seq, 1)?;
            }
            let mut values = Vec::with_capacity(batch.len() * self.vocab);
            for &(seq, token) in batch {
                values.extend(self.decode_one(seq, token)?);
            }
            LogitRows::new(values, self.vocab)
        }

        fn position(&self, seq: SeqId) -> Result<usize> {
            Ok(self.sequence(seq)?.position)
        }

        fn vocab_size(&self) -> usize {
            self.vocab
        }

        fn context_length(&self) -> usize {
            self.module.capacity
        }

        fn can_truncate(&self, seq: SeqId, len: usize) -> Result<bool> {
            Ok(len <= self.position(seq)?)
        }

        fn truncate(&mut self, seq: SeqId, len: usize) -> Result<()> {
            let position = self.position(seq)?;
            if len > position {
                return Err(Error::InvalidParameter {
                    name: "truncate",
                    message: format!("sequence {seq} holds {position} positions, not {len}"),
                });
            }
            self.sequences.get_mut(&seq).ok_or(Error::UnknownSequence(seq))?.position = len;
            Ok(())
        }

        fn cache_bytes(&self, seq: SeqId) -> Result<usize> {
            Ok(self.sequence(seq)?.caches.as_ref().map_or(0, |c| c.len() as usize))
        }

        /// Keys and values of every layer at the module's capacity, f32.
        fn fixed_cache_bytes(&self) -> Option<u64> {
            Some(self.caches_per_sequence as u64 * self.cache_bytes_each())
        }
    }

    impl IreeBackend {
        /// Gives `seq` its caches on first use (a spare one, or new zeros:
        /// never uninitialised memory, whose NaNs the mask would not hide).
        fn ensure_caches(&mut self, seq: SeqId) -> Result<()> {
            if self.sequence(seq)?.caches.is_some() {
                return Ok(());
            }
            let caches = match self.spare.pop() {
                Some(b) => b,
                None => {
                    let bytes = self.cache_bytes_each() * self.caches_per_sequence as u64;
                    self.session.zeros(bytes).map_err(iree)?
                }
            };
            self.sequences.get_mut(&seq).ok_or(Error::UnknownSequence(seq))?.caches = Some(caches);
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::next_chunk;

    #[test]
    fn prompts_run_in_the_fewest_padded_chunks_that_fit() {
        let p = [32, 128, 512];
        assert_eq!(next_chunk(&p, 4096, 0, 5), Some((32, 5)));
        assert_eq!(next_chunk(&p, 4096, 0, 100), Some((128, 100)));
        assert_eq!(next_chunk(&p, 4096, 0, 600), Some((512, 512)));
        // Near the end of the caches only the lengths that fit are used ...
        assert_eq!(next_chunk(&p, 4096, 4000, 90), Some((32, 32)));
        assert_eq!(next_chunk(&p, 4096, 4064, 10), Some((32, 10)));
        // ... and past the last one, none.
        assert_eq!(next_chunk(&p, 4096, 4070, 10), None);
        assert_eq!(next_chunk(&[16], 16, 0, 16), Some((16, 16)));
    }
}
