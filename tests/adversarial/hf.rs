//! Hugging Face directories: `config.json`, `model.safetensors` (written by
//! hand from the safetensors format: an 8-byte header length, a JSON header,
//! the data), `tokenizer.json` and `tokenizer_config.json`; then attacks on
//! each file, on sharded indexes and on the config's values.

use serde_json::{Value, json};

use crate::corpus::model::{self, CHAT_TEMPLATE};
use crate::corpus::{Case, Expect, refuse, refuse_or_run};

/// A safetensors file: header entries and the data they point into.
pub fn safetensors(tensors: &[model::Tensor]) -> (Value, Vec<u8>) {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for t in tensors {
        let start = data.len();
        data.extend(t.bytes());
        header.insert(t.name.clone(), json!({"dtype": "F32", "shape": t.shape, "data_offsets": [start, data.len()]}));
    }
    header.insert("__metadata__".into(), json!({"format": "pt"}));
    (Value::Object(header), data)
}

/// The file's bytes for a header and data.
pub fn st_bytes(header: &Value, data: &[u8]) -> Vec<u8> {
    let mut h = header.to_string().into_bytes();
    h.resize(h.len().div_ceil(8) * 8, b' ');
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend(h);
    out.extend(data);
    out
}

/// The valid tiny directory's files.
pub fn files() -> Vec<(String, Vec<u8>)> {
    let (header, data) = safetensors(&model::tensors());
    vec![
        ("m/config.json".into(), model::hf_config().to_string().into_bytes()),
        ("m/model.safetensors".into(), st_bytes(&header, &data)),
        ("m/tokenizer.json".into(), model::tokenizer_json().to_string().into_bytes()),
        (
            "m/tokenizer_config.json".into(),
            json!({"chat_template": CHAT_TEMPLATE, "eos_token": "<|im_end|>", "bos_token": "<|endoftext|>"})
                .to_string()
                .into_bytes(),
        ),
    ]
}

/// A case over the valid directory with `file` replaced (or removed: `None`).
fn with(name: impl Into<String>, file: &str, bytes: Option<Vec<u8>>, expect: Expect) -> Case {
    let mut c = Case::compile("hf", name, "m", expect);
    c.files = files().into_iter().filter(|(p, _)| p != &format!("m/{file}")).collect();
    if let Some(b) = bytes {
        c.files.push((format!("m/{file}"), b));
    }
    c
}

/// Every Hugging Face directory case.
pub fn cases() -> Vec<Case> {
    let mut c = vec![with("valid", "none", None, Expect::Succeed)];
    config_values(&mut c);
    safetensors_attacks(&mut c);
    index_attacks(&mut c);
    tokenizer_attacks(&mut c);
    c
}

fn config_with(key: &str, v: Value) -> Vec<u8> {
    let mut cfg = model::hf_config();
    if v.is_null() {
        cfg.as_object_mut().expect("object").remove(key);
    } else {
        cfg[key] = v;
    }
    cfg.to_string().into_bytes()
}

