//! The GGUF source: a single `.gguf` file with metadata, tokenizer and tensors.

pub mod config;
pub mod quant;
pub mod reader;
pub mod tokenizer;

use std::borrow::Cow;
use std::path::Path;

use serde_json::{Value, json};

use self::quant::{GgmlType, dequantize, dequantize_to_bytes, permute_rows, transcode_affine};
use self::reader::{GgufFile, GgufTensorInfo, GgufValue};
use self::tokenizer::GgufTokenizerInfo;
use super::error::{IngestError, Result};
use super::tensor::{AffineTensor, FloatDtype, FloatTensor, Storage, TensorData, TensorInfo};
use super::{GenerationDefaults, TokenizerAssets};
use mlxcel_arch::{Architecture, ModelConfig};

/// An opened GGUF model.
pub(crate) struct GgufSource {
    pub(crate) file: GgufFile,
    pub(crate) config: ModelConfig,
    /// The metadata spelled as a Hugging Face `config.json`.
    pub(crate) hf_config: Value,
    pub(crate) tensors: Vec<TensorInfo>,
    tok: GgufTokenizerInfo,
}

/// The architecture check that runs on the metadata before anything else.
fn check_architecture(path: &Path, meta: &reader::GgufMetadata<'_>) -> Result<Architecture> {
    let name = meta
        .get("general.architecture")
        .and_then(GgufValue::as_str)
        .ok_or_else(|| IngestError::config(path, "the metadata has no general.architecture"))?;
    Architecture::from_gguf(name).ok_or_else(|| IngestError::UnsupportedArchitecture {
        path: path.to_path_buf(),
        found: name.to_string(),
        supported: Architecture::supported_list(),
    })
}

impl GgufSource {
    pub(crate) fn open(path: &Path) -> Result<GgufSource> {
        let mut arch = None;
        let file = GgufFile::open_checked(path, |meta| {
            arch = Some(check_architecture(path, meta)?);
            Ok(())
        })?;
        let arch = arch.ok_or_else(|| IngestError::config(path, "the metadata has no general.architecture"))?;
        let tok = tokenizer::tokenizer_info(&file)?;
        let (hf_config, config) = config::build_config(&file, arch, &tok)?;
        let mut tensors = Vec::with_capacity(file.tensors.len());
        for t in &file.tensors {
            let name = config::hf_name(arch, &t.name).ok_or_else(|| {
                IngestError::tensor(path, &t.name, t.offset, format!("no Hugging Face name for this {arch} tensor"))
            })?;
            tensors.push(TensorInfo {
                name,
                source_name: t.name.clone(),
                file: path.to_path_buf(),
                shape: t.shape(),
                storage: Storage::Gguf(t.ggml_type),
                offset: t.offset,
                nbytes: t.nbytes,
            });
        }
        Ok(GgufSource { file, config, hf_config, tensors, tok })
    }

    pub(crate) fn tokenizer(&self) -> Result<TokenizerAssets> {
        let tokenizer_json = tokenizer::build_tokenizer_json(&self.file, &self.tok)?;
        let chat_template = self.file.get("tokenizer.chat_template").and_then(GgufValue::as_str).map(str::to_owned);
        let name =
            |id: Option<u32>| id.and_then(|i| self.tok.tokens.get(i as usize)).map(|t| json!(t)).unwrap_or(Value::Null);
        let mut tokenizer_config = json!({
            "add_bos_token": self.tok.add_bos,
            "add_eos_token": self.tok.add_eos,
            "bos_token": name(self.tok.bos),
            "eos_token": name(self.tok.eos),
            "unk_token": name(self.tok.unk),
            "pad_token": name(self.tok.pad),
        });
        if let (Some(t), Some(obj)) = (&chat_template, tokenizer_config.as_object_mut()) {
            obj.insert("chat_template".into(), json!(t));
        }
        Ok(TokenizerAssets { tokenizer_json, chat_template, tokenizer_config })
    }

    pub(crate) fn generation(&self) -> GenerationDefaults {
        GenerationDefaults {
            bos_token_id: self.tok.bos,
            eos_token_ids: self.tok.eog.clone(),
            pad_token_id: self.tok.pad,
            add_bos_token: self.tok.add_bos,
            add_eos_token: self.tok.add_eos,
            generation_config: json!({
                "bos_token_id": self.tok.bos,
                "eos_token_id": self.tok.eog,
                "pad_token_id": self.tok.pad,
            }),
        }
    }

    fn gguf_info(&self, info: &TensorInfo) -> Result<&GgufTensorInfo> {
        self.file.tensor(&info.source_name).ok_or_else(|| IngestError::NoSuchTensor {
            path: self.file.path().to_path_buf(),
            name: info.source_name.clone(),
        })
    }

