//! Hash-valid hostile bundles: the tiny Llama written by this corpus's own
//! writer ([`crate::corpus::bundle_writer`]) with one part made hostile
//! (config, architecture, tokenizer sections, chat template, generation
//! defaults, tensor table, extensions), then given to `mlxcel run`.

use serde_json::{Value, json};

use crate::corpus::bundle_writer::{Bundle, SectionEntry, TensorEntry};
use crate::corpus::gguf::nested_templates;
use crate::corpus::model::{self, CHAT_TEMPLATE, EOS, HIDDEN};
use crate::corpus::{Case, Expect, Tool, refuse, refuse_or_run};

/// The valid tiny bundle.
pub fn tiny() -> Bundle {
    let tensors = model::tensors()
        .iter()
        .map(|t| TensorEntry {
            name: t.name.clone(),
            dtype: "f32".into(),
            shape: t.shape.iter().map(|&d| d as u64).collect(),
            data: t.bytes(),
            layout: "row-major".into(),
            quantization: None,
            length: None,
        })
        .collect();
    Bundle {
        architecture: "llama".into(),
        name: "tiny-adversarial".into(),
        config_json: model::normalized_config().to_string(),
        chat_template: Some(CHAT_TEMPLATE.into()),
        generation_defaults_json: Some(json!({"eos_token_id": EOS, "bos_token_id": 268}).to_string()),
        tensors,
        sections: vec![tokenizer_section(model::tokenizer_json().to_string().into_bytes())],
        metadata: vec![],
        extensions: vec![],
        major: 1,
        manifest_patch: None,
    }
}

fn tokenizer_section(data: Vec<u8>) -> SectionEntry {
    SectionEntry { kind: "tokenizer".into(), key: "tokenizer.json".into(), target: String::new(), data }
}

/// `mlxcel run b.mlxb -p PROMPT -n 4` on `b`.
fn run_case(name: impl Into<String>, b: &Bundle, prompt: &str, expect: Expect) -> Case {
    Case::new("bundle", name, Tool::Mlxcel, &["run", "{dir}/b.mlxb", "-p", prompt, "-n", "4"], expect)
        .file("b.mlxb", b.bytes())
}

fn edited(f: impl FnOnce(&mut Bundle)) -> Bundle {
    let mut b = tiny();
    f(&mut b);
    b
}

/// Every hostile bundle case.
pub fn cases() -> Vec<Case> {
    let mut c = vec![run_case("valid", &tiny(), "hello there", Expect::Succeed)];
    config(&mut c);
    tokenizer(&mut c);
    template_and_defaults(&mut c);
    tensor_table(&mut c);
    c
}

