//! The tokenizer's pipeline (everything but the vocabulary and merges), read
//! from `tokenizer.json` and stored as a small JSON header of the compiled
//! section.
//!
//! Only the components that byte-level BPE (GPT-2, Llama 3, Qwen, SmolLM) and
//! SentencePiece BPE (Llama 2, Gemma, Phi-3) tokenizers use are accepted, with
//! the exact semantics of Hugging Face `tokenizers` 0.23; anything else is
//! [`TokenizerError::Unsupported`] and the bundle keeps only `tokenizer.json`.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::{Result, TokenizerError};
use crate::validate::token_id;

/// Text transformations applied to each piece between added tokens.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Normalizer {
    /// Replaces every occurrence of `pattern` with `content`.
    Replace { pattern: String, content: String },
    /// Prepends `prepend` to a non-empty piece.
    Prepend { prepend: String },
}

/// How a split keeps the matched delimiters (`tokenizers`' `SplitDelimiterBehavior`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Behavior {
    /// Matches are dropped.
    Removed,
    /// Matches are pieces of their own.
    Isolated,
    /// A match joins the piece before it.
    MergedWithPrevious,
    /// A match joins the piece after it.
    MergedWithNext,
    /// Runs of matches and of non-matches are pieces.
    Contiguous,
}

/// What a split looks for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum SplitPattern {
    /// An Oniguruma regex.
    Regex(String),
    /// A literal string.
    Literal(String),
    /// Any numeric character (the `Digits` pre-tokenizer).
    Numeric,
}

/// When Metaspace puts the replacement character in front of a piece.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PrependScheme {
    /// Before every piece.
    Always,
    /// Before the piece at the very start of the input.
    First,
    /// Never.
    Never,
}

/// Splits a piece into smaller ones (and byte-level maps them).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum PreTokenizer {
    /// Splits on a pattern.
    Split { pattern: SplitPattern, behavior: Behavior },
    /// GPT-2's byte-level step: optional prefix space, optional GPT-2 regex
    /// split, then every byte spelled as its printable stand-in.
    ByteLevel { add_prefix_space: bool, use_regex: bool },
    /// SentencePiece's space handling.
    Metaspace { replacement: char, prepend: PrependScheme, split: bool },
}

/// The BPE model's options.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BpeOptions {
    /// The id of the unknown token, if the model has one.
    pub unk: Option<u32>,
    /// Whether consecutive unknown characters become one unknown token.
    pub fuse_unk: bool,
    /// Whether a character missing from the vocabulary becomes `<0xXX>` byte tokens.
    pub byte_fallback: bool,
    /// Whether a whole word found in the vocabulary skips merging.
    pub ignore_merges: bool,
}

/// One step of turning tokens back into text.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Decoder {
    /// Byte-level stand-ins back to bytes, then UTF-8 (lossy).
    ByteLevel,
    /// Replaces `pattern` with `content` in each token.
    Replace { pattern: String, content: String },
    /// Runs of `<0xXX>` tokens become the text of their bytes.
    ByteFallback,
    /// Joins all tokens into one.
    Fuse,
    /// Removes up to `start`/`stop` `content` characters from each token's ends.
    Strip { content: char, start: usize, stop: usize },
    /// `replacement` back to spaces; dropped at the start of the first token
    /// unless `prepend` is [`PrependScheme::Never`].
    Metaspace { replacement: char, prepend: PrependScheme },
}

/// A token matched whole in the input before normalization.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AddedToken {
    /// Its id.
    pub id: u32,
    /// Its text.
    pub content: String,
    /// Whether decoding with `skip_special` drops it.
    pub special: bool,
}

/// Everything but the vocabulary and the merges.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Pipeline {
    /// Applied to each piece between added tokens, in order.
    pub normalizers: Vec<Normalizer>,
    /// Applied after the normalizers, in order.
    pub pre_tokenizers: Vec<PreTokenizer>,
    /// The BPE model's options.
    pub model: BpeOptions,
    /// Ids put before the encoded text when special tokens are added.
    pub prefix: Vec<u32>,
    /// Ids put after it.
    pub suffix: Vec<u32>,
    /// The decoder chain; `None` joins token texts with spaces.
    pub decoders: Option<Vec<Decoder>>,
    /// Tokens matched whole in the raw input.
    pub added: Vec<AddedToken>,
}

fn unsupported(what: impl Into<String>) -> TokenizerError {
    TokenizerError::Unsupported(what.into())
}

fn invalid(what: impl Into<String>) -> TokenizerError {
    TokenizerError::InvalidJson(what.into())
}

fn kind(v: &Value) -> &str {
    v.get("type").and_then(Value::as_str).unwrap_or("")
}