fn config_values(c: &mut Vec<Case>) {
    for key in model::SIZE_KEYS.into_iter().filter(|k| *k != "head_dim") {
        for (tag, v) in [
            ("string", json!("32")),
            ("negative", json!(-1)),
            ("float", json!(32.5)),
            ("zero", json!(0)),
            ("huge", json!(1u64 << 40)),
            ("bool", json!(true)),
            ("array", json!([32])),
        ] {
            c.push(with(format!("config-{key}-{tag}"), "config.json", Some(config_with(key, v)), refuse(key)));
        }
        if key != "num_key_value_heads" && key != "max_position_embeddings" {
            c.push(with(
                format!("config-{key}-missing"),
                "config.json",
                Some(config_with(key, Value::Null)),
                refuse(key),
            ));
        }
    }
    for (tag, v) in
        [("negative", json!(-1e-5)), ("zero", json!(0.0)), ("string", json!("1e-5")), ("huge", json!(1e300))]
    {
        c.push(with(
            format!("config-rms-eps-{tag}"),
            "config.json",
            Some(config_with("rms_norm_eps", v)),
            refuse("rms_norm_eps"),
        ));
    }
    for (tag, v) in
        [("zero", json!(0.0)), ("negative", json!(-10000.0)), ("string", json!("x")), ("huge", json!(1e300))]
    {
        c.push(with(
            format!("config-rope-theta-{tag}"),
            "config.json",
            Some(config_with("rope_theta", v)),
            refuse("rope_theta"),
        ));
    }
    // JSON has no NaN or Infinity, but Python's json.dump writes them: a
    // config from a careless export carries them as bare words.
    for (key, word) in [
        ("rms_norm_eps", "NaN"),
        ("rms_norm_eps", "Infinity"),
        ("rope_theta", "Infinity"),
        ("rope_theta", "NaN"),
        ("rope_theta", "-Infinity"),
    ] {
        let text =
            model::hf_config().to_string().replace(&format!("\"{key}\":"), &format!("\"{key}\":{word},\"x_{key}\":"));
        c.push(with(format!("config-{key}-{word}"), "config.json", Some(text.into_bytes()), refuse(key)));
    }
    for act in ["swish-banana", "", "relu"] {
        c.push(with(
            format!("config-hidden-act-{act}"),
            "config.json",
            Some(config_with("hidden_act", json!(act))),
            refuse("hidden_act"),
        ));
    }
    for (tag, v) in [
        ("factor-0", json!({"rope_type": "linear", "factor": 0.0})),
        ("factor-negative", json!({"rope_type": "linear", "factor": -2.0})),
        ("type-unknown", json!({"rope_type": "spiral", "factor": 2.0})),
        ("not-object", json!("linear")),
        ("llama3-missing", json!({"rope_type": "llama3"})),
    ] {
        c.push(with(
            format!("config-rope-scaling-{tag}"),
            "config.json",
            Some(config_with("rope_scaling", v)),
            refuse("rope_scaling"),
        ));
    }
    for (tag, v, needle) in
        [("model-type-unknown", json!("gpt9"), "gpt9"), ("model-type-number", json!(3), "model_type")]
    {
        // `architectures` still names a known class: using it is honest.
        c.push(with(format!("config-{tag}"), "config.json", Some(config_with("model_type", v)), refuse_or_run(needle)));
    }
    c.push(with("config-head-dim-wrong", "config.json", Some(config_with("head_dim", json!(7))), refuse("head_dim")));
    c.push(with("config-head-dim-zero", "config.json", Some(config_with("head_dim", json!(0))), refuse("head_dim")));
    c.push(with(
        "config-partial-rotary-0",
        "config.json",
        Some(config_with("partial_rotary_factor", json!(0.0))),
        // Llama does not read it (Hugging Face's LlamaConfig has no such
        // key): the model compiles and runs as if it were absent.
        Expect::Succeed,
    ));
    c.push(with(
        "config-sliding-window-0",
        "config.json",
        Some(config_with("sliding_window", json!(0))),
        // Llama does not read it (Hugging Face's LlamaConfig has no such
        // key): the model compiles and runs as if it were absent.
        Expect::Succeed,
    ));
    c.push(with(
        "config-tie-string",
        "config.json",
        Some(config_with("tie_word_embeddings", json!("yes"))),
        refuse("tie_word_embeddings"),
    ));
    c.push(with(
        "config-layers-3",
        "config.json",
        Some(config_with("num_hidden_layers", json!(3))),
        refuse("model.layers.2|num_hidden_layers"),
    ));
    c.push(with("config-vocab-larger", "config.json", Some(config_with("vocab_size", json!(300))), refuse("vocab")));
    for (tag, bytes) in [
        ("empty", Vec::new()),
        ("not-json", b"{not json".to_vec()),
        ("array", b"[1,2]".to_vec()),
        ("null", b"null".to_vec()),
        ("invalid-utf8", b"{\"model_type\": \"\xff\xfe\"}".to_vec()),
        ("deep-nesting", format!("{}{}", "[".repeat(100_000), "]".repeat(100_000)).into_bytes()),
    ] {
        c.push(with(format!("config-file-{tag}"), "config.json", Some(bytes), refuse("config.json")));
    }
    c.push(with("config-missing", "config.json", None, refuse("config.json")));
    let mut dir_cfg = with("config-is-directory", "config.json", None, refuse("config.json"));
    dir_cfg.dirs.push("m/config.json".into());
    c.push(dir_cfg);
}

