//! Small tokenizers of each supported family, written as `tokenizer.json`
//! here, compiled, and checked against Hugging Face `tokenizers` on the
//! verification corpus; unsupported components and malformed sections.

use mlxcel_tokenizer::{Tokenizer, TokenizerError, compile, verify};
use serde_json::{Value, json};

/// GPT-2's byte stand-ins, in byte order.
fn stand_ins() -> Vec<char> {
    let mut out = Vec::new();
    let mut n = 0;
    for b in 0..=255u32 {
        let printable = (33..=126).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
        out.push(if printable {
            char::from_u32(b).unwrap()
        } else {
            n += 1;
            char::from_u32(255 + n).unwrap()
        });
    }
    out
}

/// A vocabulary of `base` tokens plus every merge's result, and the merges.
fn vocab_and_merges(base: &[String], merges: &[(&str, &str)]) -> (serde_json::Map<String, Value>, Vec<Value>) {
    let mut vocab = serde_json::Map::new();
    for t in base {
        let id = vocab.len();
        vocab.entry(t.clone()).or_insert(json!(id));
    }
    for (a, b) in merges {
        for t in [a.to_string(), b.to_string(), format!("{a}{b}")] {
            let id = vocab.len();
            vocab.entry(t).or_insert(json!(id));
        }
    }
    (vocab, merges.iter().map(|(a, b)| json!([a, b])).collect())
}

fn added(id: usize, content: &str, special: bool) -> Value {
    json!({"id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false,
           "normalized": false, "special": special})
}

/// A byte-level BPE like SmolLM2's: digits split, GPT-2 regex, byte-level.
fn byte_level_json(use_regex_in_byte_level: bool, ignore_merges: bool) -> Vec<u8> {
    let base: Vec<String> = stand_ins().iter().map(|c| c.to_string()).collect();
    let merges = [
        ("Ġ", "t"),
        ("h", "e"),
        ("Ġt", "he"),
        ("i", "n"),
        ("Ġ", "a"),
        ("e", "r"),
        ("o", "n"),
        ("Ġ", "s"),
        ("r", "e"),
        ("Ġthe", "r"),
        ("Ċ", "Ċ"),
        ("Ġ", "Ġ"),
        ("ĠĠ", "ĠĠ"),
        ("a", "n"),
        ("an", "d"),
        ("Ġ", "and"),
        ("l", "l"),
        ("e", "ll"),
        ("h", "ell"),
        ("hell", "o"),
        ("H", "ell"),
        ("Hell", "o"),
        ("ĠH", "ello"),
        ("Ġ", "H"),
        ("æ", "Ĺ"),
        ("æĹ", "¥"),
    ];
    let (mut vocab, merges) = vocab_and_merges(&base, &merges);
    let n = vocab.len();
    vocab.insert("<|endoftext|>".into(), json!(n));
    vocab.insert("<|im_start|>".into(), json!(n + 1));
    vocab.insert("<|im_end|>".into(), json!(n + 2));
    let mut pre = vec![json!({"type": "Digits", "individual_digits": true})];
    if !use_regex_in_byte_level {
        pre.push(json!({"type": "Split", "pattern": {"Regex": mlxcel_tokenizer::GPT2_REGEX},
                        "behavior": "Isolated", "invert": false}));
    }
    pre.push(json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
                    "use_regex": use_regex_in_byte_level}));
    serde_json::to_vec(&json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [added(n, "<|endoftext|>", true), added(n + 1, "<|im_start|>", true),
                         added(n + 2, "<|im_end|>", true)],
        "normalizer": null,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": pre},
        "post_processor": {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<|im_start|>": {"id": "<|im_start|>", "ids": [n + 1], "tokens": ["<|im_start|>"]}}},
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "ignore_merges": ignore_merges, "vocab": vocab, "merges": merges}
    }))
    .unwrap()
}