fn flag(v: &Value, key: &str, default: bool) -> bool {
    v.get(key).and_then(Value::as_bool).unwrap_or(default)
}

/// The `String` of a `{"String": ...}` pattern; regex patterns are refused
/// where only literals are supported.
fn literal_pattern(v: &Value, what: &str) -> Result<String> {
    match v.get("pattern") {
        Some(Value::Object(p)) => match (p.get("String"), p.get("Regex")) {
            (Some(Value::String(s)), _) => Ok(s.clone()),
            (_, Some(_)) => Err(unsupported(format!("a regex pattern in {what}"))),
            _ => Err(invalid(format!("{what} has a malformed pattern"))),
        },
        _ => Err(invalid(format!("{what} has no pattern"))),
    }
}

fn single_char(s: &str, what: &str) -> Result<char> {
    let mut chars = s.chars();
    match (chars.next(), chars.next()) {
        (Some(c), None) => Ok(c),
        _ => Err(unsupported(format!("{what} {s:?} (not one character)"))),
    }
}

fn prepend_scheme(v: &Value) -> Result<PrependScheme> {
    match v.get("prepend_scheme").and_then(Value::as_str) {
        Some("always") => Ok(PrependScheme::Always),
        Some("first") => Ok(PrependScheme::First),
        Some("never") => Ok(PrependScheme::Never),
        Some(other) => Err(unsupported(format!("Metaspace prepend_scheme {other:?}"))),
        // Files from before prepend_scheme: add_prefix_space means always.
        None => Ok(if flag(v, "add_prefix_space", true) { PrependScheme::Always } else { PrependScheme::Never }),
    }
}

fn normalizers(v: &Value, out: &mut Vec<Normalizer>) -> Result<()> {
    match kind(v) {
        _ if v.is_null() => {}
        "Sequence" => {
            for n in v.get("normalizers").and_then(Value::as_array).ok_or_else(|| invalid("normalizer Sequence"))? {
                normalizers(n, out)?;
            }
        }
        "Replace" => {
            let pattern = literal_pattern(v, "the Replace normalizer")?;
            let content = v.get("content").and_then(Value::as_str).ok_or_else(|| invalid("Replace without content"))?;
            if pattern.is_empty() {
                return Err(unsupported("a Replace normalizer with an empty pattern"));
            }
            out.push(Normalizer::Replace { pattern, content: content.to_string() });
        }
        "Prepend" => {
            let prepend = v.get("prepend").and_then(Value::as_str).ok_or_else(|| invalid("Prepend without prepend"))?;
            out.push(Normalizer::Prepend { prepend: prepend.to_string() });
        }
        other => return Err(unsupported(format!("the {other:?} normalizer"))),
    }
    Ok(())
}

fn pre_tokenizers(v: &Value, out: &mut Vec<PreTokenizer>) -> Result<()> {
    match kind(v) {
        _ if v.is_null() => {}
        "Sequence" => {
            for p in
                v.get("pretokenizers").and_then(Value::as_array).ok_or_else(|| invalid("pre_tokenizer Sequence"))?
            {
                pre_tokenizers(p, out)?;
            }
        }
        "Split" => {
            if flag(v, "invert", false) {
                return Err(unsupported("an inverted Split"));
            }
            let pattern = match v.get("pattern") {
                Some(Value::Object(p)) => match (p.get("String"), p.get("Regex")) {
                    (Some(Value::String(s)), _) if !s.is_empty() => SplitPattern::Literal(s.clone()),
                    (_, Some(Value::String(r))) => SplitPattern::Regex(r.clone()),
                    _ => return Err(unsupported("a Split with an empty or malformed pattern")),
                },
                _ => return Err(invalid("a Split without a pattern")),
            };
            let behavior = match v.get("behavior").and_then(Value::as_str) {
                Some("Removed") => Behavior::Removed,
                Some("Isolated") => Behavior::Isolated,
                Some("MergedWithPrevious") => Behavior::MergedWithPrevious,
                Some("MergedWithNext") => Behavior::MergedWithNext,
                Some("Contiguous") => Behavior::Contiguous,
                other => return Err(unsupported(format!("Split behavior {other:?}"))),
            };
            out.push(PreTokenizer::Split { pattern, behavior });
        }
        "Digits" => {
            let behavior = if flag(v, "individual_digits", false) { Behavior::Isolated } else { Behavior::Contiguous };
            out.push(PreTokenizer::Split { pattern: SplitPattern::Numeric, behavior });
        }
        "ByteLevel" => out.push(PreTokenizer::ByteLevel {
            add_prefix_space: flag(v, "add_prefix_space", true),
            use_regex: flag(v, "use_regex", true),
        }),
        "Metaspace" => {
            let replacement = v.get("replacement").and_then(Value::as_str).unwrap_or("\u{2581}");
            out.push(PreTokenizer::Metaspace {
                replacement: single_char(replacement, "Metaspace replacement")?,
                prepend: prepend_scheme(v)?,
                split: flag(v, "split", true),
            });
        }
        other => return Err(unsupported(format!("the {other:?} pre-tokenizer"))),
    }
    Ok(())
}