fn safetensors_attacks(c: &mut Vec<Case>) {
    let (header, data) = safetensors(&model::tensors());
    let valid = st_bytes(&header, &data);
    let st = |name: String, b: Vec<u8>, needle: &str| with(name, "model.safetensors", Some(b), refuse(needle));
    for len in [u64::MAX, 1 << 40, valid.len() as u64, valid.len() as u64 - 7, 0, 1] {
        let mut b = valid.clone();
        b[..8].copy_from_slice(&len.to_le_bytes());
        c.push(st(format!("st-header-length-{len}"), b, "model.safetensors"));
    }
    let n = valid.len();
    for cut in [0, 4, 8, 9, 50, n / 4, n / 2, n - 1] {
        c.push(st(format!("st-truncated-{cut}"), valid[..cut].to_vec(), "model.safetensors"));
    }
    const Q: &str = "model.layers.0.self_attn.q_proj.weight";
    let q = Q;
    type HeaderEdit<'a> = Box<dyn Fn(&mut Value) + 'a>;
    let edits: Vec<(&str, HeaderEdit)> = vec![
        ("dtype-unknown", Box::new(|h| h[q]["dtype"] = json!("F7"))),
        ("dtype-f16", Box::new(|h| h[q]["dtype"] = json!("F16"))),
        ("dtype-i64", Box::new(|h| h[q]["dtype"] = json!("I64"))),
        ("shape-mismatch", Box::new(|h| h[q]["shape"] = json!([32, 16]))),
        ("shape-transposed-k", Box::new(|h| h["model.layers.0.self_attn.k_proj.weight"]["shape"] = json!([32, 16]))),
        ("shape-overflow", Box::new(|h| h[q]["shape"] = json!([u64::MAX, u64::MAX]))),
        ("shape-negative", Box::new(|h| h[q]["shape"] = json!([-32, 32]))),
        ("shape-string", Box::new(|h| h[q]["shape"] = json!("32x32"))),
        ("offsets-reversed", Box::new(|h| h[q]["data_offsets"] = json!([4096, 0]))),
        ("offsets-past-end", Box::new(|h| h[q]["data_offsets"] = json!([0, 1u64 << 40]))),
        ("offsets-overflow", Box::new(|h| h[q]["data_offsets"] = json!([u64::MAX - 1, u64::MAX]))),
        ("offsets-overlap", Box::new(|h| h[q]["data_offsets"] = json!([0, 4096]))),
        (
            "offsets-missing",
            Box::new(|h| {
                h[q].as_object_mut().expect("entry").remove("data_offsets");
            }),
        ),
        ("entry-not-object", Box::new(|h| h[q] = json!(7))),
        ("metadata-not-strings", Box::new(|h| h["__metadata__"] = json!({"format": 7}))),
    ];
    for (tag, edit) in edits {
        let mut h = header.clone();
        edit(&mut h);
        let needle = match tag {
            "shape-transposed-k" => "k_proj",
            "offsets-overlap" => "offset",
            "metadata-not-strings" => "model.safetensors",
            _ => q,
        };
        c.push(st(format!("st-{tag}"), st_bytes(&h, &data), needle));
    }
    // Well-formed files whose tensor set is wrong.
    type Edit = Box<dyn Fn(&mut Vec<model::Tensor>)>;
    let sets: Vec<(&str, &str, Edit)> = vec![
        ("missing-q", Q, Box::new(|ts| ts.retain(|t| t.name != Q))),
        (
            "missing-embedding",
            "model.embed_tokens.weight",
            Box::new(|ts| ts.retain(|t| t.name != "model.embed_tokens.weight")),
        ),
        ("missing-norm", "model.norm.weight", Box::new(|ts| ts.retain(|t| t.name != "model.norm.weight"))),
        (
            "extra-layer",
            "model.layers.5",
            Box::new(|ts| {
                let mut t = model::tensors().remove(3);
                t.name = t.name.replace("layers.0", "layers.5");
                ts.push(t);
            }),
        ),
        (
            "unknown-tensor",
            "mystery.weight",
            Box::new(|ts| {
                let mut t = model::tensors().remove(1);
                t.name = "mystery.weight".into();
                ts.push(t);
            }),
        ),
        (
            "lm-head-wrong-shape",
            "lm_head.weight",
            Box::new(|ts| {
                ts.push(model::Tensor {
                    name: "lm_head.weight".into(),
                    shape: vec![100, 32],
                    values: vec![0.01; 3200],
                });
            }),
        ),
        ("no-tensors", "tensor", Box::new(|ts| ts.clear())),
    ];
    for (tag, needle, f) in sets {
        let mut ts = model::tensors();
        f(&mut ts);
        let (h, d) = safetensors(&ts);
        c.push(st(format!("st-{tag}"), st_bytes(&h, &d), needle));
    }
    for (tag, text) in [("not-json", "{not json at all"), ("array", "[1,2,3]"), ("invalid-utf8", "{\"\u{fffd}\": 1}")] {
        let mut h = text.as_bytes().to_vec();
        if tag == "invalid-utf8" {
            h = b"{\"\xff\": 1}".to_vec();
        }
        let mut b = (h.len() as u64).to_le_bytes().to_vec();
        b.extend(h);
        c.push(st(format!("st-header-{tag}"), b, "model.safetensors"));
    }
    c.push(st("st-empty".into(), Vec::new(), "model.safetensors"));
    c.push(with("st-missing", "model.safetensors", None, refuse("safetensors")));
}

