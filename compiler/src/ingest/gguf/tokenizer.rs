//! Builds a Hugging Face `tokenizer.json` from a GGUF's tokenizer metadata, so
//! that the `tokenizers` library tokenizes as the source model does.
//!
//! Two vocabulary kinds are supported:
//! - `gpt2`: byte-level BPE with merges. The pre-tokenizer is the regex list
//!   llama.cpp uses for `tokenizer.ggml.pre`, each regex a `Split` with
//!   `Isolated` behaviour in order, then byte-level mapping.
//! - `llama` (SentencePiece, with scores): BPE with byte fallback over the
//!   vocabulary, merges recovered from it (ordered best-first by score; for
//!   Gemma by file position, as transformers does), spaces as `▁`.
//!
//! Tokens the file types CONTROL (3), UNKNOWN (2) or USER_DEFINED (4) become
//! added tokens matched whole in the text (llama.cpp's special-token
//! partitioning); CONTROL and UNKNOWN ones are `special`.

use std::collections::{HashMap, HashSet};

use mlxcel_arch::Architecture;
use serde_json::{Value, json};

use super::reader::{GgufFile, GgufValue};
use crate::ingest::error::{IngestError, Result};

const TOKEN_NORMAL: i64 = 1;
const TOKEN_UNKNOWN: i64 = 2;
const TOKEN_CONTROL: i64 = 3;
const TOKEN_USER_DEFINED: i64 = 4;

/// GPT-2's pre-tokenizer regex (without the final `\s+`: llama.cpp keeps the
/// unmatched rest as pieces, which is the same split).
const GPT2_SPLIT: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_SPLIT: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const GPT4O_SPLIT: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);

/// The llama.cpp regex list of a byte-level `tokenizer.ggml.pre`, and whether
/// it ignores merges for whole-word vocabulary hits (Llama 3).
fn pre_tokenizer_splits(pre: &str) -> Option<(Vec<&'static str>, bool)> {
    Some(match pre {
        "gpt2" | "gpt-2" | "mpt" | "olmo" | "jais" | "trillion" => (vec![GPT2_SPLIT], false),
        "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva" => {
            (vec![r"\p{N}", GPT2_SPLIT], false)
        }
        "llama3" | "llama-v3" | "llama-bpe" => (vec![LLAMA3_SPLIT], true),
        "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0" | "lfm2" | "dbrx" | "smaug-bpe" => (vec![LLAMA3_SPLIT], false),
        "qwen2" | "deepseek-r1-qwen" | "stablelm2" | "megrez" => (vec![QWEN2_SPLIT], false),
        "gpt-4o" | "llama4" => (vec![GPT4O_SPLIT], false),
        _ => return None,
    })
}

const SUPPORTED_PRE: &str = "gpt2, mpt, olmo, jais, smollm, starcoder, refact, command-r, codeshell, exaone, minerva, \
     llama3, llama-v3, llama-bpe, falcon3, falcon-h1, pixtral, midm-2.0, lfm2, dbrx, smaug-bpe, qwen2, \
     deepseek-r1-qwen, stablelm2, megrez, gpt-4o, llama4";

pub use mlxcel_tokenizer::bytes_to_unicode;

/// What the GGUF says about its tokenizer, beyond the vocabulary.
#[derive(Clone, Debug, Default)]
pub struct GgufTokenizerInfo {
    /// `tokenizer.ggml.bos_token_id`.
    pub bos: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos: Option<u32>,
    /// `tokenizer.ggml.unknown_token_id`.
    pub unk: Option<u32>,
    /// `tokenizer.ggml.padding_token_id`.
    pub pad: Option<u32>,
    /// Whether encoding adds BOS (`tokenizer.ggml.add_bos_token`; llama.cpp's
    /// default: true for SentencePiece vocabularies, false otherwise).
    pub add_bos: bool,
    /// Whether encoding adds EOS.
    pub add_eos: bool,
    /// End-of-generation tokens: EOS, EOT, and the control tokens llama.cpp
    /// treats as end of generation by their text.
    pub eog: Vec<u32>,
    /// The tokens' texts.
    pub tokens: Vec<String>,
}

