//! End to end through a real runtime: each real GGUF, as ingest reads it
//! (names, q/k un-permutation, Gemma's norm offset, the config made from the
//! metadata, the tokenizer.json), written out as a Hugging Face directory and
//! run by mlx-lm, predicts English text as well as a model of its size should.
//! A wrong transform or config key gives a loss several times larger (Gemma
//! with its norms left at `w + 1`: 19 nats).

mod common;

use std::path::Path;

use common::{GEMMA3, SMOLLM2, TempDir, model, run_python};
use mlxcel_compiler::ingest::{FloatDtype, SourceModel, export};
use serde_json::Value;

fn loss_of(gguf: &Path, dtype: FloatDtype) -> Value {
    let m = SourceModel::open(gguf).unwrap();
    let tmp = TempDir::new("e2e");
    let dir = tmp.path().join("hf");
    export::write_hf_directory(&m, &dir, dtype).unwrap();
    let out = tmp.path().join("loss.json");
    run_python("mlx_lm_loss.py", &[&dir, &out]);
    serde_json::from_str(&std::fs::read_to_string(out).unwrap()).unwrap()
}

#[test]
fn smollm2_from_gguf_runs_in_mlx_lm() {
    let r = loss_of(&model(SMOLLM2), FloatDtype::F32);
    let loss = r["loss"].as_f64().unwrap();
    assert!(loss < 2.5, "SmolLM2 loss {loss} nats/token: {r}");
}

#[test]
fn gemma3_from_gguf_runs_in_mlx_lm() {
    let r = loss_of(&model(GEMMA3), FloatDtype::BF16);
    let loss = r["loss"].as_f64().unwrap();
    assert!(loss < 2.5, "Gemma 3 loss {loss} nats/token: {r}");
    // mlx-lm used our tokenizer.json, which adds BOS.
    assert_eq!(r["first_ids"][0], 2);
}