fn decoders(v: &Value, out: &mut Vec<Decoder>) -> Result<()> {
    match kind(v) {
        "Sequence" => {
            for d in v.get("decoders").and_then(Value::as_array).ok_or_else(|| invalid("decoder Sequence"))? {
                decoders(d, out)?;
            }
        }
        "ByteLevel" => out.push(Decoder::ByteLevel),
        "Replace" => {
            let pattern = literal_pattern(v, "the Replace decoder")?;
            let content = v.get("content").and_then(Value::as_str).ok_or_else(|| invalid("Replace without content"))?;
            if pattern.is_empty() {
                return Err(unsupported("a Replace decoder with an empty pattern"));
            }
            out.push(Decoder::Replace { pattern, content: content.to_string() });
        }
        "ByteFallback" => out.push(Decoder::ByteFallback),
        "Fuse" => out.push(Decoder::Fuse),
        "Strip" => {
            let content = v.get("content").and_then(Value::as_str).ok_or_else(|| invalid("Strip without content"))?;
            let count = |key| v.get(key).and_then(Value::as_u64).map(|n| n as usize).ok_or_else(|| invalid("Strip"));
            out.push(Decoder::Strip {
                content: single_char(content, "Strip content")?,
                start: count("start")?,
                stop: count("stop")?,
            });
        }
        "Metaspace" => {
            let replacement = v.get("replacement").and_then(Value::as_str).unwrap_or("\u{2581}");
            out.push(Decoder::Metaspace {
                replacement: single_char(replacement, "Metaspace replacement")?,
                prepend: prepend_scheme(v)?,
            });
        }
        other => return Err(unsupported(format!("the {other:?} decoder"))),
    }
    Ok(())
}

/// Reads a `TemplateProcessing` (or `ByteLevel`, which changes no id)
/// post-processor into the ids it puts around a single sequence.
fn post_processor(v: &Value, prefix: &mut Vec<u32>, suffix: &mut Vec<u32>) -> Result<()> {
    match kind(v) {
        _ if v.is_null() => {}
        "ByteLevel" => {}
        "Sequence" => {
            for p in v.get("processors").and_then(Value::as_array).ok_or_else(|| invalid("processor Sequence"))? {
                post_processor(p, prefix, suffix)?;
            }
        }
        "TemplateProcessing" => {
            if !prefix.is_empty() || !suffix.is_empty() {
                return Err(unsupported("two TemplateProcessing post-processors"));
            }
            let specials = v.get("special_tokens").and_then(Value::as_object);
            let single =
                v.get("single").and_then(Value::as_array).ok_or_else(|| invalid("a template without single"))?;
            let mut seen_sequence = false;
            for item in single {
                if let Some(seq) = item.get("Sequence") {
                    if seq.get("id").and_then(Value::as_str) != Some("A") || seen_sequence {
                        return Err(unsupported("a single template with other sequences than one A"));
                    }
                    seen_sequence = true;
                } else if let Some(tok) = item.get("SpecialToken") {
                    let name =
                        tok.get("id").and_then(Value::as_str).ok_or_else(|| invalid("SpecialToken without id"))?;
                    let ids = specials
                        .and_then(|s| s.get(name))
                        .and_then(|s| s.get("ids"))
                        .and_then(Value::as_array)
                        .ok_or_else(|| invalid(format!("template token {name:?} is not in special_tokens")))?;
                    let target = if seen_sequence { &mut *suffix } else { &mut *prefix };
                    for id in ids {
                        target.push(token_id(id, &|| format!("template token {name:?}"))?);
                    }
                } else {
                    return Err(invalid("a template item that is neither Sequence nor SpecialToken"));
                }
            }
            if !seen_sequence {
                return Err(unsupported("a single template without the sequence"));
            }
        }
        other => return Err(unsupported(format!("the {other:?} post-processor"))),
    }
    Ok(())
}

fn added_tokens(v: &Value) -> Result<Vec<AddedToken>> {
    let Some(list) = v.as_array() else {
        return if v.is_null() { Ok(Vec::new()) } else { Err(invalid("added_tokens is not a list")) };
    };
    list.iter()
        .map(|t| {
            let id = token_id(t.get("id").unwrap_or(&Value::Null), &|| "an added token's id".to_string())?;
            let Some(content) = t.get("content").and_then(Value::as_str) else {
                return Err(invalid("an added token without content"));
            };
            for option in ["single_word", "lstrip", "rstrip", "normalized"] {
                if flag(t, option, false) {
                    return Err(unsupported(format!("added token {content:?} with {option}")));
                }
            }
            if content.is_empty() {
                return Err(unsupported("an empty added token"));
            }
            Ok(AddedToken { id, content: content.to_string(), special: flag(t, "special", false) })
        })
        .collect()
}