/// Token texts llama.cpp treats as end-of-generation when they are control tokens.
const EOG_TEXTS: [&str; 9] = [
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<EOT>",
    "_<EOT>",
    "<｜end▁of▁sentence｜>",
    "<|return|>",
];

fn strings(file: &GgufFile, key: &str) -> Result<Option<Vec<String>>> {
    match file.get(key) {
        None => Ok(None),
        Some(GgufValue::Array(a)) => a
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| IngestError::tokenizer(file.path(), format!("{key} holds a non-string")))
            })
            .collect::<Result<Vec<_>>>()
            .map(Some),
        Some(_) => Err(IngestError::tokenizer(file.path(), format!("{key} is not an array"))),
    }
}

fn numbers<T>(file: &GgufFile, key: &str, conv: impl Fn(&GgufValue) -> Option<T>) -> Result<Option<Vec<T>>> {
    match file.get(key) {
        None => Ok(None),
        Some(GgufValue::Array(a)) => a
            .iter()
            .map(|v| {
                conv(v).ok_or_else(|| {
                    IngestError::tokenizer(file.path(), format!("{key} holds a value of the wrong type"))
                })
            })
            .collect::<Result<Vec<_>>>()
            .map(Some),
        Some(_) => Err(IngestError::tokenizer(file.path(), format!("{key} is not an array"))),
    }
}

/// The tokenizer facts of a GGUF, without building the tokenizer.
pub fn tokenizer_info(file: &GgufFile) -> Result<GgufTokenizerInfo> {
    let path = file.path();
    // A file without a vocabulary still opens (its weights are readable);
    // building its tokenizer is what fails.
    let Some(tokens) = strings(file, "tokenizer.ggml.tokens")? else {
        return Ok(GgufTokenizerInfo::default());
    };
    let model = file.get("tokenizer.ggml.model").and_then(GgufValue::as_str).unwrap_or("");
    let id = |key: &str| -> Result<Option<u32>> {
        match file.get(key) {
            None => Ok(None),
            Some(v) => match v.as_u64().and_then(|i| u32::try_from(i).ok()) {
                Some(i) if (i as usize) < tokens.len() => Ok(Some(i)),
                // llama.cpp writes -1 (as u32 max) for "none".
                Some(u32::MAX) => Ok(None),
                _ => {
                    Err(IngestError::tokenizer(path, format!("{key} = {v:?} is not a token id below {}", tokens.len())))
                }
            },
        }
    };
    let flag = |key: &str, default: bool| file.get(key).and_then(GgufValue::as_bool).unwrap_or(default);
    let types = numbers(file, "tokenizer.ggml.token_type", GgufValue::as_i64)?;
    let mut info = GgufTokenizerInfo {
        bos: id("tokenizer.ggml.bos_token_id")?,
        eos: id("tokenizer.ggml.eos_token_id")?,
        unk: id("tokenizer.ggml.unknown_token_id")?,
        pad: id("tokenizer.ggml.padding_token_id")?,
        add_bos: flag("tokenizer.ggml.add_bos_token", model == "llama"),
        add_eos: flag("tokenizer.ggml.add_eos_token", false),
        eog: Vec::new(),
        tokens: Vec::new(),
    };
    info.eog.extend(info.eos);
    if let Some(eot) = id("tokenizer.ggml.eot_token_id")? {
        info.eog.push(eot);
    }
    if let Some(types) = &types {
        for (i, (t, ty)) in tokens.iter().zip(types).enumerate() {
            if *ty == TOKEN_CONTROL && EOG_TEXTS.contains(&t.as_str()) && !info.eog.contains(&(i as u32)) {
                info.eog.push(i as u32);
            }
        }
    }
    info.tokens = tokens;
    Ok(info)
}