fn index_attacks(c: &mut Vec<Case>) {
    let (header, data) = safetensors(&model::tensors());
    let shard = st_bytes(&header, &data);
    let names: Vec<String> = model::tensors().into_iter().map(|t| t.name).collect();
    let index = |target: &str| {
        let map: serde_json::Map<String, Value> = names.iter().map(|n| (n.clone(), json!(target))).collect();
        json!({"metadata": {"total_size": data.len()}, "weight_map": map}).to_string().into_bytes()
    };
    let sharded = |name: String, idx: Vec<u8>, needle: &str, expect_ok: bool| {
        let mut c = with(name, "model.safetensors", None, if expect_ok { Expect::Succeed } else { refuse(needle) });
        c.files.push(("m/model.safetensors.index.json".into(), idx));
        c.files.push(("m/model-00001-of-00001.safetensors".into(), shard.clone()));
        c.files.push(("outside.safetensors".into(), shard.clone()));
        c
    };
    c.push(sharded("index-valid".into(), index("model-00001-of-00001.safetensors"), "", true));
    for (i, path) in [
        "../outside.safetensors",
        "../../../../etc/passwd",
        "/etc/passwd",
        "/dev/zero",
        "sub/../../outside.safetensors",
        "",
        ".",
        "model-00001-of-00001.safetensors\0x",
        "missing-shard.safetensors",
    ]
    .into_iter()
    .enumerate()
    {
        let needle = if path.is_empty() || path == "." { "index.json" } else { path.trim_end_matches("\0x") };
        c.push(sharded(format!("index-shard-path-{i}"), index(path), needle, false));
    }
    for (tag, text) in [
        ("not-json", "{"),
        ("no-weight-map", "{\"metadata\": {}}"),
        ("weight-map-array", "{\"weight_map\": [1]}"),
        ("shard-number", "{\"weight_map\": {\"model.norm.weight\": 7}}"),
        ("empty", ""),
    ] {
        c.push(sharded(format!("index-{tag}"), text.as_bytes().to_vec(), "index.json", false));
    }
    let mut partial: serde_json::Map<String, Value> =
        names.iter().map(|n| (n.clone(), json!("model-00001-of-00001.safetensors"))).collect();
    partial.remove("model.norm.weight");
    let idx = json!({"weight_map": partial}).to_string().into_bytes();
    let mut k = sharded("index-missing-tensor".into(), idx, "", false);
    // The shard's own header still lists the tensor: reading it is honest.
    k.expect = refuse_or_run("model.norm.weight");
    c.push(k);
}

