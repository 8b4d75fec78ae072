//! The whole-bundle check: build the runtime's view of a bundle (the config
//! it will use, every tensor the architecture takes with its shape and
//! dtype, the tokenizer, the chat template, the generation defaults, and
//! every token id against the embedding's rows) without evaluating
//! anything. `mlxcel-compile` runs it on the finished temporary file before
//! renaming it, so that compile accepts only what `run` can run; [`load`]
//! runs the same steps, so an old or hostile bundle gets the same errors.
//!
//! [`load`]: crate::loader::load

use std::path::Path;

use mlxcel_arch::ModelConfig;
use mlxcel_bundle::{Bundle, kinds};
use mlxcel_mlx::Dtype;

use crate::error::{Error, Result};
use crate::loader::{GenerationDefaults, build_parts};

/// Text every tokenizer must encode and decode: letters, digits,
/// punctuation, spaces, accented and CJK characters, an emoji.
pub const SAMPLE_TEXT: &str = "Hello, world! 123 caf\u{e9} \u{4f60}\u{597d} \u{1f600}\n";

/// What a checked bundle holds, for the compiler's report.
#[derive(Clone, Debug)]
pub struct CheckedBundle {
    /// The normalized config the runtime will use.
    pub config: ModelConfig,
    /// One more than the largest token id the tokenizer can produce.
    pub tokenizer_ids: usize,
    /// Whether the compiled tokenizer (not `tokenizer.json`) loaded.
    pub compiled_tokenizer: bool,
    /// Bytes of tensor data.
    pub weight_bytes: u64,
}

/// Opens the bundle at `path` and builds everything [`crate::loader::load`]
/// builds but the backend, without computing on any weight (a few
/// milliseconds plus the tokenizer's load). An error is what `load` would
/// say.
pub fn check_bundle(path: &Path) -> Result<CheckedBundle> {
    let bundle = Bundle::open(path).map_err(|e| Error::Bundle(e.to_string()))?;
    // f32: the dtype no stored float needs a lossy conversion into; nothing
    // is converted anyway (validate-only weights).
    let parts = build_parts(&bundle, Dtype::F32, true)?;
    // `run` encodes the user's text: a tokenizer that loads but cannot
    // encode (an unknown-token fallback missing from its vocabulary, as
    // after a vocabulary of duplicates) fails here rather than at the
    // first prompt.
    let sample = parts.tokenizer.encode(SAMPLE_TEXT, true).and_then(|ids| parts.tokenizer.decode(&ids, false));
    if let Err(e) = sample {
        return Err(Error::BundleTokenizer {
            section: "tokenizer",
            message: format!("cannot encode and decode the sample text {SAMPLE_TEXT:?}: {e}"),
        });
    }
    // A constrained request reads the vocabulary's bytes: a malformed
    // section, or one of another vocabulary, fails here rather than then.
    if bundle.section(kinds::TOKENIZER, kinds::TOKENIZER_TOKEN_BYTES_KEY, "").is_some() {
        parts.tokenizer.vocabulary_bytes(parts.config.vocab_size)?;
    }
    // `run` renders the template on every turn: one that loops until its
    // fuel runs out, or fails on a plain user turn, is refused here rather
    // than at the first message.
    if let Some(template) = &parts.chat_template {
        template.validate(parts.tokenizer.bos_text(), parts.tokenizer.eos_text())?;
    }
    Ok(CheckedBundle {
        tokenizer_ids: parts.tokenizer.vocab_size(),
        compiled_tokenizer: parts.tokenizer.is_compiled(),
        config: parts.config,
        weight_bytes: parts.weight_bytes,
    })
}

/// Checks that every float tensor of the bundle at `path` (weights, norms,
/// the scales and biases of quantized weights) holds only finite numbers,
/// naming the first that does not. A bundle whose weights hold NaN or
/// infinities (a GGUF whose tensor type does not match its bytes) passes
/// every structural check and then generates nothing. It reads the float
/// tensors once and allocates nothing: a forward pass would convert the
/// weights to f32 (four times a bf16 model's size), which a compile of a
/// large model cannot afford. `mlxcel-compile` runs it after
/// [`check_bundle`].
pub fn check_numerics(path: &Path) -> Result<()> {
    let bundle = Bundle::open(path).map_err(|e| Error::Bundle(e.to_string()))?;
    for tensor in bundle.tensors() {
        let bad = non_finite(tensor.dtype(), tensor.data());
        if bad > 0 {
            // A quantized weight's scales are named for the weight.
            let name = tensor.name();
            let owner =
                bundle.tensors().find(|t| t.quantization().is_some_and(|q| q.scales == name || q.biases == Some(name)));
            let tensor = match owner {
                Some(w) => format!("{} (its {name})", w.name()),
                None => name.to_string(),
            };
            return Err(Error::NonFiniteWeights { tensor, count: bad });
        }
    }
    Ok(())
}

/// How many values of a float tensor's bytes are NaN or infinite (0 for
/// other dtypes): an exponent of all ones.
fn non_finite(dtype: mlxcel_bundle::Dtype, data: &[u8]) -> usize {
    use mlxcel_bundle::Dtype as D;
    let count16 = |mask: u16| data.chunks_exact(2).filter(|b| u16::from_le_bytes([b[0], b[1]]) & mask == mask).count();
    match dtype {
        D::F32 => data.chunks_exact(4).filter(|b| !f32::from_le_bytes([b[0], b[1], b[2], b[3]]).is_finite()).count(),
        D::F16 => count16(0x7C00),
        D::Bf16 => count16(0x7F80),
        _ => 0,
    }
}

/// Checks that every token id the bundle can produce has a row in the
/// embedding (`vocab_size` rows): the tokenizer's largest id, the end and
/// start ids of the generation defaults. Without this a prompt holding
/// such a token reads past the embedding table.
pub(crate) fn token_ids_fit(max_id: Option<u32>, defaults: &GenerationDefaults, vocab_size: usize) -> Result<()> {
    let fits = |what: &'static str, id: u32| {
        if (id as usize) < vocab_size {
            Ok(())
        } else {
            Err(Error::TokenIdOutOfRange { what, id: id.into(), vocab_size })
        }
    };
    if let Some(id) = max_id {
        fits("the tokenizer's token id", id)?;
    }
    for &id in &defaults.eos_token_ids {
        fits("eos_token_id", id)?;
    }
    if let Some(id) = defaults.bos_token_id {
        fits("bos_token_id", id)?;
    }
    Ok(())
}