fn added_token(id: usize, content: &str, special: bool) -> Value {
    json!({
        "id": id,
        "content": content,
        "single_word": false,
        "lstrip": false,
        "rstrip": false,
        "normalized": false,
        "special": special,
    })
}

fn post_processor(info: &GgufTokenizerInfo) -> Value {
    let special = |id: Option<u32>| id.and_then(|i| info.tokens.get(i as usize).map(|t| (i, t.clone())));
    let bos = special(info.bos).filter(|_| info.add_bos);
    let eos = special(info.eos).filter(|_| info.add_eos);
    let seq = |name: &str, type_id: u32| json!({"Sequence": {"id": name, "type_id": type_id}});
    let tok = |t: &(u32, String), type_id: u32| json!({"SpecialToken": {"id": t.1, "type_id": type_id}});
    let mut single = Vec::new();
    let mut pair = Vec::new();
    if let Some(b) = &bos {
        single.push(tok(b, 0));
        pair.push(tok(b, 0));
    }
    single.push(seq("A", 0));
    pair.push(seq("A", 0));
    if let Some(e) = &eos {
        single.push(tok(e, 0));
        pair.push(tok(e, 0));
    }
    if let Some(b) = &bos {
        pair.push(tok(b, 1));
    }
    pair.push(seq("B", 1));
    if let Some(e) = &eos {
        pair.push(tok(e, 1));
    }
    let mut specials = serde_json::Map::new();
    for t in [&bos, &eos].into_iter().flatten() {
        specials.insert(t.1.clone(), json!({"id": t.1, "ids": [t.0], "tokens": [t.1]}));
    }
    json!({"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": specials})
}

/// Builds the `tokenizer.json` text for the GGUF's tokenizer.
pub fn build_tokenizer_json(file: &GgufFile, info: &GgufTokenizerInfo) -> Result<String> {
    let path = file.path();
    if info.tokens.is_empty() {
        return Err(IngestError::tokenizer(path, "the file has no tokenizer.ggml.tokens"));
    }
    let model = file.get("tokenizer.ggml.model").and_then(GgufValue::as_str).unwrap_or("");
    let arch = file.get("general.architecture").and_then(GgufValue::as_str).unwrap_or("");
    let types = numbers(file, "tokenizer.ggml.token_type", GgufValue::as_i64)?
        .unwrap_or_else(|| vec![TOKEN_NORMAL; info.tokens.len()]);
    if types.len() != info.tokens.len() {
        return Err(IngestError::tokenizer(
            path,
            format!("{} token types for {} tokens", types.len(), info.tokens.len()),
        ));
    }
    let json = match model {
        "gpt2" => byte_level(file, info, &types)?,
        "llama" => sentencepiece(file, info, &types, Architecture::from_gguf(arch) == Some(Architecture::Gemma3))?,
        other => {
            return Err(IngestError::tokenizer(
                path,
                format!("tokenizer.ggml.model {other:?} is not supported (gpt2 and llama are)"),
            ));
        }
    };
    serde_json::to_string(&json).map_err(|e| IngestError::tokenizer(path, e.to_string()))
}

fn vocab_id(vocab: &serde_json::Map<String, Value>, token: &str, fallback: usize) -> usize {
    vocab.get(token).and_then(Value::as_u64).map_or(fallback, |v| v as usize)
}