/// The vocabulary and merges of a BPE model, as `tokenizer.json` spells them.
pub(crate) struct BpeTables {
    /// Token text and id, in file order.
    pub vocab: Vec<(String, u32)>,
    /// Merge pairs, best first.
    pub merges: Vec<(String, String)>,
    /// The unknown token's text.
    pub unk_token: Option<String>,
}

/// Reads `tokenizer.json` into the pipeline and the BPE tables.
pub(crate) fn read_tokenizer_json(json: &[u8]) -> Result<(Pipeline, BpeTables)> {
    let root: Value = serde_json::from_slice(json).map_err(|e| invalid(e.to_string()))?;
    for key in ["truncation", "padding"] {
        if root.get(key).is_some_and(|v| !v.is_null()) {
            return Err(unsupported(format!("{key} in tokenizer.json")));
        }
    }
    let model = root.get("model").ok_or_else(|| invalid("no model"))?;
    if !matches!(kind(model), "BPE" | "") || model.get("merges").is_none() {
        return Err(unsupported(format!("the {:?} model", kind(model))));
    }
    if model.get("dropout").is_some_and(|d| !d.is_null() && d.as_f64() != Some(0.0)) {
        return Err(unsupported("BPE dropout"));
    }
    for key in ["continuing_subword_prefix", "end_of_word_suffix"] {
        if model.get(key).and_then(Value::as_str).is_some_and(|s| !s.is_empty()) {
            return Err(unsupported(format!("BPE {key}")));
        }
    }
    let vocab_map: &Map<String, Value> =
        model.get("vocab").and_then(Value::as_object).ok_or_else(|| invalid("BPE without vocab"))?;
    // Bounded ids keep the id-indexed table of the section bounded.
    let vocab = vocab_map
        .iter()
        .map(|(t, id)| Ok((t.clone(), token_id(id, &|| format!("model.vocab[{t:?}]"))?)))
        .collect::<Result<Vec<_>>>()?;
    if vocab.is_empty() {
        return Err(invalid("model.vocab is empty"));
    }
    let merges = model
        .get("merges")
        .and_then(Value::as_array)
        .ok_or_else(|| invalid("merges is not a list"))?
        .iter()
        .map(|m| match m {
            Value::String(s) => s
                .split_once(' ')
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .ok_or_else(|| invalid(format!("merge {s:?}"))),
            Value::Array(pair) => match pair.as_slice() {
                [Value::String(a), Value::String(b)] => Ok((a.clone(), b.clone())),
                _ => Err(invalid(format!("merge {m}"))),
            },
            _ => Err(invalid(format!("merge {m}"))),
        })
        .collect::<Result<Vec<_>>>()?;
    let unk_token = model.get("unk_token").and_then(Value::as_str).map(str::to_string);
    let unk = match &unk_token {
        Some(u) => Some(match vocab_map.get(u) {
            Some(id) => token_id(id, &|| format!("unk_token {u:?}"))?,
            None => return Err(invalid(format!("unk_token {u:?} is not in the vocabulary"))),
        }),
        None => None,
    };
    let mut pipeline = Pipeline {
        normalizers: Vec::new(),
        pre_tokenizers: Vec::new(),
        model: BpeOptions {
            unk,
            fuse_unk: flag(model, "fuse_unk", false),
            byte_fallback: flag(model, "byte_fallback", false),
            ignore_merges: flag(model, "ignore_merges", false),
        },
        prefix: Vec::new(),
        suffix: Vec::new(),
        decoders: None,
        added: added_tokens(root.get("added_tokens").unwrap_or(&Value::Null))?,
    };
    normalizers(root.get("normalizer").unwrap_or(&Value::Null), &mut pipeline.normalizers)?;
    pre_tokenizers(root.get("pre_tokenizer").unwrap_or(&Value::Null), &mut pipeline.pre_tokenizers)?;
    post_processor(root.get("post_processor").unwrap_or(&Value::Null), &mut pipeline.prefix, &mut pipeline.suffix)?;
    if let Some(d) = root.get("decoder").filter(|d| !d.is_null()) {
        let mut chain = Vec::new();
        decoders(d, &mut chain)?;
        pipeline.decoders = Some(chain);
    }
    Ok((pipeline, BpeTables { vocab, merges, unk_token }))
}
