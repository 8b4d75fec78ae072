//! GGUF files: a valid tiny Llama written from the GGUF specification
//! (version 3: header, key/value metadata, tensor infos, 32-byte aligned
//! data), then structural attacks on its bytes and semantic attacks on its
//! metadata and tensors.

use crate::corpus::model::{self, CHAT_TEMPLATE, CONTEXT, EOS, HIDDEN, Tensor};
use crate::corpus::{Case, Expect, refuse, refuse_or_run};

/// A GGUF metadata value.
#[derive(Clone, Debug)]
pub enum Val {
    /// Type 4.
    U32(u32),
    /// Type 5.
    I32(i32),
    /// Type 6.
    F32(f32),
    /// Type 7.
    Bool(bool),
    /// Type 8.
    Str(String),
    /// Type 9: element type and elements.
    Arr(u32, Vec<Val>),
    /// Type 10.
    U64(u64),
    /// Type 12.
    F64(f64),
}

impl Val {
    /// Appends the value's bytes and returns its GGUF type id.
    fn write(&self, out: &mut Vec<u8>) -> u32 {
        let (id, bytes): (u32, Vec<u8>) = match self {
            Val::U32(v) => (4, v.to_le_bytes().into()),
            Val::I32(v) => (5, v.to_le_bytes().into()),
            Val::F32(v) => (6, v.to_le_bytes().into()),
            Val::Bool(v) => (7, vec![*v as u8]),
            Val::Str(s) => {
                put_str(out, s);
                return 8;
            }
            Val::Arr(ty, items) => {
                out.extend(ty.to_le_bytes());
                out.extend((items.len() as u64).to_le_bytes());
                for i in items {
                    i.write(out); // elements carry no type id of their own
                }
                return 9;
            }
            Val::U64(v) => (10, v.to_le_bytes().into()),
            Val::F64(v) => (12, v.to_le_bytes().into()),
        };
        out.extend(bytes);
        id
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

/// One tensor info and its data.
#[derive(Clone, Debug)]
pub struct GTensor {
    /// GGUF name (`blk.0.attn_q.weight`).
    pub name: String,
    /// ggml dims, innermost first.
    pub dims: Vec<u64>,
    /// ggml type id (0 = F32).
    pub ty: u32,
    /// Bytes.
    pub data: Vec<u8>,
    /// Offset override (relative to the data section), else packed.
    pub offset: Option<u64>,
}

/// A GGUF file before it is written.
#[derive(Clone, Debug)]
pub struct Gguf {
    /// Format version.
    pub version: u32,
    /// Metadata, in order.
    pub kv: Vec<(String, Val)>,
    /// Tensors, in order.
    pub tensors: Vec<GTensor>,
    /// Tensor count override (absurd counts).
    pub n_tensors: Option<u64>,
    /// Metadata count override.
    pub n_kv: Option<u64>,
}

fn gguf_name(hf: &str) -> String {
    let map = [
        ("input_layernorm", "attn_norm"),
        ("post_attention_layernorm", "ffn_norm"),
        ("self_attn.q_proj", "attn_q"),
        ("self_attn.k_proj", "attn_k"),
        ("self_attn.v_proj", "attn_v"),
        ("self_attn.o_proj", "attn_output"),
        ("mlp.gate_proj", "ffn_gate"),
        ("mlp.up_proj", "ffn_up"),
        ("mlp.down_proj", "ffn_down"),
    ];
    match hf {
        "model.embed_tokens.weight" => "token_embd.weight".into(),
        "model.norm.weight" => "output_norm.weight".into(),
        _ => {
            let rest = hf.strip_prefix("model.layers.").expect("a layer tensor");
            let (layer, leaf) = rest.split_once('.').expect("layer.leaf");
            let base = leaf.strip_suffix(".weight").expect("a weight");
            let g = map.iter().find(|(h, _)| *h == base).expect("mapped").1;
            format!("blk.{layer}.{g}.weight")
        }
    }
}

fn to_gguf(t: &Tensor) -> GTensor {
    GTensor {
        name: gguf_name(&t.name),
        dims: t.shape.iter().rev().map(|&d| d as u64).collect(),
        ty: 0,
        data: t.bytes(),
        offset: None,
    }
}

impl Gguf {
    /// The valid tiny Llama.
    pub fn tiny() -> Gguf {
        let strs = |v: Vec<String>| Val::Arr(8, v.into_iter().map(Val::Str).collect());
        let tokens = model::tokens();
        let types = (0..tokens.len()).map(|i| Val::I32(if i >= 268 { 3 } else { 1 })).collect();
        let kv = vec![
            ("general.architecture".into(), Val::Str("llama".into())),
            ("general.name".into(), Val::Str("tiny-adversarial".into())),
            ("general.alignment".into(), Val::U32(32)),
            ("llama.context_length".into(), Val::U32(CONTEXT as u32)),
            ("llama.embedding_length".into(), Val::U32(HIDDEN as u32)),
            ("llama.block_count".into(), Val::U32(model::LAYERS as u32)),
            ("llama.feed_forward_length".into(), Val::U32(model::INTERMEDIATE as u32)),
            ("llama.attention.head_count".into(), Val::U32(model::HEADS as u32)),
            ("llama.attention.head_count_kv".into(), Val::U32(model::KV_HEADS as u32)),
            ("llama.attention.layer_norm_rms_epsilon".into(), Val::F32(1e-5)),
            ("llama.rope.freq_base".into(), Val::F32(10000.0)),
            ("llama.rope.dimension_count".into(), Val::U32(model::HEAD_DIM as u32)),
            ("tokenizer.ggml.model".into(), Val::Str("gpt2".into())),
            ("tokenizer.ggml.pre".into(), Val::Str("gpt2".into())),
            ("tokenizer.ggml.tokens".into(), strs(tokens)),
            ("tokenizer.ggml.token_type".into(), Val::Arr(5, types)),
            ("tokenizer.ggml.merges".into(), strs(model::merges())),
            ("tokenizer.ggml.bos_token_id".into(), Val::U32(268)),
            ("tokenizer.ggml.eos_token_id".into(), Val::U32(EOS)),
            ("tokenizer.chat_template".into(), Val::Str(CHAT_TEMPLATE.into())),
        ];
        let tensors = model::tensors().iter().map(to_gguf).collect();
        Gguf { version: 3, kv, tensors, n_tensors: None, n_kv: None }
    }

    /// Replaces (or adds) a metadata value.
    pub fn set(mut self, key: &str, v: Val) -> Gguf {
        match self.kv.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = v,
            None => self.kv.push((key.into(), v)),
        }
        self
    }

    /// Removes a metadata key.
    pub fn without(mut self, key: &str) -> Gguf {
        self.kv.retain(|(k, _)| k != key);
        self
    }

    /// Applies `f` to the named tensor.
    pub fn tensor(mut self, name: &str, f: impl FnOnce(&mut GTensor)) -> Gguf {
        f(self.tensors.iter_mut().find(|t| t.name == name).expect("known tensor"));
        self
    }

    /// The file's bytes.
    pub fn bytes(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(self.version.to_le_bytes());
        out.extend(self.n_tensors.unwrap_or(self.tensors.len() as u64).to_le_bytes());
        out.extend(self.n_kv.unwrap_or(self.kv.len() as u64).to_le_bytes());
        for (k, v) in &self.kv {
            put_str(&mut out, k);
            let mut value = Vec::new();
            out.extend(v.write(&mut value).to_le_bytes());
            out.extend(value);
        }
        let mut offset = 0u64;
        let mut placed = Vec::new();
        for t in &self.tensors {
            put_str(&mut out, &t.name);
            out.extend((t.dims.len() as u32).to_le_bytes());
            t.dims.iter().for_each(|d| out.extend(d.to_le_bytes()));
            out.extend(t.ty.to_le_bytes());
            let at = t.offset.unwrap_or(offset);
            out.extend(at.to_le_bytes());
            placed.push(offset);
            offset = (offset + t.data.len() as u64).div_ceil(32) * 32;
        }
        out.resize(out.len().div_ceil(32) * 32, 0);
        let start = out.len();
        for (t, at) in self.tensors.iter().zip(placed) {
            out.resize(start + at as usize, 0);
            out.extend(&t.data);
        }
        out
    }
}

fn case(name: impl Into<String>, bytes: Vec<u8>, expect: Expect) -> Case {
    Case::compile("gguf", name, "model.gguf", expect).file("model.gguf", bytes)
}

/// Every GGUF case.
pub fn cases() -> Vec<Case> {
    let base = Gguf::tiny();
    let valid = base.bytes();
    let mut c = vec![case("valid", valid.clone(), Expect::Succeed)];
    structural(&base, &valid, &mut c);
    metadata(&base, &mut c);
    tokenizer(&base, &mut c);
    tensors(&base, &mut c);
    c
}

fn structural(base: &Gguf, valid: &[u8], c: &mut Vec<Case>) {
    // Truncations at every region boundary and in between: header, metadata,
    // tensor infos, data.
    let n = valid.len();
    let mut cuts: Vec<usize> = vec![0, 1, 3, 4, 7, 8, 12, 16, 20, 23, 24, 30, 40, 64, 100, 200, 500, 1000, 2000];
    cuts.extend((1..=40).map(|i| n * i / 41));
    cuts.extend([n - 1, n - 4, n - 32]);
    cuts.sort();
    cuts.dedup();
    for cut in cuts {
        c.push(case(format!("truncated-at-{cut}"), valid[..cut].to_vec(), refuse("model.gguf")));
    }
    for (name, magic) in [("bad-magic", b"GGUX"), ("lowercase-magic", b"gguf"), ("zero-magic", b"\0\0\0\0")] {
        let mut b = valid.to_vec();
        b[..4].copy_from_slice(magic);
        c.push(case(name, b, refuse("model.gguf")));
    }
    for v in [0u32, 1, 4, 99, u32::MAX] {
        let g = Gguf { version: v, ..base.clone() };
        c.push(case(format!("version-{v}"), g.bytes(), refuse("version")));
    }
    for n in [u64::MAX, 1 << 40, 1 << 31, 10_000_000, base.tensors.len() as u64 + 1] {
        let g = Gguf { n_tensors: Some(n), ..base.clone() };
        c.push(case(format!("tensor-count-{n}"), g.bytes(), refuse("tensor")));
        let g = Gguf { n_kv: Some(n), ..base.clone() };
        c.push(case(format!("kv-count-{n}"), g.bytes(), refuse("model.gguf")));
    }
    // A string length or array count far past the end of the file.
    for (i, huge) in [u64::MAX, 1 << 62, 1 << 33, 0xFFFF_FFFF].into_iter().enumerate() {
        let mut b = valid.to_vec();
        b[24..32].copy_from_slice(&huge.to_le_bytes()); // first key's length
        c.push(case(format!("key-length-huge-{i}"), b, refuse("model.gguf")));
        let g = base.clone().set("general.name", Val::Str(String::new()));
        let mut b = g.bytes();
        let at = find(&b, b"general.name").expect("key") + 12 + 4;
        b[at..at + 8].copy_from_slice(&huge.to_le_bytes());
        c.push(case(format!("string-length-huge-{i}"), b, refuse("model.gguf")));
        let mut b = valid.to_vec();
        let at = find(&b, b"tokenizer.ggml.tokens").expect("key") + 21 + 4 + 4;
        b[at..at + 8].copy_from_slice(&huge.to_le_bytes());
        c.push(case(format!("array-count-huge-{i}"), b, refuse("tokenizer.ggml.tokens")));
    }
    for ty in [13u32, 99, u32::MAX] {
        let mut b = valid.to_vec();
        let at = find(&b, b"general.name").expect("key") + 12;
        b[at..at + 4].copy_from_slice(&ty.to_le_bytes());
        c.push(case(format!("value-type-{ty}"), b, refuse("model.gguf")));
    }
    for (i, nested) in [9u32, 13].into_iter().enumerate() {
        let mut b = valid.to_vec();
        let at = find(&b, b"tokenizer.ggml.merges").expect("key") + 21 + 4;
        b[at..at + 4].copy_from_slice(&nested.to_le_bytes());
        c.push(case(format!("array-element-type-{i}"), b, refuse("model.gguf")));
    }
    let mut b = valid.to_vec();
    let at = find(&b, b"general.name").expect("key") + 12 + 4 + 8;
    b[at] = 0xFF;
    c.push(case("invalid-utf8-string", b, refuse("model.gguf")));
    for align in [0u32, 3, 1 << 31] {
        let g = base.clone().set("general.alignment", Val::U32(align));
        c.push(case(format!("alignment-{align}"), g.bytes(), refuse("alignment")));
    }
    let mut dup = base.clone();
    dup.kv.push(("general.name".into(), Val::Str("again".into())));
    c.push(case("duplicate-key", dup.bytes(), refuse("general.name")));
    let mut dup = base.clone();
    let first = dup.tensors[0].clone();
    dup.tensors.push(first);
    c.push(case("duplicate-tensor", dup.bytes(), refuse("token_embd.weight")));
    c.push(case("empty-file", Vec::new(), refuse("model.gguf")));
    c.push(case("text-file", b"this is not a model\n".to_vec(), refuse("model.gguf")));
    let mut noisy = valid.to_vec();
    noisy.extend(std::iter::repeat_n(0xAB, 4096));
    c.push(case("trailing-garbage", noisy, Expect::Succeed));
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn metadata(base: &Gguf, c: &mut Vec<Case>) {
    let m = |k: &str, v: Val| base.clone().set(k, v);
    let keyed: Vec<(&str, &str, Val, &str)> = vec![
        ("context-length-0", "llama.context_length", Val::U32(0), "context_length"),
        ("block-count-0", "llama.block_count", Val::U32(0), "block_count"),
        ("block-count-3", "llama.block_count", Val::U32(3), "blk.2|model.layers.2|block_count"),
        ("block-count-huge", "llama.block_count", Val::U64(1 << 40), "block_count"),
        ("embedding-0", "llama.embedding_length", Val::U32(0), "embedding_length"),
        ("embedding-wrong", "llama.embedding_length", Val::U32(48), "token_embd|embed_tokens|embedding_length"),
        ("heads-0", "llama.attention.head_count", Val::U32(0), "head_count"),
        ("heads-3", "llama.attention.head_count", Val::U32(3), "head_count"),
        ("kv-heads-0", "llama.attention.head_count_kv", Val::U32(0), "head_count_kv"),
        ("kv-heads-3", "llama.attention.head_count_kv", Val::U32(3), "head_count_kv"),
        ("ffn-0", "llama.feed_forward_length", Val::U32(0), "feed_forward_length"),
        ("ffn-wrong", "llama.feed_forward_length", Val::U32(65), "ffn"),
        ("rope-dim-0", "llama.rope.dimension_count", Val::U32(0), "dimension_count|head_dim|key_length"),
        ("rope-dim-odd", "llama.rope.dimension_count", Val::U32(7), "dimension_count|rope"),
        ("eps-nan", "llama.attention.layer_norm_rms_epsilon", Val::F32(f32::NAN), "epsilon"),
        ("eps-negative", "llama.attention.layer_norm_rms_epsilon", Val::F32(-1e-5), "epsilon"),
        ("eps-zero", "llama.attention.layer_norm_rms_epsilon", Val::F32(0.0), "epsilon"),
        ("eps-inf", "llama.attention.layer_norm_rms_epsilon", Val::F32(f32::INFINITY), "epsilon"),
        ("eps-string", "llama.attention.layer_norm_rms_epsilon", Val::Str("1e-5".into()), "epsilon"),
        ("rope-base-0", "llama.rope.freq_base", Val::F32(0.0), "freq_base"),
        ("rope-base-negative", "llama.rope.freq_base", Val::F32(-10000.0), "freq_base"),
        ("rope-base-inf", "llama.rope.freq_base", Val::F32(f32::INFINITY), "freq_base"),
        ("rope-base-nan", "llama.rope.freq_base", Val::F32(f32::NAN), "freq_base"),
        ("eps-f64-nan", "llama.attention.layer_norm_rms_epsilon", Val::F64(f64::NAN), "epsilon"),
        ("rope-base-f64-huge", "llama.rope.freq_base", Val::F64(1e300), "freq_base"),
        ("context-length-bool", "llama.context_length", Val::Bool(true), "context_length"),
        ("context-length-string", "llama.context_length", Val::Str("256".into()), "context_length"),
        ("context-length-negative", "llama.context_length", Val::I32(-1), "context_length"),
        ("context-length-float", "llama.context_length", Val::F32(256.5), "context_length"),
        ("vocab-size-wrong", "llama.vocab_size", Val::U32(300), "vocab"),
        ("vocab-size-0", "llama.vocab_size", Val::U32(0), "vocab"),
        ("architecture-unknown", "general.architecture", Val::Str("gpt9".into()), "gpt9"),
        ("architecture-empty", "general.architecture", Val::Str(String::new()), "architecture"),
        ("architecture-number", "general.architecture", Val::U32(7), "general.architecture"),
    ];
    for (name, key, v, needle) in keyed {
        c.push(case(name, m(key, v).bytes(), refuse(needle)));
    }
    // Llama does not read a window (llama.cpp's Llama has none): the model
    // compiles and runs as if it were absent.
    c.push(case("sliding-window-0", m("llama.attention.sliding_window", Val::U32(0)).bytes(), Expect::Succeed));
    for key in [
        "general.architecture",
        "llama.embedding_length",
        "llama.block_count",
        "llama.attention.head_count",
        "llama.attention.layer_norm_rms_epsilon",
        "llama.feed_forward_length",
    ] {
        c.push(case(format!("missing-{key}"), base.clone().without(key).bytes(), refuse(key)));
    }
}

fn tokenizer(base: &Gguf, c: &mut Vec<Case>) {
    let strs = |v: Vec<String>| Val::Arr(8, v.into_iter().map(Val::Str).collect());
    let m = |k: &str, v: Val| base.clone().set(k, v);
    let mut tokens = model::tokens();
    let dup = vec!["a".to_string(); tokens.len()];
    c.push(case("vocab-all-duplicates", m("tokenizer.ggml.tokens", strs(dup)).bytes(), refuse("token")));
    c.push(case("vocab-empty", m("tokenizer.ggml.tokens", Val::Arr(8, vec![])).bytes(), refuse("tokenizer")));
    tokens.truncate(100);
    c.push(case("vocab-short", m("tokenizer.ggml.tokens", strs(tokens)).bytes(), refuse("token")));
    let mut long = model::tokens();
    long.extend((0..100).map(|i| format!("<extra_{i}>")));
    c.push(case("vocab-longer-than-embedding", m("tokenizer.ggml.tokens", strs(long)).bytes(), refuse("vocab")));
    let bad_merges = vec!["zz qq".to_string(), "h e".into()];
    c.push(case("merges-unknown-tokens", m("tokenizer.ggml.merges", strs(bad_merges)).bytes(), refuse("merge")));
    c.push(case("merges-no-space", m("tokenizer.ggml.merges", strs(vec!["he".into()])).bytes(), refuse("merge")));
    c.push(case(
        "merges-wrong-type",
        m("tokenizer.ggml.merges", Val::Arr(4, vec![Val::U32(1)])).bytes(),
        refuse("merges"),
    ));
    c.push(case("tokens-not-array", m("tokenizer.ggml.tokens", Val::Str("a".into())).bytes(), refuse("tokens")));
    c.push(case(
        "token-type-short",
        m("tokenizer.ggml.token_type", Val::Arr(5, vec![Val::I32(1)])).bytes(),
        refuse("token_type|token type"),
    ));
    for (key, needle) in [("tokenizer.ggml.eos_token_id", "eos"), ("tokenizer.ggml.bos_token_id", "bos")] {
        for id in [272u32, 100_000, 1 << 31, u32::MAX] {
            // u32::MAX often stands for "no such token" in GGUF files.
            let expect = if id == u32::MAX { refuse_or_run(needle) } else { refuse(needle) };
            c.push(case(format!("{needle}-id-{id}"), m(key, Val::U32(id)).bytes(), expect));
        }
    }
    c.push(case(
        "tokenizer-model-unknown",
        m("tokenizer.ggml.model", Val::Str("wordpiece-x".into())).bytes(),
        refuse("wordpiece-x"),
    ));
    c.push(case("tokenizer-missing", base.clone().without("tokenizer.ggml.tokens").bytes(), refuse("tokenizer")));
    for (i, pre) in ["(a+)+$", "(?:x+x+)+y", "((a|a)*)*b"].into_iter().enumerate() {
        let g = m("tokenizer.ggml.pre", Val::Str(pre.into()));
        c.push(case(format!("pre-tokenizer-pattern-{i}"), g.bytes(), refuse("pre")));
    }
    for (i, t) in nested_templates().into_iter().enumerate() {
        let g = m("tokenizer.chat_template", Val::Str(t));
        c.push(case(format!("chat-template-hostile-{i}"), g.bytes(), refuse("template")));
    }
    c.push(case(
        "chat-template-syntax",
        m("tokenizer.chat_template", Val::Str("{% for %}".into())).bytes(),
        refuse("template"),
    ));
}

/// Templates that loop far too long (nested loops, recursion), build huge
/// strings or walk huge values: a renderer without fuel hangs or exhausts
/// memory on them.
pub fn nested_templates() -> Vec<String> {
    vec![
        "{% for a in range(100000) %}{% for b in range(100000) %}{% for c in range(100000) %}x{% endfor %}{% endfor %}{% endfor %}".into(),
        "{% for m in messages %}{% for a in range(1000000) %}{% for b in range(1000000) %}{% endfor %}{% endfor %}{% endfor %}".into(),
        "{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}".into(),
        "{% set s = 'x' * 1000000 %}{% for i in range(100000) %}{{ s }}{% endfor %}".into(),
        "{% for i in range(9999999999) %}{% endfor %}".into(),
        // Values that cost little to build and a great deal to walk: a
        // lazily repeated list formatted (the chat_template fuzzer's find),
        // repeats of repeats, and a list that shares itself (2^60 items).
        "{{ 666.0 * 66 * 66.0 * 9.0 * ['\0'] }}".into(),
        "{% set l = ['a'] * 10000 %}{% set m = [l] * 10000 %}{{ [m] * 10000 }}".into(),
        "{% set ns = namespace(a=[1]) %}{% for i in range(60) %}{% set ns.a = [ns.a, ns.a] %}{% endfor %}{{ ns.a ~ '' }}"
            .into(),
    ]
}

fn tensors(base: &Gguf, c: &mut Vec<Case>) {
    // Errors may name a tensor by its GGUF or its Hugging Face name.
    for t in model::tensors() {
        let name = gguf_name(&t.name);
        let mut g = base.clone();
        g.tensors.retain(|x| x.name != name);
        c.push(case(format!("missing-{name}"), g.bytes(), refuse(&format!("{name}|{}", t.name))));
    }
    c.push(case("no-tensors", Gguf { tensors: vec![], ..base.clone() }.bytes(), refuse("tensor")));
    let (q, k) = ("blk.0.attn_q.weight", "blk.0.attn_k.weight");
    let t = |f: fn(&mut GTensor)| base.clone().tensor(q, f).bytes();
    let transposed = base.clone().tensor(k, |t| t.dims.reverse()).bytes();
    c.push(case("shape-transposed", transposed, refuse("attn_k|k_proj")));
    let q = "blk.0.attn_q.weight|model.layers.0.self_attn.q_proj.weight";
    c.push(case("shape-extra-dim", t(|t| t.dims.push(1)), refuse(q)));
    c.push(case("shape-zero", t(|t| t.dims[0] = 0), refuse(q)));
    c.push(case("shape-overflow", t(|t| t.dims = vec![u64::MAX / 2, 4]), refuse(q)));
    c.push(case("shape-huge", t(|t| t.dims = vec![1 << 32, 1 << 20]), refuse(q)));
    c.push(case("shape-too-many-dims", t(|t| t.dims = vec![1; 100]), refuse(q)));
    c.push(case("dtype-unknown", t(|t| t.ty = 200), refuse(q)));
    // A smaller dtype reads a prefix of the bytes: a valid file.
    c.push(case("dtype-f16-but-f32-bytes", t(|t| t.ty = 1), refuse_or_run(q)));
    c.push(case("dtype-q4-0-wrong-size", t(|t| t.ty = 2), refuse_or_run(q)));
    c.push(case(
        "dtype-not-multiple-of-block",
        t(|t| {
            t.ty = 2;
            t.dims = vec![33, 32]
        }),
        refuse(q),
    ));
    c.push(case("offset-past-end", t(|t| t.offset = Some(1 << 40)), refuse(q)));
    c.push(case("offset-overflow", t(|t| t.offset = Some(u64::MAX - 8)), refuse(q)));
    c.push(case("offset-misaligned", t(|t| t.offset = Some(3)), refuse(q)));
    let mut overlap = base.clone();
    overlap.tensors[1].offset = Some(0);
    // GGUF does not forbid tensors sharing bytes.
    c.push(case("offset-overlap", overlap.bytes(), refuse_or_run("offset")));
    let mut extra = base.clone();
    for l in 2..4 {
        let mut more: Vec<GTensor> = base.tensors.iter().filter(|t| t.name.starts_with("blk.0.")).cloned().collect();
        more.iter_mut().for_each(|t| t.name = t.name.replacen("blk.0.", &format!("blk.{l}."), 1));
        extra.tensors.extend(more);
    }
    c.push(case("more-blocks-than-layers", extra.bytes(), refuse("blk.2|model.layers.2")));
    let mut unknown = base.clone();
    let mut odd = base.tensors[0].clone();
    odd.name = "mystery.weight".into();
    unknown.tensors.push(odd);
    c.push(case("unknown-tensor", unknown.bytes(), refuse("mystery.weight")));
    let mut out_w = base.clone();
    let mut lm = base.tensors.iter().find(|t| t.name == "token_embd.weight").expect("embedding").clone();
    lm.name = "output.weight".into();
    lm.dims = vec![HIDDEN as u64, 100];
    lm.data.truncate(HIDDEN * 100 * 4);
    out_w.tensors.push(lm);
    c.push(case("output-rows-differ", out_w.bytes(), refuse("output.weight|lm_head")));
}