    /// The raw ggml data of a tensor with llama.cpp's q/k row permutation
    /// undone (a row permutation, so it applies to quantized rows as is).
    fn raw(&self, info: &TensorInfo, g: &GgufTensorInfo) -> Result<Cow<'_, [u8]>> {
        let data = self.file.data(g)?;
        let cfg = &self.config;
        let n_head = if !cfg.architecture.quirks().gguf_permutes_qk {
            None
        } else if info.name.ends_with("self_attn.q_proj.weight") || info.name.ends_with("self_attn.q_proj.bias") {
            Some(cfg.num_attention_heads)
        } else if info.name.ends_with("self_attn.k_proj.weight") || info.name.ends_with("self_attn.k_proj.bias") {
            Some(cfg.num_key_value_heads)
        } else {
            None
        };
        let Some(n_head) = n_head else { return Ok(Cow::Borrowed(data)) };
        let rows = info.shape.first().copied().unwrap_or(0);
        let err = |m: String| IngestError::tensor(self.file.path(), &info.name, g.offset, m);
        if n_head == 0 || rows == 0 || rows % (2 * n_head) != 0 {
            return Err(err(format!("{rows} rows cannot be un-permuted for {n_head} heads")));
        }
        let row_bytes = data.len() / rows;
        let half = rows / n_head / 2;
        // HF row (h, i, j) comes from GGUF row (h, j, i): llama.cpp stored
        // each head's rows as interleaved pairs.
        let perm: Vec<usize> = (0..rows)
            .map(|r| {
                let (h, i, j) = (r / (2 * half), (r / half) % 2, r % half);
                h * 2 * half + 2 * j + i
            })
            .collect();
        permute_rows(data, row_bytes, &perm)
            .map(Cow::Owned)
            .ok_or_else(|| err("the data is not whole rows".to_string()))
    }

    fn norm_offset(&self, info: &TensorInfo) -> bool {
        self.config.architecture.quirks().norm_offset && info.name.ends_with("norm.weight")
    }

    pub(crate) fn load_float(&self, info: &TensorInfo) -> Result<FloatTensor<'_>> {
        let g = self.gguf_info(info)?;
        let raw = self.raw(info, g)?;
        let path = self.file.path();
        let float = match g.ggml_type {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 if !self.norm_offset(info) => {
                let dtype = match g.ggml_type {
                    GgmlType::F32 => FloatDtype::F32,
                    GgmlType::F16 => FloatDtype::F16,
                    _ => FloatDtype::BF16,
                };
                FloatTensor { dtype, shape: info.shape.clone(), data: raw }
            }
            t if self.norm_offset(info) => {
                let mut values = dequantize(t, &raw).ok_or_else(|| {
                    IngestError::tensor(path, &info.name, g.offset, format!("ggml type {t} cannot be dequantized"))
                })?;
                // GGUF stores Gemma's norm weights as w + 1.
                values.iter_mut().for_each(|v| *v -= 1.0);
                FloatTensor::from_f32(info.shape.clone(), &values)
            }
            t => {
                let bytes = dequantize_to_bytes(t, &raw).ok_or_else(|| {
                    IngestError::tensor(path, &info.name, g.offset, format!("ggml type {t} cannot be dequantized"))
                })?;
                FloatTensor { dtype: FloatDtype::F32, shape: info.shape.clone(), data: Cow::Owned(bytes) }
            }
        };
        Ok(float)
    }

    pub(crate) fn float_chunks(&self, info: &TensorInfo, max_chunk_bytes: usize) -> Result<super::FloatChunks<'_>> {
        let g = self.gguf_info(info)?;
        let is_float = matches!(g.ggml_type, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16);
        // Float data is already borrowed from the map, and Gemma's norms are
        // tiny vectors: one block each.
        if is_float || self.norm_offset(info) || info.shape.len() < 2 {
            return Ok(super::FloatChunks::whole(self.load_float(info)?));
        }
        let raw = self.raw(info, g)?;
        Ok(super::FloatChunks::blocks(
            raw,
            g.ggml_type,
            &info.shape,
            max_chunk_bytes,
            self.file.path(),
            &info.name,
            g.offset,
        ))
    }

    pub(crate) fn load(&self, info: &TensorInfo) -> Result<TensorData<'_>> {
        let g = self.gguf_info(info)?;
        // Matrices and stacks of them (a mixture's experts, [experts, out,
        // in]): ggml blocks run along the last axis, as MLX's groups do, so
        // the stack transcodes as one tall matrix.
        if g.ggml_type.affine_bits().is_none() || self.norm_offset(info) || info.shape.len() < 2 {
            return self.load_float(info).map(TensorData::Float);
        }
        let raw = self.raw(info, g)?;
        let mut parts = transcode_affine(g.ggml_type, &raw).ok_or_else(|| {
            IngestError::tensor(self.file.path(), &info.name, g.offset, "the data is not whole blocks")
        })?;
        // Exact f16 scales and biases (the legacy types) are stored as f16:
        // nothing is rounded and the matrix is 1/6 smaller at 4 bits.
        parts.narrow_to_f16();
        let mut gshape = info.shape.clone();
        if let Some(last) = gshape.last_mut() {
            *last /= quant::AFFINE_GROUP;
        }
        Ok(TensorData::Affine(AffineTensor {
            shape: info.shape.clone(),
            bits: parts.bits,
            group_size: quant::AFFINE_GROUP,
            weight: Cow::Owned(parts.weight),
            scales: FloatTensor { dtype: parts.scale_dtype, shape: gshape.clone(), data: Cow::Owned(parts.scales) },
            biases: FloatTensor { dtype: parts.scale_dtype, shape: gshape, data: Cow::Owned(parts.biases) },
        }))
    }
}