fn config(c: &mut Vec<Case>) {
    let with = |key: &str, v: Value| {
        edited(|b| {
            let mut cfg = model::normalized_config();
            if v.is_null() {
                cfg.as_object_mut().expect("object").remove(key);
            } else {
                cfg[key] = v;
            }
            b.config_json = cfg.to_string();
        })
    };
    for key in model::SIZE_KEYS {
        for (tag, v) in [
            ("zero", json!(0)),
            ("negative", json!(-4)),
            ("string", json!("4")),
            ("float", json!(4.5)),
            ("huge", json!(1u64 << 40)),
            ("missing", Value::Null),
        ] {
            c.push(run_case(format!("config-{key}-{tag}"), &with(key, v), "hi", refuse(key)));
        }
    }
    for (key, vals) in [
        ("rms_norm_eps", vec![json!(-1e-5), json!(0.0), json!("x"), json!(1e300)]),
        ("rope_theta", vec![json!(0.0), json!(-1.0), json!(1e300), json!(null)]),
        ("partial_rotary_factor", vec![json!(0.0), json!(1.5), json!(-1.0)]),
        ("query_pre_attn_scalar", vec![json!(0.0), json!(-8.0)]),
        ("hidden_act", vec![json!("swish-banana"), json!(7)]),
        ("layer_types", vec![json!(["full_attention"]), json!(["full_attention", "spiral_attention"]), json!("full")]),
        ("sliding_window", vec![json!(0), json!(-1)]),
        ("rope_scaling", vec![json!({"rope_type": "linear", "factor": 0.0}), json!({"rope_type": "spiral"}), json!(7)]),
        ("mlxcel_config_version", vec![json!(2), json!(0), json!("1")]),
        ("moe", vec![json!({"num_experts": 0}), json!(7)]),
        ("tie_word_embeddings", vec![json!(false), json!("yes")]),
        ("architecture", vec![json!("qwen2"), json!("gpt9")]),
    ] {
        for (i, v) in vals.into_iter().enumerate() {
            let needle = if key == "tie_word_embeddings" && i == 0 { "lm_head" } else { key };
            c.push(run_case(format!("config-{key}-{i}"), &with(key, v), "hi", refuse(needle)));
        }
    }
    c.push(run_case("config-unknown-key", &with("mystery_knob", json!(1)), "hi", refuse("mystery_knob")));
    for (tag, text) in [
        ("empty", ""),
        ("not-json", "{"),
        ("array", "[]"),
        ("deep", &format!("{}{}", "[".repeat(100_000), "]".repeat(100_000))),
    ] {
        let b = edited(|b| b.config_json = text.to_string());
        c.push(run_case(format!("config-text-{tag}"), &b, "hi", refuse("config")));
    }
    for (tag, arch) in [("unknown", "gpt9"), ("empty", ""), ("long", "x".repeat(100_000).as_str())] {
        let b = edited(|b| b.architecture = arch.to_string());
        c.push(run_case(format!("architecture-{tag}"), &b, "hi", refuse("architecture")));
    }
}