/// A SentencePiece-style BPE: `▁` for spaces, byte fallback, an unknown token.
fn sentencepiece_json(gemma_style: bool) -> Vec<u8> {
    let mut base: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    base.extend((0..=255).map(|b| format!("<0x{b:02X}>")));
    base.extend("▁abcdefghijklmnopqrstuvwxyzTHE.,!?'日本".chars().map(|c| c.to_string()));
    let merges = [
        ("▁", "t"),
        ("h", "e"),
        ("▁t", "he"),
        ("▁", "a"),
        ("i", "n"),
        ("e", "r"),
        ("▁", "▁"),
        ("▁▁", "▁▁"),
        ("o", "n"),
        ("▁", "s"),
        ("a", "n"),
        ("an", "d"),
        ("▁", "and"),
        ("日", "本"),
        ("T", "H"),
    ];
    let (mut vocab, merges) = vocab_and_merges(&base, &merges);
    let n = vocab.len();
    vocab.insert("<start_of_turn>".into(), json!(n));
    vocab.insert("<end_of_turn>".into(), json!(n + 1));
    vocab.insert("<mask>".into(), json!(n + 2));
    let decoder_tail =
        if gemma_style { vec![] } else { vec![json!({"type": "Strip", "content": " ", "start": 1, "stop": 0})] };
    let mut decoders = vec![
        json!({"type": "Replace", "pattern": {"String": "▁"}, "content": " "}),
        json!({"type": "ByteFallback"}),
        json!({"type": "Fuse"}),
    ];
    decoders.extend(decoder_tail);
    let (normalizer, pre_tokenizer) = if gemma_style {
        (
            json!({"type": "Replace", "pattern": {"String": " "}, "content": "▁"}),
            json!({"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": false}),
        )
    } else {
        (Value::Null, json!({"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": false}))
    };
    serde_json::to_vec(&json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [added(0, "<unk>", true), added(1, "<s>", true), added(2, "</s>", true),
                         added(n, "<start_of_turn>", true), added(n + 1, "<end_of_turn>", true),
                         added(n + 2, "<mask>", false)],
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                       {"SpecialToken": {"id": "</s>", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]},
                               "</s>": {"id": "</s>", "ids": [2], "tokens": ["</s>"]}}},
        "decoder": {"type": "Sequence", "decoders": decoders},
        "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
                  "vocab": vocab, "merges": merges}
    }))
    .unwrap()
}

fn check_against_reference(json: &[u8]) -> Tokenizer {
    let section = verify::compile_checked(json).unwrap_or_else(|e| panic!("{e}"));
    Tokenizer::load(section).unwrap()
}

#[test]
fn byte_level_bpe_matches_tokenizers() {
    for (use_regex, ignore_merges) in [(false, false), (true, false), (false, true)] {
        let t = check_against_reference(&byte_level_json(use_regex, ignore_merges));
        // The merges apply in rank order: " the" is one token; in " Hello"
        // "H"+"ell" (rank 20) wins over "Ġ"+"H" (rank 23), leaving "Ġ", "Hello"
        // — unless merges are ignored for words in the vocabulary ("ĠHello").
        assert_eq!(t.encode(" the", false).unwrap().len(), 1);
        let ids = t.encode(" the Hello", false).unwrap();
        assert_eq!(ids.len(), if ignore_merges { 2 } else { 3 }, "{ids:?}");
        assert_eq!(t.decode(&ids, false).unwrap(), " the Hello");
        // The template adds <|im_start|>; decoding can skip it.
        let with = t.encode("hi", true).unwrap();
        assert_eq!(with[0], t.token_to_id("<|im_start|>").unwrap().unwrap());
        assert_eq!(t.decode(&with, true).unwrap(), "hi");
    }
}

#[test]
fn sentencepiece_bpe_matches_tokenizers() {
    for gemma_style in [true, false] {
        let t = check_against_reference(&sentencepiece_json(gemma_style));
        // A character outside the vocabulary falls back to its UTF-8 bytes.
        let ids = t.encode("é", false).unwrap();
        let bytes: Vec<u32> = ["<0xC3>", "<0xA9>"].iter().map(|b| t.token_to_id(b).unwrap().unwrap()).collect();
        assert!(ids.ends_with(&bytes), "{ids:?}");
        assert_eq!(t.decode(&ids, false).unwrap().trim_start(), "é");
    }
}

