//! Hostile `tokenizer.json` files: a pre-tokenizer regex that backtracks
//! without bound, ids far past the vocabulary, merges of unknown tokens,
//! empty and non-JSON files. Each is an error naming the pattern or the
//! field, never a panic, a hang or a multi-gigabyte allocation.

use std::time::{Duration, Instant};

use mlxcel_tokenizer::{MAX_TOKEN_ID, Tokenizer, TokenizerError, bytes_to_unicode, compile, validate_json};
use serde_json::{Value, json};

/// A byte-level BPE (every byte's stand-in, two merges, one added token)
/// whose pre-tokenizer splits on `regex`; `edit` changes the JSON first.
fn tokenizer_json(regex: &str, edit: impl FnOnce(&mut Value)) -> Vec<u8> {
    let mut vocab = serde_json::Map::new();
    for c in bytes_to_unicode() {
        let id = vocab.len();
        vocab.insert(c.to_string(), json!(id));
    }
    for t in ["he", "hel"] {
        let id = vocab.len();
        vocab.insert(t.into(), json!(id));
    }
    let n = vocab.len();
    let mut root = json!({
        "version": "1.0",
        "added_tokens": [{"id": n, "content": "<|end|>", "special": true, "single_word": false,
                          "lstrip": false, "rstrip": false, "normalized": false}],
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
        "model": {"type": "BPE", "vocab": vocab, "merges": [["h", "e"], ["he", "l"]]}
    });
    edit(&mut root);
    serde_json::to_vec(&root).unwrap()
}

/// A pattern Oniguruma backtracks on exponentially: nested quantifiers
/// anchored at the end, on a long word followed by a character no `\w` is.
const BACKTRACKING: &str = r"(\w+\s?)*$";

#[test]
fn a_backtracking_regex_is_an_error_not_a_panic() {
    // Compiling does not search; the probes of `validate_json` do.
    let json = tokenizer_json(BACKTRACKING, |_| {});
    let t = Tokenizer::load(compile(&json).unwrap()).unwrap();
    assert_eq!(t.encode("hello", false).unwrap().len(), 3); // hel l o
    let start = Instant::now();
    let text = format!("{}!", "a".repeat(5000));
    match t.encode(&text, false) {
        Err(TokenizerError::RegexLimit { pattern, offset, .. }) => {
            assert_eq!((pattern.as_str(), offset), (BACKTRACKING, 0));
        }
        other => panic!("{other:?}"),
    }
    assert!(start.elapsed() < Duration::from_secs(60), "{:?}", start.elapsed());
    let err = validate_json(&json).unwrap_err().to_string();
    assert!(err.starts_with(&format!("regex {BACKTRACKING:?} gave up searching from byte ")), "{err}");
    assert!(err.contains(": retry-limit-in-match over (backtracking is limited to "), "{err}");
}

/// A change to a tokenizer.json.
type Edit = Box<dyn Fn(&mut Value)>;

#[test]
fn ids_past_the_limit_are_refused_without_allocating() {
    let big = u64::from(MAX_TOKEN_ID) << 7; // 2^31: a 16 GiB id table before the limit.
    let cases: [(&str, Edit, String); 4] = [
        ("vocab", Box::new(move |r| r["model"]["vocab"]["he"] = json!(big)), "model.vocab[\"he\"]".into()),
        ("added", Box::new(move |r| r["added_tokens"][0]["id"] = json!(big)), "an added token's id".into()),
        (
            "template",
            Box::new(move |r| {
                r["post_processor"] = json!({"type": "TemplateProcessing",
                    "single": [{"SpecialToken": {"id": "<|end|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                    "special_tokens": {"<|end|>": {"id": "<|end|>", "ids": [big], "tokens": ["<|end|>"]}}})
            }),
            "template token \"<|end|>\"".into(),
        ),
        ("boundary", Box::new(|r| r["model"]["vocab"]["he"] = json!(MAX_TOKEN_ID)), "model.vocab[\"he\"]".into()),
    ];
    for (what, edit, field) in cases {
        let json = tokenizer_json(r"\s+", |r| edit(r));
        let id = if what == "boundary" { u64::from(MAX_TOKEN_ID) } else { big };
        let want = format!("tokenizer.json: {field}: id {id} is not below the limit of {MAX_TOKEN_ID}");
        assert_eq!(compile(&json).unwrap_err().to_string(), want, "{what}");
    }
    let json = tokenizer_json(r"\s+", |r| r["added_tokens"][0]["id"] = json!(big));
    assert_eq!(
        validate_json(&json).unwrap_err().to_string(),
        format!("tokenizer.json: added_tokens[0].id: id {big} is not below the limit of {MAX_TOKEN_ID}")
    );
}

#[test]
fn malformed_files_are_refused_naming_the_field() {
    let cases: [(Vec<u8>, &str); 5] = [
        (Vec::new(), "tokenizer.json: the file is empty"),
        (b"{\"model\": [1, 2".to_vec(), "tokenizer.json: not JSON: EOF while parsing a list at line 1 column 15"),
        (tokenizer_json(r"\s+", |r| r["model"]["vocab"] = json!({})), "tokenizer.json: model.vocab is empty"),
        (
            tokenizer_json(r"\s+", |r| r["model"]["merges"] = json!([["h", "e"], ["x", "<nope>"]])),
            "tokenizer.json: model.merges[1] (\"x\" \"<nope>\"): \"<nope>\" is not in model.vocab",
        ),
        (
            tokenizer_json(r"\s+", |r| r["model"]["vocab"] = json!("all")),
            "tokenizer.json: model.vocab is missing or not an object or list",
        ),
    ];
    for (json, want) in cases {
        assert_eq!(validate_json(&json).unwrap_err().to_string(), want);
    }
    // A file every check passes, and what it can produce.
    let json = tokenizer_json(r"\s+", |_| {});
    let facts = validate_json(&json).unwrap();
    assert_eq!((facts.max_token_id, facts.vocab_entries), (258, 258));
    let t = Tokenizer::load(compile(&json).unwrap()).unwrap();
    assert_eq!(t.max_token_id(), Some(258));
}

/// `section` with its pipeline JSON replaced by `edit`'s (the layout's
/// length prefix and padding redone; the tables after it unchanged).
fn with_pipeline(section: &[u8], edit: impl FnOnce(&mut Value)) -> Vec<u8> {
    let len = u32::from_le_bytes(section[8..12].try_into().unwrap()) as usize;
    let mut pipeline: Value = serde_json::from_slice(&section[12..12 + len]).unwrap();
    edit(&mut pipeline);
    let json = serde_json::to_vec(&pipeline).unwrap();
    let mut out = section[..8].to_vec();
    out.extend_from_slice(&(json.len() as u32).to_le_bytes());
    out.extend_from_slice(&json);
    out.resize(out.len().next_multiple_of(4), 0);
    out.extend_from_slice(&section[12 + len.next_multiple_of(4)..]);
    out
}

/// A section is input too: an empty added token (which `compile` never
/// writes) indexed its first byte and panicked at load.
#[test]
fn a_section_with_an_empty_added_token_is_malformed() {
    let section = compile(&tokenizer_json(r"\s+", |_| {})).unwrap();
    Tokenizer::load(with_pipeline(&section, |_| {})).unwrap();
    let bad = with_pipeline(&section, |p| p["added"][0]["content"] = json!(""));
    let err = Tokenizer::load(bad).unwrap_err().to_string();
    assert_eq!(err, "compiled tokenizer section: added token 258 is empty (at byte offset 12)");
}