fn byte_level(file: &GgufFile, info: &GgufTokenizerInfo, types: &[i64]) -> Result<Value> {
    let path = file.path();
    let pre = file.get("tokenizer.ggml.pre").and_then(GgufValue::as_str).unwrap_or("gpt2");
    let (splits, ignore_merges) = pre_tokenizer_splits(pre).ok_or_else(|| {
        IngestError::tokenizer(path, format!("tokenizer.ggml.pre {pre:?} is not supported; supported: {SUPPORTED_PRE}"))
    })?;
    let table = bytes_to_unicode();
    let alphabet: HashSet<char> = table.iter().copied().collect();
    let spelled: Vec<String> = info
        .tokens
        .iter()
        .map(|t| {
            if t.chars().all(|c| alphabet.contains(&c)) {
                t.clone()
            } else {
                t.bytes().map(|b| table[b as usize]).collect()
            }
        })
        .collect();
    let mut vocab = serde_json::Map::with_capacity(spelled.len());
    for (i, t) in spelled.iter().enumerate() {
        vocab.insert(t.clone(), json!(i));
    }
    let merges: Vec<Value> = strings(file, "tokenizer.ggml.merges")?
        .ok_or_else(|| IngestError::tokenizer(path, "a gpt2 vocabulary without tokenizer.ggml.merges"))?
        .iter()
        .map(|m| {
            m.split_once(' ')
                .map(|(a, b)| json!([a, b]))
                .ok_or_else(|| IngestError::tokenizer(path, format!("merge {m:?} is not two tokens")))
        })
        .collect::<Result<_>>()?;
    let mut added = Vec::new();
    for (i, (t, &ty)) in info.tokens.iter().zip(types).enumerate() {
        let in_alphabet = t.chars().all(|c| alphabet.contains(&c));
        match ty {
            // A control token outside the byte alphabet is a llama.cpp mislabel
            // (transformers skips it too).
            TOKEN_CONTROL | TOKEN_UNKNOWN if in_alphabet => added.push(added_token(i, t, true)),
            TOKEN_USER_DEFINED if vocab.contains_key(t) => added.push(added_token(vocab_id(&vocab, t, i), t, false)),
            _ => {}
        }
    }
    let mut pretokenizers: Vec<Value> = splits
        .iter()
        .map(|r| json!({"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated", "invert": false}))
        .collect();
    pretokenizers
        .push(json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}));
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": pretokenizers},
        "post_processor": post_processor(info),
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE",
            "dropout": null,
            "unk_token": null,
            "continuing_subword_prefix": null,
            "end_of_word_suffix": null,
            "fuse_unk": false,
            "byte_fallback": false,
            "ignore_merges": ignore_merges,
            "vocab": vocab,
            "merges": merges,
        },
    }))
}

/// Recovers BPE merges from a SentencePiece vocabulary (transformers'
/// `generate_merges`): every split of a token into two vocabulary tokens is a
/// merge, ranked by the merged token's score (best first), then by longer
/// left piece; equal keys keep vocabulary order.
fn generate_merges(vocab: &HashMap<&str, usize>, order: &[(&str, f64)]) -> Vec<(String, String, f64)> {
    let mut merges: Vec<(String, String, f64)> = Vec::new();
    for &(merge, score) in order {
        let mut local: Vec<(&str, &str)> = Vec::new();
        for (index, _) in merge.char_indices().skip(1) {
            let (l, r) = merge.split_at(index);
            if vocab.contains_key(l) && vocab.contains_key(r) {
                local.push((l, r));
            }
        }
        local.sort_by_key(|(l, r)| (vocab[l], vocab[r]));
        merges.extend(local.into_iter().map(|(l, r)| (l.to_string(), r.to_string(), score)));
    }
    // Python's `sorted(..., reverse=True)` is stable: a stable sort on the
    // descending key.
    merges.sort_by(|a, b| {
        b.2.partial_cmp(&a.2)
            .unwrap_or(std::cmp::Ordering::Equal)
            .then_with(|| b.0.chars().count().cmp(&a.0.chars().count()))
            .then_with(|| b.1.chars().count().cmp(&a.1.chars().count()))
    });
    merges
}