#[test]
fn unsupported_components_are_named() {
    let mut json: Value = serde_json::from_slice(&byte_level_json(false, false)).unwrap();
    json["normalizer"] = json!({"type": "NFKC"});
    let err = compile(&serde_json::to_vec(&json).unwrap()).unwrap_err();
    assert!(matches!(&err, TokenizerError::Unsupported(m) if m.contains("NFKC")), "{err}");

    let mut json: Value = serde_json::from_slice(&byte_level_json(false, false)).unwrap();
    json["model"]["type"] = json!("WordPiece");
    let err = compile(&serde_json::to_vec(&json).unwrap()).unwrap_err();
    assert!(err.to_string().contains("WordPiece"), "{err}");

    let mut json: Value = serde_json::from_slice(&byte_level_json(false, false)).unwrap();
    json["added_tokens"][0]["lstrip"] = json!(true);
    let err = compile(&serde_json::to_vec(&json).unwrap()).unwrap_err();
    assert!(err.to_string().contains("lstrip"), "{err}");

    let mut json: Value = serde_json::from_slice(&byte_level_json(false, false)).unwrap();
    json["truncation"] = json!({"max_length": 8});
    assert!(compile(&serde_json::to_vec(&json).unwrap()).unwrap_err().to_string().contains("truncation"));

    let mut json: Value = serde_json::from_slice(&byte_level_json(false, false)).unwrap();
    json["model"]["merges"].as_array_mut().unwrap().push(json!(["zz", "qq"]));
    let err = compile(&serde_json::to_vec(&json).unwrap()).unwrap_err();
    assert!(matches!(&err, TokenizerError::InvalidJson(m) if m.contains("zz")), "{err}");

    assert!(matches!(compile(b"{not json").unwrap_err(), TokenizerError::InvalidJson(_)));
}

#[test]
fn malformed_sections_are_errors_with_offsets() {
    let section = compile(&byte_level_json(false, false)).unwrap();
    // Every truncation is refused at load.
    for len in [0, 3, 4, 8, 12, 40, section.len() / 2, section.len() - 4, section.len() - 1] {
        let err = Tokenizer::load(section[..len].to_vec()).unwrap_err();
        assert!(matches!(err, TokenizerError::Malformed { .. }), "length {len}: {err}");
    }
    let mut bad = section.clone();
    bad[0] = b'X';
    assert!(Tokenizer::load(bad).unwrap_err().to_string().contains("MXTK"));
    let mut newer = section.clone();
    newer[4] = 2;
    assert!(matches!(Tokenizer::load(newer).unwrap_err(), TokenizerError::UnsupportedVersion { found: 2, .. }));
    let mut trailing = section.clone();
    trailing.extend_from_slice(&[0; 4]);
    assert!(Tokenizer::load(trailing).unwrap_err().to_string().contains("after the merge table"));
}

/// Corrupting any byte never panics or reads out of bounds: loading or
/// using the tokenizer either works or returns an error.
#[test]
fn corrupted_sections_never_panic() {
    let section = compile(&sentencepiece_json(false)).unwrap();
    let mut state: u64 = 0x1234_5678_9abc_def1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut loaded = 0;
    for _ in 0..300 {
        let mut bytes = section.clone();
        for _ in 0..1 + next() % 8 {
            let at = (next() % bytes.len() as u64) as usize;
            bytes[at] = next() as u8;
        }
        if let Ok(t) = Tokenizer::load(bytes) {
            loaded += 1;
            for text in ["the and 日本 é", "<s>x</s>", ""] {
                if let Ok(ids) = t.encode(text, true) {
                    let _ = t.decode(&ids, false);
                }
            }
            for id in 0..t.vocab_size() as u32 + 2 {
                let _ = t.id_to_token(id);
            }
        }
    }
    assert!(loaded > 0, "some corruptions (inside the tables) still load");
}
