//! Token ids checked against the embedding's rows as soon as the tokenizer
//! and generation defaults are read: an id past the table would be read out
//! of bounds by the runtime, and an absurd one (2^31) would make the
//! tokenizer compiler allocate a table that large. The finished bundle is
//! checked again by the runtime's loader (`mlxcel_runtime::check`).

use std::path::Path;

use serde_json::Value;

use super::error::{IngestError, Result};

/// The largest id `tokenizer.json` assigns: its model's vocabulary (a map
/// of piece to id, or Unigram's list whose ids are positions) and its added
/// tokens. Ids that are not non-negative integers are refused.
fn largest_id(json: &Value) -> std::result::Result<Option<u64>, String> {
    let mut largest: Option<u64> = None;
    let mut see = |where_: &str, v: &Value| -> std::result::Result<(), String> {
        let id = v.as_u64().ok_or_else(|| format!("{where_}: {v} is not a token id"))?;
        largest = largest.max(Some(id));
        Ok(())
    };
    match json.pointer("/model/vocab") {
        Some(Value::Object(map)) => {
            for (piece, id) in map {
                see(&format!("model.vocab[{piece:?}]"), id)?;
            }
        }
        Some(Value::Array(list)) if !list.is_empty() => see("model.vocab", &Value::from(list.len() - 1))?,
        _ => {}
    }
    if let Some(Value::Array(added)) = json.get("added_tokens") {
        for (i, t) in added.iter().enumerate() {
            see(&format!("added_tokens[{i}].id"), t.get("id").unwrap_or(&Value::Null))?;
        }
    }
    Ok(largest)
}

/// Refuses a `tokenizer.json` (from `file`) that assigns an id of
/// `vocab_size` or more. A text that is not JSON is left to the tokenizer's
/// own parser, which says what is wrong with it.
pub(crate) fn check_tokenizer(file: &Path, tokenizer_json: &str, vocab_size: usize) -> Result<()> {
    let Ok(json) = serde_json::from_str::<Value>(tokenizer_json) else { return Ok(()) };
    let error = |message: String| IngestError::Tokenizer { path: file.to_path_buf(), message };
    match largest_id(&json).map_err(error)? {
        Some(id) if id >= vocab_size as u64 => Err(error(format!(
            "token id {id} is outside the model's vocabulary of {vocab_size} rows (model.embed_tokens)"
        ))),
        _ => Ok(()),
    }
}

/// Refuses generation defaults (from `file`) whose start or end ids have no
/// row in the embedding.
pub(crate) fn check_special_ids(file: &Path, bos: Option<u32>, eos: &[u32], vocab_size: usize) -> Result<()> {
    let named = bos.map(|id| ("bos_token_id", id)).into_iter().chain(eos.iter().map(|&id| ("eos_token_id", id)));
    for (key, id) in named {
        if id as usize >= vocab_size {
            return Err(IngestError::Tokenizer {
                path: file.to_path_buf(),
                message: format!(
                    "{key} {id} is outside the model's vocabulary of {vocab_size} rows (model.embed_tokens)"
                ),
            });
        }
    }
    Ok(())
}