fn sentencepiece(file: &GgufFile, info: &GgufTokenizerInfo, types: &[i64], gemma: bool) -> Result<Value> {
    let path = file.path();
    // Gemma files store whitespace-run tokens with real spaces; its
    // normalizer turns spaces into `▁`, so they are respelled.
    let spelled: Vec<String> = info
        .tokens
        .iter()
        .map(|t| {
            if gemma && t.contains(' ') && t.trim().is_empty() {
                "\u{2581}".repeat(t.chars().count())
            } else {
                t.clone()
            }
        })
        .collect();
    // A dict from token to id: a later duplicate wins, as in Python.
    let mut vocab: HashMap<&str, usize> = HashMap::with_capacity(spelled.len());
    for (i, t) in spelled.iter().enumerate() {
        vocab.insert(t.as_str(), i);
    }
    let scores: Vec<f64> = if gemma {
        // Gemma's scores do not follow its merge order; its file order does.
        (0..spelled.len()).map(|i| -(i as f64)).collect()
    } else {
        numbers(file, "tokenizer.ggml.scores", GgufValue::as_f64)?
            .ok_or_else(|| IngestError::tokenizer(path, "a llama vocabulary without tokenizer.ggml.scores"))?
    };
    if scores.len() != spelled.len() {
        return Err(IngestError::tokenizer(path, format!("{} scores for {} tokens", scores.len(), spelled.len())));
    }
    // Python iterates the score dict in first-insertion order, with the last
    // value written for a duplicate key.
    let mut order: Vec<(&str, f64)> = Vec::with_capacity(spelled.len());
    let mut slot: HashMap<&str, usize> = HashMap::with_capacity(spelled.len());
    for (t, &s) in spelled.iter().zip(&scores) {
        match slot.get(t.as_str()) {
            Some(&k) => order[k].1 = s,
            None => {
                slot.insert(t.as_str(), order.len());
                order.push((t.as_str(), s));
            }
        }
    }
    let merges: Vec<Value> = generate_merges(&vocab, &order).into_iter().map(|(l, r, _)| json!([l, r])).collect();
    let mut vocab_json = serde_json::Map::with_capacity(vocab.len());
    for (i, t) in spelled.iter().enumerate() {
        if vocab.get(t.as_str()) == Some(&i) {
            vocab_json.insert(t.clone(), json!(i));
        }
    }
    // Added tokens keep the file's spelling; transformers adds a user-defined
    // token only when that spelling is in the (respelled) vocabulary, which
    // the whitespace runs no longer are.
    let mut added = Vec::new();
    for (i, (t, &ty)) in info.tokens.iter().zip(types).enumerate() {
        match ty {
            TOKEN_CONTROL | TOKEN_UNKNOWN => {
                added.push(added_token(vocab.get(t.as_str()).copied().unwrap_or(i), t, true))
            }
            TOKEN_USER_DEFINED if vocab.contains_key(t.as_str()) => {
                added.push(added_token(vocab[t.as_str()], t, false))
            }
            _ => {}
        }
    }
    let unk = info.unk.and_then(|u| spelled.get(u as usize)).cloned().unwrap_or_else(|| "<unk>".to_string());
    let add_space_prefix = file.get("tokenizer.ggml.add_space_prefix").and_then(GgufValue::as_bool).unwrap_or(!gemma);
    let (normalizer, pre_tokenizer, decoder) = if gemma {
        (
            json!({"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"}),
            json!({"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": false}),
            json!({"type": "Sequence", "decoders": [
                {"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "},
                {"type": "ByteFallback"},
                {"type": "Fuse"},
            ]}),
        )
    } else {
        let mut decoders = vec![
            json!({"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "}),
            json!({"type": "ByteFallback"}),
            json!({"type": "Fuse"}),
        ];
        if add_space_prefix {
            decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
        }
        (
            Value::Null,
            json!({"type": "Metaspace", "replacement": "\u{2581}",
                   "prepend_scheme": if add_space_prefix { "first" } else { "never" }, "split": false}),
            json!({"type": "Sequence", "decoders": decoders}),
        )
    };
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor(info),
        "decoder": decoder,
        "model": {
            "type": "BPE",
            "dropout": null,
            "unk_token": unk,
            "continuing_subword_prefix": null,
            "end_of_word_suffix": null,
            "fuse_unk": true,
            "byte_fallback": true,
            "ignore_merges": false,
            "vocab": vocab_json,
            "merges": merges,
        },
    }))
}
