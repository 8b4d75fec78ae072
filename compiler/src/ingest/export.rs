//! Writes a source model back out as a plain Hugging Face directory of float
//! safetensors. A debugging and interoperability aid: the result loads in
//! transformers or mlx-lm, which makes ingest's names, transforms, config and
//! tokenizer checkable end to end. Streams one tensor at a time.

use std::io::{BufWriter, Write};
use std::path::Path;

use serde_json::{Map, Value, json};

use super::SourceModel;
use super::error::{IngestError, Result};
use super::tensor::FloatDtype;

/// Writes `model` into `out` (created if needed): `model.safetensors` with
/// every tensor as `dtype`, `config.json`, `tokenizer.json`,
/// `tokenizer_config.json` and `generation_config.json`.
pub fn write_hf_directory(model: &SourceModel, out: &Path, dtype: FloatDtype) -> Result<()> {
    fn io(path: &Path) -> impl Fn(std::io::Error) -> IngestError + '_ {
        move |e| IngestError::io(path, e)
    }
    std::fs::create_dir_all(out).map_err(io(out))?;

    // The safetensors header lists every tensor's offsets up front; the data
    // then streams tensor by tensor.
    let mut header = Map::new();
    let mut offset = 0usize;
    for t in model.tensors() {
        let n = t.n_elements() * dtype.size();
        header.insert(
            t.name.clone(),
            json!({"dtype": dtype.name(), "shape": t.shape, "data_offsets": [offset, offset + n]}),
        );
        offset += n;
    }
    let mut text = Value::Object(header).to_string().into_bytes();
    while !text.len().is_multiple_of(8) {
        text.push(b' ');
    }
    let path = out.join("model.safetensors");
    let file = std::fs::File::create(&path).map_err(io(&path))?;
    let mut w = BufWriter::new(file);
    w.write_all(&(text.len() as u64).to_le_bytes()).map_err(io(&path))?;
    w.write_all(&text).map_err(io(&path))?;
    for t in model.tensors() {
        let values = model.load_float(t)?.to_f32();
        let bytes: Vec<u8> = match dtype {
            FloatDtype::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            FloatDtype::F16 => values.iter().flat_map(|v| half::f16::from_f32(*v).to_le_bytes()).collect(),
            FloatDtype::BF16 => values.iter().flat_map(|v| half::bf16::from_f32(*v).to_le_bytes()).collect(),
        };
        w.write_all(&bytes).map_err(io(&path))?;
    }
    w.flush().map_err(io(&path))?;

    let mut config = model.source_config().clone();
    if let Some(c) = config.as_object_mut() {
        let torch = match dtype {
            FloatDtype::F32 => "float32",
            FloatDtype::F16 => "float16",
            FloatDtype::BF16 => "bfloat16",
        };
        c.insert("torch_dtype".into(), json!(torch));
        // As the tensors have it (an lm_head present means untied).
        c.insert("tie_word_embeddings".into(), json!(model.config().tie_word_embeddings));
    }
    let tok = model.tokenizer()?;
    let generation = model.generation()?;
    let pretty = |v: &Value| serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string());
    for (name, text) in [
        ("config.json", pretty(&config)),
        ("tokenizer.json", tok.tokenizer_json),
        ("tokenizer_config.json", pretty(&tok.tokenizer_config)),
        ("generation_config.json", pretty(&generation.generation_config)),
    ] {
        let p = out.join(name);
        std::fs::write(&p, text).map_err(io(&p))?;
    }
    Ok(())
}