fn tokenizer_attacks(c: &mut Vec<Case>) {
    let tj = model::tokenizer_json();
    let tok = |name: String, v: Value, needle: &str| {
        with(name, "tokenizer.json", Some(v.to_string().into_bytes()), refuse(needle))
    };
    for (tag, bytes) in [
        ("empty", Vec::new()),
        ("not-json", b"{\"model\":".to_vec()),
        ("array", b"[]".to_vec()),
        ("binary", vec![0xFF; 64]),
    ] {
        c.push(with(format!("tokenizer-file-{tag}"), "tokenizer.json", Some(bytes), refuse("tokenizer.json")));
    }
    c.push(with("tokenizer-missing", "tokenizer.json", None, refuse("tokenizer")));
    let edit = |f: &dyn Fn(&mut Value)| {
        let mut v = tj.clone();
        f(&mut v);
        v
    };
    for id in [272u64, 5000, 1 << 31, (1 << 32) - 1] {
        c.push(tok(format!("tokenizer-added-id-{id}"), edit(&|v| v["added_tokens"][0]["id"] = json!(id)), "id"));
        c.push(tok(format!("tokenizer-vocab-id-{id}"), edit(&|v| v["model"]["vocab"]["a"] = json!(id)), "id"));
    }
    c.push(tok(
        "tokenizer-vocab-id-negative".into(),
        edit(&|v| v["model"]["vocab"]["a"] = json!(-1)),
        "tokenizer.json",
    ));
    c.push(tok("tokenizer-merges-unknown".into(), edit(&|v| v["model"]["merges"] = json!(["zz qq", "h e"])), "merge"));
    c.push(tok("tokenizer-merges-bad-form".into(), edit(&|v| v["model"]["merges"] = json!(["hello"])), "merge"));
    c.push(tok("tokenizer-model-unknown".into(), edit(&|v| v["model"]["type"] = json!("Telepathy")), "Telepathy"));
    c.push(tok("tokenizer-vocab-empty".into(), edit(&|v| v["model"]["vocab"] = json!({})), "vocab"));
    for (i, pattern) in ["(a+)+$", "(x+x+)+y", "(.*a){25}", "((a|a)*)*b"].into_iter().enumerate() {
        let pre = json!({"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": false});
        // Backtracking shows on some texts only: refusing at compile time and
        // refusing those texts at run time (the bundle family) are both honest.
        let mut k =
            tok(format!("tokenizer-backtracking-regex-{i}"), edit(&|v| v["pre_tokenizer"] = pre.clone()), "regex");
        k.expect = refuse_or_run("regex");
        c.push(k);
    }
    let pre = json!({"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated", "invert": false});
    c.push(tok("tokenizer-regex-invalid".into(), edit(&|v| v["pre_tokenizer"] = pre.clone()), "regex"));
    for (i, t) in crate::corpus::gguf::nested_templates().into_iter().enumerate() {
        let cfg = json!({"chat_template": t, "eos_token": "<|im_end|>"}).to_string().into_bytes();
        c.push(with(format!("chat-template-hostile-{i}"), "tokenizer_config.json", Some(cfg), refuse("template")));
    }
    let cfg = json!({"chat_template": "{% if %}", "eos_token": "<|im_end|>"}).to_string().into_bytes();
    c.push(with("chat-template-syntax", "tokenizer_config.json", Some(cfg), refuse("template")));
    let cfg = json!({"chat_template": CHAT_TEMPLATE, "eos_token": "<|never_seen|>"}).to_string().into_bytes();
    // config.json's eos_token_id still names a token: falling back is honest.
    c.push(with("eos-token-unknown", "tokenizer_config.json", Some(cfg), refuse_or_run("<|never_seen|>")));
    c.push(with(
        "tokenizer-config-not-json",
        "tokenizer_config.json",
        Some(b"{".to_vec()),
        refuse("tokenizer_config.json"),
    ));
    let generation = json!({"eos_token_id": 999999, "top_p": 7.0, "temperature": -3.0}).to_string().into_bytes();
    let mut g = with("generation-config-bad", "none", None, refuse("generation_config.json"));
    g.files.push(("m/generation_config.json".into(), generation));
    c.push(g);
}
