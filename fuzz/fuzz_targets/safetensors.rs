//! The Hugging Face directory reader: a safetensors header or a sharded
//! model's `model.safetensors.index.json`, beside a valid tiny `config.json`
//! and `tokenizer.json`. The input's first byte picks which file the rest is
//! (even: `model.safetensors`, odd: the index, whose shard names may try to
//! leave the directory).
#![no_main]

mod source_file;

use libfuzzer_sys::fuzz_target;

/// The tiny Llama of the adversarial corpus (tests/adversarial/model.rs), so
/// that its seeds (`make fuzz` writes them) reach the tensor checks.
const CONFIG: &str = r#"{"model_type":"llama","architectures":["LlamaForCausalLM"],"hidden_size":32,
"num_hidden_layers":2,"intermediate_size":64,"num_attention_heads":4,"num_key_value_heads":2,
"vocab_size":272,"max_position_embeddings":256,"rms_norm_eps":1e-5,"tie_word_embeddings":true}"#;
const TOKENIZER: &str = r#"{"version":"1.0","added_tokens":[],"normalizer":null,"pre_tokenizer":null,
"post_processor":null,"decoder":null,"model":{"type":"BPE","vocab":{"a":0,"b":1,"c":2,"d":3,"e":4,
"f":5,"g":6,"h":7},"merges":[]}}"#;

fuzz_target!(|input: &[u8]| {
    let Some((&mode, rest)) = input.split_first() else { return };
    let dir = tempfile::tempdir().expect("temporary directory");
    std::fs::write(dir.path().join("config.json"), CONFIG).expect("config");
    std::fs::write(dir.path().join("tokenizer.json"), TOKENIZER).expect("tokenizer");
    let name = if mode % 2 == 0 { "model.safetensors" } else { "model.safetensors.index.json" };
    std::fs::write(dir.path().join(name), rest).expect("write the input");
    source_file::open_and_read(dir.path());
});
