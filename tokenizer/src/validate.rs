//! What a `tokenizer.json` must satisfy before a bundle carries it, whatever
//! tokenizes it at run time (this crate's compiled tokenizer, or `tokenizers`
//! for models this crate does not compile): bounded ids, a vocabulary, merges
//! of known tokens, pre-tokenizer regexes that do not backtrack without
//! bound, and a file `tokenizers` itself loads.

use serde_json::Value;

use crate::error::{Result, TokenizerError};
use crate::regex::{SplitRegex, check_probes};

/// The largest `tokenizer.json` accepted: 512 MiB (Gemma 3's, 262,144
/// tokens, is 33 MB).
pub const MAX_JSON_BYTES: usize = 512 << 20;

/// Token ids must be below 2^24 (16,777,216; the largest vocabularies are
/// about 256k). Tables indexed by id (the compiled section's id → text
/// table, 8 bytes an id) are then at most 128 MiB, whatever the file says.
pub const MAX_TOKEN_ID: u32 = 1 << 24;

/// What the checks learnt about a valid `tokenizer.json`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenizerFacts {
    /// The largest id the tokenizer can produce or name: vocabulary, added
    /// tokens and the ids the post-processor adds. A model's embedding needs
    /// more rows than this.
    pub max_token_id: u32,
    /// Entries of the model's vocabulary (added tokens apart).
    pub vocab_entries: usize,
}

fn invalid(what: impl Into<String>) -> TokenizerError {
    TokenizerError::InvalidJson(what.into())
}

/// `v` as a token id below [`MAX_TOKEN_ID`]; `field` names where it is.
pub(crate) fn token_id(v: &Value, field: &dyn Fn() -> String) -> Result<u32> {
    match v.as_u64() {
        Some(id) if id < u64::from(MAX_TOKEN_ID) => Ok(id as u32),
        Some(id) => Err(invalid(format!("{}: id {id} is not below the limit of {MAX_TOKEN_ID}", field()))),
        None => Err(invalid(format!("{}: {v} is not a token id", field()))),
    }
}

/// Checks `tokenizer_json` (see the module), `tokenizers` loading it
/// included; the error names the field.
pub fn validate_json(tokenizer_json: &[u8]) -> Result<TokenizerFacts> {
    let facts = validate_json_fields(tokenizer_json)?;
    // What the runtime does with a bundle whose tokenizer this crate does
    // not compile; its refusal is the file's.
    tokenizers::Tokenizer::from_bytes(tokenizer_json)
        .map_err(|e| invalid(format!("the tokenizers library refuses it: {e}")))?;
    Ok(facts)
}

/// [`validate_json`] but for `tokenizers`' own load (about half a second
/// for a 262k vocabulary): for a caller that loads it next anyway, as
/// [`crate::verify::compile_checked`] does.
pub fn validate_json_fields(tokenizer_json: &[u8]) -> Result<TokenizerFacts> {
    if tokenizer_json.len() > MAX_JSON_BYTES {
        return Err(invalid(format!("{} bytes is more than the limit of {MAX_JSON_BYTES}", tokenizer_json.len())));
    }
    if tokenizer_json.iter().all(u8::is_ascii_whitespace) {
        return Err(invalid("the file is empty"));
    }
    let root: Value = serde_json::from_slice(tokenizer_json).map_err(|e| invalid(format!("not JSON: {e}")))?;
    let model = root.get("model").filter(|m| m.is_object()).ok_or_else(|| invalid("no \"model\" object"))?;
    // `tokenizers` says only "data did not match any variant of untagged
    // enum ModelUntagged" of an unknown model.
    const MODELS: [&str; 4] = ["BPE", "Unigram", "WordLevel", "WordPiece"];
    if let Some(kind) = model.get("type")
        && !kind.as_str().is_some_and(|k| MODELS.contains(&k))
    {
        return Err(invalid(format!("model.type: {kind} is not one of {}", MODELS.join(", "))));
    }
    let (vocab_entries, mut max_id) = vocab_ids(model)?;
    if let Some(added) = root.get("added_tokens").and_then(Value::as_array) {
        for (i, t) in added.iter().enumerate() {
            let id = t.get("id").unwrap_or(&Value::Null);
            max_id = max_id.max(token_id(id, &|| format!("added_tokens[{i}].id"))?);
        }
    }
    if let Some(p) = root.get("post_processor") {
        post_processor_ids(p, &mut |id, field| {
            max_id = max_id.max(token_id(id, &|| format!("post_processor {field}"))?);
            Ok(())
        })?;
    }
    if let Some(p) = root.get("pre_tokenizer") {
        split_regexes(p, &mut |pattern| check_probes(&SplitRegex::new(pattern)?))?;
    }
    Ok(TokenizerFacts { max_token_id: max_id, vocab_entries })
}