fn tokenizer(c: &mut Vec<Case>) {
    let tj = model::tokenizer_json();
    let with_tj = |v: Value| edited(|b| b.sections = vec![tokenizer_section(v.to_string().into_bytes())]);
    let edit = |f: &dyn Fn(&mut Value)| {
        let mut v = tj.clone();
        f(&mut v);
        v
    };
    // An added token (its text is in the prompt) or a vocabulary entry whose
    // id is at or past the embedding's rows: reading its row is out of bounds.
    for id in [272u64, 273, 5000, 1 << 20, 1 << 31, (1 << 32) - 1] {
        let b = with_tj(edit(&|v| v["added_tokens"][0]["id"] = json!(id)));
        c.push(run_case(format!("tokenizer-added-id-{id}"), &b, "<|endoftext|> hi", refuse("id")));
        let b = with_tj(edit(&|v| v["model"]["vocab"]["h"] = json!(id)));
        c.push(run_case(format!("tokenizer-vocab-id-{id}"), &b, "hhh", refuse("id")));
    }
    c.push(run_case(
        "tokenizer-merges-unknown",
        &with_tj(edit(&|v| v["model"]["merges"] = json!(["zz qq"]))),
        "hi",
        refuse("merge"),
    ));
    for (i, pattern) in ["(a+)+$", "(x+x+)+y", "((a|a)*)*b"].into_iter().enumerate() {
        let pre = json!({"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": false});
        let b = with_tj(edit(&|v| v["pre_tokenizer"] = pre.clone()));
        let prompt = format!("{}!", ["a", "x", "a"][i].repeat(40_000));
        c.push(run_case(
            format!("tokenizer-backtracking-regex-{i}"),
            &b,
            &prompt,
            refuse("regex|pre-tokenizer|retry|context"),
        ));
    }
    for (tag, bytes) in [("empty", b"".to_vec()), ("not-json", b"{\"model\"".to_vec()), ("binary", vec![0xFE; 100])] {
        let b = edited(|b| b.sections = vec![tokenizer_section(bytes.clone())]);
        c.push(run_case(format!("tokenizer-section-{tag}"), &b, "hi", refuse("tokenizer")));
    }
    c.push(run_case("tokenizer-section-missing", &edited(|b| b.sections.clear()), "hi", refuse("tokenizer")));
    // The compiled tokenizer section (tokenizer/src/tables.rs), made by the
    // tokenizer crate, then truncated and bit-flipped behind a valid hash.
    let compiled = mlxcel_tokenizer::compile(tj.to_string().as_bytes()).expect("the tiny tokenizer compiles");
    let with_compiled = |bytes: Vec<u8>| {
        edited(|b| {
            b.sections.push(SectionEntry {
                kind: "tokenizer".into(),
                key: "mlxcel-tokenizer".into(),
                target: String::new(),
                data: bytes,
            });
        })
    };
    c.push(run_case("compiled-tokenizer-valid", &with_compiled(compiled.clone()), "hello there", Expect::Succeed));
    let n = compiled.len();
    for cut in [0, 1, 4, 8, 16, 32, 64, n / 8, n / 4, n / 2, n - 1] {
        c.push(run_case(
            format!("compiled-tokenizer-truncated-{cut}"),
            &with_compiled(compiled[..cut].to_vec()),
            "hello there",
            refuse("tokenizer"),
        ));
    }
    for at in (0..n.min(256)).step_by(4).chain([n / 3, n / 2, 2 * n / 3]) {
        let mut bytes = compiled.clone();
        bytes[at] ^= 0xFF;
        // A flipped byte in a string table can still be a valid tokenizer.
        c.push(run_case(
            format!("compiled-tokenizer-flip-{at}"),
            &with_compiled(bytes),
            "hello there",
            refuse_or_run("tokenizer"),
        ));
    }
    for at in [8usize, 12, 16, 24, 32] {
        let mut bytes = compiled.clone();
        if at + 4 <= n {
            bytes[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        }
        c.push(run_case(
            format!("compiled-tokenizer-max-u32-{at}"),
            &with_compiled(bytes),
            "hello there",
            refuse_or_run("tokenizer"),
        ));
    }
}

fn template_and_defaults(c: &mut Vec<Case>) {
    for (i, t) in nested_templates().into_iter().enumerate() {
        let b = edited(|b| b.chat_template = Some(t.clone()));
        c.push(run_case(format!("chat-template-hostile-{i}"), &b, "hi", refuse("template")));
        let mut v = Case::new(
            "bundle",
            format!("verify-chat-template-hostile-{i}"),
            Tool::Mlxcel,
            &["verify", "{dir}/b.mlxb"],
            refuse("template"),
        );
        v.files.push(("b.mlxb".into(), b.bytes()));
        c.push(v);
    }
    for (i, t) in
        ["{% for %}", "{{ raise_exception('boom') }}", "{{ messages[99999]['content'] }}", "{% include 'other' %}"]
            .into_iter()
            .enumerate()
    {
        let b = edited(|b| b.chat_template = Some(t.to_string()));
        c.push(run_case(format!("chat-template-broken-{i}"), &b, "hi", refuse("template")));
    }
    for (tag, json) in [
        ("top-p-5", r#"{"eos_token_id": 270, "top_p": 5.0}"#),
        ("top-p-negative", r#"{"eos_token_id": 270, "top_p": -1}"#),
        ("top-p-string", r#"{"eos_token_id": 270, "top_p": "high"}"#),
        ("temperature-negative", r#"{"eos_token_id": 270, "temperature": -1}"#),
        ("temperature-huge", r#"{"eos_token_id": 270, "temperature": 1e300}"#),
        ("top-k-negative", r#"{"eos_token_id": 270, "top_k": -5}"#),
        ("eos-out-of-range", r#"{"eos_token_id": 999999}"#),
        ("eos-2-31", r#"{"eos_token_id": 2147483648}"#),
        ("eos-negative", r#"{"eos_token_id": -1}"#),
        ("eos-list-bad", r#"{"eos_token_id": [270, 999999]}"#),
        ("bos-out-of-range", r#"{"eos_token_id": 270, "bos_token_id": 999999}"#),
        ("not-json", "{"),
        ("array", "[1]"),
    ] {
        let key = tag.rsplit_once('-').map_or(tag, |(k, _)| k).split('-').take(2).collect::<Vec<_>>().join("_");
        let needle = match tag {
            "not-json" | "array" => "generation".to_string(),
            t if t.starts_with("eos") => "eos_token_id".into(),
            t if t.starts_with("bos") => "bos_token_id".into(),
            _ => key,
        };
        let b = edited(|b| b.generation_defaults_json = Some(json.to_string()));
        c.push(run_case(format!("defaults-{tag}"), &b, "hi", refuse(&needle)));
    }
    // A key the runtime does not use is passed over, as in Hugging Face's
    // generation_config.json, whatever its value.
    let b =
        edited(|b| b.generation_defaults_json = Some(r#"{"eos_token_id": 270, "max_new_tokens": "many"}"#.to_string()));
    c.push(run_case("defaults-unused-key-string", &b, "hi", Expect::Succeed));
    // Sampling on: the bad stored top_p is used, and the error must say it
    // comes from the bundle, not from a flag the user never passed.
    let b = edited(|b| b.generation_defaults_json = Some(r#"{"eos_token_id": 270, "top_p": 5.0}"#.into()));
    let mut k = run_case("defaults-top-p-5-sampling", &b, "hi", refuse("generation|bundle|defaults"));
    k.args.extend(["--temp".into(), "0.8".into()]);
    c.push(k);
}

fn tensor_table(c: &mut Vec<Case>) {
    let q = "model.layers.0.self_attn.q_proj.weight";
    let emb = "model.embed_tokens.weight";
    let tensor = |name: &str, f: &dyn Fn(&mut TensorEntry)| {
        edited(|b| f(b.tensors.iter_mut().find(|t| t.name == name).expect("known tensor")))
    };
    // Fewer embedding rows than the vocabulary: every id past them reads
    // outside the tensor.
    for rows in [100usize, 1, 271] {
        let b = tensor(emb, &|t| {
            t.shape = vec![rows as u64, HIDDEN as u64];
            t.data.truncate(rows * HIDDEN * 4);
        });
        c.push(run_case(format!("embedding-rows-{rows}"), &b, "the hello there", refuse(emb)));
    }
    type Edit = Box<dyn Fn(&mut TensorEntry)>;
    let cases: Vec<(&str, &str, Edit)> = vec![
        (
            "dtype-f16",
            q,
            Box::new(|t| {
                t.dtype = "f16".into();
                t.shape = vec![32, 64]
            }),
        ),
        (
            "dtype-u8",
            q,
            Box::new(|t| {
                t.dtype = "u8".into();
                t.shape = vec![32, 128]
            }),
        ),
        ("dtype-unknown", q, Box::new(|t| t.dtype = "f99".into())),
        ("dtype-empty", q, Box::new(|t| t.dtype = String::new())),
        ("shape-transposed", "model.layers.0.self_attn.k_proj.weight", Box::new(|t| t.shape.reverse())),
        ("shape-flat", q, Box::new(|t| t.shape = vec![1024])),
        ("shape-3d", q, Box::new(|t| t.shape = vec![2, 16, 32])),
        (
            "shape-too-many-dims",
            q,
            Box::new(|t| {
                t.shape = vec![1; 40];
                t.data.truncate(4)
            }),
        ),
        ("length-lies", q, Box::new(|t| t.length = Some(16))),
        ("layout-unknown", q, Box::new(|t| t.layout = "zigzag-9".into())),
        (
            "quantized-bits-3",
            q,
            Box::new(|t| t.quantization = Some(("affine".into(), 3, 64, "model.norm.weight".into(), None))),
        ),
        (
            "quantized-group-0",
            q,
            Box::new(|t| {
                t.quantization =
                    Some(("affine".into(), 4, 0, "model.norm.weight".into(), Some("model.norm.weight".into())))
            }),
        ),
        (
            "quantized-mode-unknown",
            q,
            Box::new(|t| t.quantization = Some(("sparkle".into(), 4, 32, "model.norm.weight".into(), None))),
        ),
        (
            "quantized-missing-scales",
            q,
            Box::new(|t| t.quantization = Some(("affine".into(), 4, 32, "nope.scales".into(), None))),
        ),
        (
            "norm-wrong-size",
            "model.norm.weight",
            Box::new(|t| {
                t.shape = vec![16];
                t.data.truncate(64)
            }),
        ),
        ("name-empty", q, Box::new(|t| t.name = String::new())),
        ("name-duplicate", q, Box::new(|t| t.name = "model.norm.weight".into())),
    ];
    for (tag, name, f) in cases {
        let needle = match tag {
            "name-duplicate" => "model.norm.weight",
            "quantized-missing-scales" => "nope.scales",
            "name-empty" => "name",
            "shape-transposed" => "k_proj",
            _ => name,
        };
        c.push(run_case(format!("tensor-{tag}"), &tensor(name, &*f), "hi", refuse(needle)));
    }
    for name in [emb, q, "model.norm.weight", "model.layers.1.mlp.down_proj.weight"] {
        let b = edited(|b| b.tensors.retain(|t| t.name != name));
        c.push(run_case(format!("tensor-missing-{name}"), &b, "hi", refuse(name)));
    }
    let b = edited(|b| {
        let mut extra = b.tensors[0].clone();
        extra.name = "model.layers.7.mlp.up_proj.weight".into();
        b.tensors.push(extra);
    });
    c.push(run_case("tensor-extra-layer", &b, "hi", refuse_or_run("model.layers.7")));
    let b = edited(|b| {
        let mut lm = b.tensors.iter().find(|t| t.name == emb).expect("embedding").clone();
        lm.name = "lm_head.weight".into();
        lm.shape = vec![100, HIDDEN as u64];
        lm.data.truncate(100 * HIDDEN * 4);
        b.tensors.push(lm);
    });
    c.push(run_case("tensor-lm-head-short", &b, "hi", refuse("lm_head")));
    let b = edited(|b| b.extensions.push(("acme.must-understand".into(), true, vec![1, 2, 3])));
    c.push(run_case("extension-required-unknown", &b, "hi", refuse("acme.must-understand")));
    let b = edited(|b| b.extensions.push(("acme.optional".into(), false, vec![1, 2, 3])));
    c.push(run_case("extension-optional-unknown", &b, "hello", Expect::Succeed));
    // Invalid archives behind valid hashes (docs/bundle-format.md §5, §6.1
    // offsets): an Option tag of 7, a string length past the manifest, a
    // vector count past it, a relative pointer before its start.
    for (tag, at, bytes) in [
        ("option-tag", 24usize, vec![7u8]),
        ("string-length", 16, 0xFFFF_FF80u32.to_le_bytes().to_vec()),
        ("vec-count", 52, u32::MAX.to_le_bytes().to_vec()),
        ("vec-pointer", 48, i32::MIN.to_le_bytes().to_vec()),
    ] {
        let b = edited(|b| b.manifest_patch = Some((at, bytes.clone())));
        c.push(run_case(format!("manifest-invalid-{tag}"), &b, "hi", refuse("manifest")));
    }
    let b = edited(|b| b.major = 2);
    c.push(run_case("format-major-2", &b, "hi", refuse("version")));
    let b = edited(|b| b.metadata = (0..2000).map(|i| (format!("k{i}"), "v".repeat(100))).collect());
    c.push(run_case("metadata-many", &b, "hello", Expect::Succeed));
}