/// The model's vocabulary size and largest id; BPE merges must name tokens
/// of the vocabulary (`tokenizers` refuses them otherwise).
fn vocab_ids(model: &Value) -> Result<(usize, u32)> {
    let (entries, max_id) = match model.get("vocab") {
        // BPE, WordPiece, WordLevel: text → id.
        Some(Value::Object(vocab)) => {
            let mut max_id = 0;
            for (text, id) in vocab {
                max_id = max_id.max(token_id(id, &|| format!("model.vocab[{text:?}]"))?);
            }
            (vocab.len(), max_id)
        }
        // Unigram: [text, score] pairs, the index is the id.
        Some(Value::Array(vocab)) => {
            if vocab.len() > MAX_TOKEN_ID as usize {
                return Err(invalid(format!(
                    "model.vocab: {} entries is more than the limit of {MAX_TOKEN_ID}",
                    vocab.len()
                )));
            }
            (vocab.len(), vocab.len().saturating_sub(1) as u32)
        }
        _ => return Err(invalid("model.vocab is missing or not an object or list")),
    };
    if entries == 0 {
        return Err(invalid("model.vocab is empty"));
    }
    if let (Some(Value::Object(vocab)), Some(merges)) = (model.get("vocab"), model.get("merges")) {
        let merges = merges.as_array().ok_or_else(|| invalid("model.merges is not a list"))?;
        for (i, m) in merges.iter().enumerate() {
            let (a, b) = match m {
                Value::String(s) => s.split_once(' ').ok_or_else(|| invalid(format!("model.merges[{i}]: {s:?}")))?,
                Value::Array(pair) => match pair.as_slice() {
                    [Value::String(a), Value::String(b)] => (a.as_str(), b.as_str()),
                    _ => return Err(invalid(format!("model.merges[{i}]: {m}"))),
                },
                _ => return Err(invalid(format!("model.merges[{i}]: {m}"))),
            };
            for t in [a.to_string(), b.to_string(), format!("{a}{b}")] {
                if !vocab.contains_key(&t) {
                    return Err(invalid(format!("model.merges[{i}] ({a:?} {b:?}): {t:?} is not in model.vocab")));
                }
            }
        }
    }
    Ok((entries, max_id))
}

/// Calls `f` on every id a post-processor adds (`TemplateProcessing`'s
/// special tokens, Roberta's and Bert's `cls`/`sep`), through sequences.
fn post_processor_ids(p: &Value, f: &mut dyn FnMut(&Value, String) -> Result<()>) -> Result<()> {
    if let Some(list) = p.get("processors").and_then(Value::as_array) {
        for q in list {
            post_processor_ids(q, f)?;
        }
    }
    if let Some(specials) = p.get("special_tokens").and_then(Value::as_object) {
        for (name, t) in specials {
            for id in t.get("ids").and_then(Value::as_array).into_iter().flatten() {
                f(id, format!("special_tokens[{name:?}].ids"))?;
            }
        }
    }
    for key in ["cls", "sep"] {
        if let Some(id) = p.get(key).and_then(Value::as_array).and_then(|pair| pair.get(1)) {
            f(id, key.to_string())?;
        }
    }
    Ok(())
}

/// Calls `f` on the regex of every `Split` pre-tokenizer, through sequences.
fn split_regexes(p: &Value, f: &mut dyn FnMut(&str) -> Result<()>) -> Result<()> {
    if let Some(list) = p.get("pretokenizers").and_then(Value::as_array) {
        for q in list {
            split_regexes(q, f)?;
        }
    }
    if p.get("type").and_then(Value::as_str) == Some("Split")
        && let Some(pattern) = p.get("pattern").and_then(|r| r.get("Regex")).and_then(Value::as_str)
    {
        f(pattern)?;
    }
    Ok(())
}

/// What the runtime needs next to `tokenizers` when it tokenizes with
/// `tokenizer.json` (models this crate does not compile): `tokenizers`
/// panics inside onig on a backtracking regex and does not say which ids
/// its post-processor adds.
#[derive(Debug)]
pub struct JsonGuard {
    /// The `Split` pre-tokenizer regexes, bounded: searching a text with
    /// them first turns what would panic in `tokenizers` into an error.
    pub split_regexes: Vec<SplitRegex>,
    /// The largest id `added_tokens` and the post-processor declare, if
    /// any. `tokenizers` maps an added token whose text is already in the
    /// vocabulary onto that entry and ignores its id; the declared id is
    /// counted anyway, so load refuses what [`validate_json`] (compile)
    /// refuses.
    pub declared_max_id: Option<u32>,
}

/// Reads the [`JsonGuard`] of `tokenizer_json` (only its pre-tokenizer and
/// post-processor are kept while parsing).
pub fn json_guard(tokenizer_json: &[u8]) -> Result<JsonGuard> {
    #[derive(serde::Deserialize)]
    struct Parts {
        #[serde(default)]
        pre_tokenizer: Value,
        #[serde(default)]
        post_processor: Value,
        #[serde(default)]
        added_tokens: Value,
    }
    let parts: Parts = serde_json::from_slice(tokenizer_json).map_err(|e| invalid(format!("not JSON: {e}")))?;
    let mut regexes = Vec::new();
    split_regexes(&parts.pre_tokenizer, &mut |pattern| {
        regexes.push(SplitRegex::new(pattern)?);
        Ok(())
    })?;
    let mut declared_max_id = None;
    for (i, t) in parts.added_tokens.as_array().into_iter().flatten().enumerate() {
        let id = token_id(t.get("id").unwrap_or(&Value::Null), &|| format!("added_tokens[{i}].id"))?;
        declared_max_id = declared_max_id.max(Some(id));
    }
    post_processor_ids(&parts.post_processor, &mut |id, field| {
        let id = token_id(id, &|| format!("post_processor {field}"))?;
        declared_max_id = declared_max_id.max(Some(id));
        Ok(())
    })?;
    Ok(JsonGuard { split_regexes: regexes, declared_max_id })
}
