//! Hugging Face and MLX directories: `config.json`, safetensors weights (one
//! file or shards with `model.safetensors.index.json`), `tokenizer.json`,
//! `tokenizer_config.json` and `generation_config.json`. An MLX-quantized
//! directory (mlx-lm's output) is the same with `quantization` in the config
//! and `weight`/`scales`/`biases` per quantized layer, taken as it is.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::{Dtype as StDtype, SafeTensors};
use serde_json::{Value, json};

use mlxcel_arch::{Architecture, ModelConfig};

use super::error::{IngestError, Result};
use super::mmap::map_file;
use super::tensor::{AffineTensor, FloatDtype, FloatTensor, Storage, TensorData, TensorInfo};
use super::{GenerationDefaults, TokenizerAssets};

/// One mapped safetensors file.
struct Shard {
    path: PathBuf,
    map: Mmap,
    /// Where the data section starts (8 + header length).
    data_start: usize,
}

/// Where one named array lives.
#[derive(Clone, Debug)]
struct Entry {
    shard: usize,
    dtype: StDtype,
    shape: Vec<usize>,
    /// Absolute byte range in the shard.
    start: usize,
    end: usize,
}

/// The quantized layers of an MLX directory.
#[derive(Clone, Debug)]
struct Quantized {
    weight: Entry,
    scales: Entry,
    biases: Entry,
}

pub(crate) struct SafetensorsSource {
    dir: PathBuf,
    pub(crate) config: ModelConfig,
    /// `config.json` as the directory has it.
    pub(crate) hf_config: Value,
    pub(crate) tensors: Vec<TensorInfo>,
    pub(crate) mlx_quantized: bool,
    shards: Vec<Shard>,
    plain: HashMap<String, Entry>,
    quantized: HashMap<String, Quantized>,
    /// Stacked expert tensors: the per-expert entries, in expert order.
    stacked: HashMap<String, Vec<Entry>>,
}

/// A mixture's expert stored on its own (Hugging Face's
/// `model.layers.L.mlp.experts.E.P.weight`): `(L, E, P)`.
fn expert_part(name: &str) -> Option<(usize, usize, &str)> {
    let (layer, rest) = name.strip_prefix("model.layers.")?.split_once('.')?;
    let (expert, proj) = rest.strip_prefix("mlp.experts.")?.split_once('.')?;
    let proj = proj.strip_suffix(".weight").filter(|p| ["gate_proj", "up_proj", "down_proj"].contains(p))?;
    Some((layer.parse().ok()?, expert.parse().ok()?, proj))
}

/// The stacked name mlx-lm gives the experts of a projection:
/// `model.layers.L.mlp.switch_mlp.P.weight`, shaped `[experts, out, in]`.
fn stacked_name(layer: usize, proj: &str) -> String {
    format!("model.layers.{layer}.mlp.switch_mlp.{proj}.weight")
}

/// Groups per-expert tensors by the stacked tensor they make, each group's
/// entries in expert order: every expert of `num_experts` present, float,
/// of one dtype and one 2-D shape.
fn stack_experts(
    entries: &[(String, Entry)],
    by_name: &HashMap<String, Entry>,
    shards: &[Shard],
    num_experts: usize,
) -> Result<HashMap<String, Vec<Entry>>> {
    // Sparse until checked: `num_experts` comes from an untrusted config.
    let mut groups: BTreeMap<String, BTreeMap<usize, Entry>> = BTreeMap::new();
    for (name, e) in entries {
        let Some((layer, expert, proj)) = expert_part(name) else { continue };
        let path = &shards[e.shard].path;
        let err = |m: String| IngestError::tensor(path, name, e.start as u64, m);
        if by_name.contains_key(&format!("{}.scales", name.trim_end_matches(".weight"))) {
            return Err(err(
                "experts quantized one tensor each are not supported (mlx-lm stacks them as mlp.switch_mlp)".into(),
            ));
        }
        if expert >= num_experts {
            return Err(err(format!("expert {expert} does not exist: num_experts is {num_experts}")));
        }
        groups.entry(stacked_name(layer, proj)).or_default().insert(expert, e.clone());
    }
    let mut stacked = HashMap::with_capacity(groups.len());
    for (stack, parts) in groups {
        let first = parts.values().next().expect("a group has the entry that made it").clone();
        if parts.len() != num_experts {
            // Every index is below num_experts, so one below len + 1 is missing.
            let missing = (0..num_experts).find(|e| !parts.contains_key(e)).unwrap_or(0);
            return Err(IngestError::tensor(
                &shards[first.shard].path,
                &stack.replace("switch_mlp.", &format!("experts.{missing}.")),
                first.start as u64,
                format!("missing: {stack} stacks all {num_experts} experts (num_experts)"),
            ));
        }
        for (expert, part) in &parts {
            if part.dtype != first.dtype || part.shape != first.shape || part.shape.len() != 2 {
                return Err(IngestError::tensor(
                    &shards[part.shard].path,
                    &stack.replace("switch_mlp.", &format!("experts.{expert}.")),
                    part.start as u64,
                    format!(
                        "{:?} {:?} does not stack with expert 0's {:?} {:?} (every expert is one 2-D tensor of one dtype)",
                        part.dtype, part.shape, first.dtype, first.shape
                    ),
                ));
            }
        }
        stacked.insert(stack, parts.into_values().collect());
    }
    Ok(stacked)
}

/// The most bytes a config-like JSON file (config.json,
/// tokenizer_config.json, generation_config.json, the shard index) may
/// hold: real ones are a few KiB to a few MiB.
const MAX_CONFIG_BYTES: u64 = 64 << 20;

/// Reads a UTF-8 file of at most `limit` bytes: a larger one is refused
/// before it is read into memory (a hostile directory could name a
/// multi-gigabyte "config.json").
pub fn read_text(path: &Path, limit: u64) -> Result<String> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| IngestError::io(path, e))?;
    let mut bytes = Vec::new();
    // `take` rather than the file's length: a FIFO or a growing file has none.
    file.take(limit + 1).read_to_end(&mut bytes).map_err(|e| IngestError::io(path, e))?;
    if bytes.len() as u64 > limit {
        return Err(IngestError::corrupt(path, limit, format!("the file is larger than the limit of {limit} bytes")));
    }
    String::from_utf8(bytes).map_err(|e| {
        let offset = e.utf8_error().valid_up_to() as u64;
        IngestError::corrupt(path, offset, "not valid UTF-8")
    })
}

fn read_json(path: &Path) -> Result<Value> {
    let text = read_text(path, MAX_CONFIG_BYTES)?;
    serde_json::from_str(&text)
        .map_err(|e| IngestError::corrupt(path, e.column() as u64, format!("invalid JSON at line {}: {e}", e.line())))
}

fn read_json_opt(path: &Path) -> Result<Option<Value>> {
    if path.is_file() { read_json(path).map(Some) } else { Ok(None) }
}

fn float_dtype(d: StDtype) -> Option<FloatDtype> {
    match d {
        StDtype::F32 => Some(FloatDtype::F32),
        StDtype::F16 => Some(FloatDtype::F16),
        StDtype::BF16 => Some(FloatDtype::BF16),
        _ => None,
    }
}

/// The dtype spellings safetensors defines.
const KNOWN_DTYPES: [&str; 20] = [
    "BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "I16", "U16", "F16", "BF16",
    "I32", "U32", "F32", "F64", "I64", "U64", "C64",
];

fn dtype_bits(name: &str) -> Option<usize> {
    Some(match name {
        "F4" => 4,
        "F6_E2M3" | "F6_E3M2" => 6,
        "BOOL" | "U8" | "I8" | "F8_E5M2" | "F8_E4M3" | "F8_E8M0" => 8,
        "I16" | "U16" | "F16" | "BF16" => 16,
        "I32" | "U32" | "F32" => 32,
        "F64" | "I64" | "U64" | "C64" => 64,
        _ => return None,
    })
}

/// Finds which tensor of a header the safetensors crate refused, for an
/// error that names it.
fn diagnose_header(path: &Path, bytes: &[u8], crate_error: &str) -> IngestError {
    let generic = || IngestError::corrupt(path, 0, format!("invalid safetensors header: {crate_error}"));
    let Some(len) = bytes.get(..8).map(|b| u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])) else {
        return IngestError::corrupt(
            path,
            0,
            format!("truncated safetensors file: {} bytes, no header length", bytes.len()),
        );
    };
    let Some(header) = usize::try_from(len).ok().and_then(|n| bytes.get(8..8usize.checked_add(n)?)) else {
        return IngestError::corrupt(
            path,
            0,
            format!("safetensors header length {len} runs past the end of the {}-byte file", bytes.len()),
        );
    };
    let value: Value = match serde_json::from_slice(header) {
        Ok(v) => v,
        Err(e) => {
            return IngestError::corrupt(
                path,
                8 + e.column() as u64 - 1,
                format!("safetensors header is not valid JSON: {e}"),
            );
        }
    };
    let Some(obj) = value.as_object() else {
        return IngestError::corrupt(path, 8, "safetensors header is not a JSON object");
    };
    let data_len = bytes.len() - 8 - header.len();
    let data_start = (8 + header.len()) as u64;
    for (name, entry) in obj.iter().filter(|(k, _)| k.as_str() != "__metadata__") {
        let dtype = entry.get("dtype").and_then(Value::as_str).unwrap_or("(none)");
        if !KNOWN_DTYPES.contains(&dtype) {
            return IngestError::UnknownDtype {
                path: path.to_path_buf(),
                tensor: name.clone(),
                dtype: dtype.to_string(),
            };
        }
        let shape: Option<Vec<u64>> =
            entry.get("shape").and_then(Value::as_array).and_then(|a| a.iter().map(Value::as_u64).collect());
        let offsets: Option<Vec<u64>> =
            entry.get("data_offsets").and_then(Value::as_array).and_then(|a| a.iter().map(Value::as_u64).collect());
        let (Some(shape), Some(offsets)) = (shape, offsets) else {
            return IngestError::tensor(path, name, data_start, "header entry lacks a valid shape or data_offsets");
        };
        let [s, e] = offsets[..] else {
            return IngestError::tensor(path, name, data_start, "data_offsets is not [start, end]");
        };
        let bits = dtype_bits(dtype).unwrap_or(8) as u64;
        let size = shape.iter().try_fold(bits, |a, &d| a.checked_mul(d)).map(|b| b / 8);
        if size != Some(e.saturating_sub(s)) || e < s {
            return IngestError::tensor(
                path,
                name,
                data_start.saturating_add(s),
                format!(
                    "{dtype} {shape:?} needs {size:?} bytes but data_offsets [{s}, {e}] hold {}",
                    e.saturating_sub(s)
                ),
            );
        }
        if e > data_len as u64 {
            return IngestError::tensor(
                path,
                name,
                data_start.saturating_add(s),
                format!("data_offsets end {e} is past the {data_len}-byte data section (truncated file?)"),
            );
        }
    }
    generic()
}

/// Finds the architecture of a Hugging Face `config.json` (by
/// `architectures[0]`, then `model_type`), refusing an unsupported one with
/// the supported list.
fn detect_hf(path: &Path, config: &Value) -> Result<Architecture> {
    let classes: Vec<&str> = config
        .get("architectures")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let model_type = config.get("model_type").and_then(Value::as_str);
    if let Some(a) = classes.iter().copied().chain(model_type).find_map(Architecture::from_hf) {
        return Ok(a);
    }
    let found = match (classes.first(), model_type) {
        (Some(c), Some(t)) => format!("{c} (model_type {t})"),
        (Some(c), None) => c.to_string(),
        (None, Some(t)) => format!("model_type {t}"),
        (None, None) => "none (config.json has neither `architectures` nor `model_type`)".to_string(),
    };
    Err(IngestError::UnsupportedArchitecture {
        path: path.to_path_buf(),
        found,
        supported: Architecture::supported_list(),
    })
}

/// The MLX quantization of one layer: `(bits, group_size)` or not quantized.
fn layer_quant(path: &Path, q: &Value, layer: &str) -> Result<Option<(u32, usize)>> {
    let read = |v: &Value, what: &str| -> Result<(u32, usize)> {
        let mode = v.get("mode").and_then(Value::as_str).unwrap_or("affine");
        if mode != "affine" {
            return Err(IngestError::config(
                path,
                format!("{what}: quantization mode {mode:?} is not supported (affine is)"),
            ));
        }
        let bits = v.get("bits").and_then(Value::as_u64).filter(|b| [2, 3, 4, 5, 6, 8].contains(b));
        let group = v.get("group_size").and_then(Value::as_u64).filter(|g| [32, 64, 128].contains(g));
        match (bits, group) {
            (Some(b), Some(g)) => Ok((b as u32, g as usize)),
            _ => Err(IngestError::config(path, format!("{what}: bad bits/group_size in {v}"))),
        }
    };
    match q.get(layer) {
        Some(Value::Bool(false)) => Ok(None),
        Some(v @ Value::Object(_)) => read(v, &format!("quantization.{layer}")).map(Some),
        _ => read(q, "quantization").map(Some),
    }
}

impl SafetensorsSource {
    pub(crate) fn open(dir: &Path) -> Result<SafetensorsSource> {
        let config_path = dir.join("config.json");
        if !config_path.is_file() {
            return Err(IngestError::missing(&config_path, "config.json (the model's configuration)"));
        }
        let json = read_json(&config_path)?;
        // The architecture and every value the runtime relies on are checked
        // before any weight file is opened.
        let architecture = detect_hf(&config_path, &json)?;
        let config =
            ModelConfig::from_hf(architecture, &json).map_err(|e| IngestError::invalid_config(&config_path, e))?;
        let quant = json.get("quantization").or_else(|| json.get("quantization_config")).cloned();
        let mlx_quantized = quant.is_some();

        let index_path = dir.join("model.safetensors.index.json");
        let files: Vec<PathBuf> = if index_path.is_file() {
            let index = read_json(&index_path)?;
            let map = index.get("weight_map").and_then(Value::as_object).ok_or_else(|| {
                IngestError::corrupt(&index_path, 0, "model.safetensors.index.json has no weight_map object")
            })?;
            let names = map
                .iter()
                .map(|(tensor, v)| {
                    v.as_str().ok_or_else(|| {
                        IngestError::config(&index_path, format!("weight_map.{tensor}: {v} is not a file name"))
                    })
                })
                .collect::<Result<BTreeSet<&str>>>()?;
            names.into_iter().map(|n| shard_path(dir, &index_path, n)).collect::<Result<Vec<PathBuf>>>()?
        } else if dir.join("model.safetensors").is_file() {
            vec![dir.join("model.safetensors")]
        } else {
            let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
                .map_err(|e| IngestError::io(dir, e))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
                .collect();
            found.sort();
            if found.is_empty() {
                return Err(IngestError::missing(
                    &dir.join("model.safetensors"),
                    "the weights (model.safetensors, or shards listed in model.safetensors.index.json)",
                ));
            }
            found
        };

        let mut shards = Vec::with_capacity(files.len());
        let mut entries: Vec<(String, Entry)> = Vec::new();
        for (i, path) in files.into_iter().enumerate() {
            if !path.is_file() {
                return Err(IngestError::missing(&path, "a weight shard that model.safetensors.index.json lists"));
            }
            let map = map_file(&path)?;
            let (n, meta) = match SafeTensors::read_metadata(&map) {
                Ok(r) => r,
                Err(e) => return Err(diagnose_header(&path, &map, &e.to_string())),
            };
            let data_start = 8 + n;
            let mut infos: Vec<(String, &safetensors::tensor::TensorInfo)> = meta.tensors().into_iter().collect();
            infos.sort_by_key(|(_, t)| t.data_offsets.0);
            for (name, t) in infos {
                let entry = Entry {
                    shard: i,
                    dtype: t.dtype,
                    shape: t.shape.clone(),
                    start: data_start + t.data_offsets.0,
                    end: data_start + t.data_offsets.1,
                };
                entries.push((name, entry));
            }
            shards.push(Shard { path, map, data_start });
        }

        let mut by_name: HashMap<String, Entry> = HashMap::with_capacity(entries.len());
        for (name, e) in &entries {
            if by_name.insert(name.clone(), e.clone()).is_some() {
                let path = &shards[e.shard].path;
                return Err(IngestError::tensor(path, name, e.start as u64, "appears in more than one shard"));
            }
        }

        // A mixture's experts stored one tensor each are presented stacked,
        // where the first of them stands in the file.
        let stacked = match &config.moe {
            Some(moe) => stack_experts(&entries, &by_name, &shards, moe.num_experts)?,
            None => HashMap::new(),
        };
        let mut emitted = BTreeSet::new();
        let mut tensors = Vec::new();
        let mut plain = HashMap::new();
        let mut quantized = HashMap::new();
        for (name, e) in &entries {
            let path = &shards[e.shard].path;
            if let Some((layer, _, proj)) = expert_part(name).filter(|_| !stacked.is_empty()) {
                let stack = stacked_name(layer, proj);
                if !emitted.insert(stack.clone()) {
                    continue;
                }
                let parts = &stacked[&stack];
                let dtype = float_dtype(e.dtype).ok_or_else(|| IngestError::UnknownDtype {
                    path: path.clone(),
                    tensor: name.clone(),
                    dtype: format!("{:?} (float tensors must be F32, F16 or BF16)", e.dtype),
                })?;
                let mut shape = vec![parts.len()];
                shape.extend_from_slice(&e.shape);
                tensors.push(TensorInfo {
                    name: stack,
                    source_name: format!("model.layers.{layer}.mlp.experts.*.{proj}.weight"),
                    file: path.clone(),
                    shape,
                    storage: Storage::Float(dtype),
                    offset: e.start as u64,
                    nbytes: parts.iter().map(|p| (p.end - p.start) as u64).sum(),
                });
                continue;
            }
            if name.ends_with(".scales") || name.ends_with(".biases") {
                let base = name.rsplit_once('.').map(|(b, _)| b).unwrap_or(name);
                if !by_name.contains_key(&format!("{base}.weight")) {
                    return Err(IngestError::tensor(
                        path,
                        name,
                        e.start as u64,
                        format!("no {base}.weight to go with it"),
                    ));
                }
                continue;
            }
            let layer = name.strip_suffix(".weight");
            let scales = layer.and_then(|l| by_name.get(&format!("{l}.scales")));
            if let (Some(layer), Some(scales)) = (layer, scales) {
                let q = quant.as_ref().ok_or_else(|| {
                    IngestError::config(&config_path, format!("{layer} has scales but config.json has no quantization"))
                })?;
                let Some((bits, group_size)) = layer_quant(&config_path, q, layer)? else {
                    return Err(IngestError::config(
                        &config_path,
                        format!("{layer} has scales but its quantization override is false"),
                    ));
                };
                let biases = by_name.get(&format!("{layer}.biases")).ok_or_else(|| {
                    IngestError::tensor(path, name, e.start as u64, "affine quantized, but there is no .biases")
                })?;
                let terr = |m: String| IngestError::tensor(path, name, e.start as u64, m);
                if e.dtype != StDtype::U32 {
                    return Err(terr(format!("a quantized weight must be U32, found {:?}", e.dtype)));
                }
                let sdt =
                    float_dtype(scales.dtype).ok_or_else(|| terr(format!("scales have dtype {:?}", scales.dtype)))?;
                if biases.dtype != scales.dtype || biases.shape != scales.shape {
                    return Err(terr("biases and scales differ in dtype or shape".into()));
                }
                let (Some(&wc), Some(&sc)) = (e.shape.last(), scales.shape.last()) else {
                    return Err(terr("scalar quantized weight".into()));
                };
                let cols = sc * group_size;
                if wc * 32 != cols * bits as usize
                    || e.shape[..e.shape.len() - 1] != scales.shape[..scales.shape.len() - 1]
                {
                    return Err(terr(format!(
                        "packed weight {:?} and scales {:?} do not agree with {bits} bits, group size {group_size}",
                        e.shape, scales.shape
                    )));
                }
                let mut shape = e.shape.clone();
                if let Some(last) = shape.last_mut() {
                    *last = cols;
                }
                tensors.push(TensorInfo {
                    name: name.clone(),
                    source_name: name.clone(),
                    file: path.clone(),
                    shape,
                    storage: Storage::MlxAffine { bits, group_size, scales: sdt },
                    offset: e.start as u64,
                    nbytes: (e.end - e.start) as u64,
                });
                quantized.insert(
                    name.clone(),
                    Quantized { weight: e.clone(), scales: scales.clone(), biases: biases.clone() },
                );
            } else {
                let dtype = float_dtype(e.dtype).ok_or_else(|| IngestError::UnknownDtype {
                    path: path.clone(),
                    tensor: name.clone(),
                    dtype: format!("{:?} (float tensors must be F32, F16 or BF16)", e.dtype),
                })?;
                tensors.push(TensorInfo {
                    name: name.clone(),
                    source_name: name.clone(),
                    file: path.clone(),
                    shape: e.shape.clone(),
                    storage: Storage::Float(dtype),
                    offset: e.start as u64,
                    nbytes: (e.end - e.start) as u64,
                });
                plain.insert(name.clone(), e.clone());
            }
        }
        Ok(SafetensorsSource {
            dir: dir.to_path_buf(),
            config,
            hf_config: json,
            tensors,
            mlx_quantized,
            shards,
            plain,
            quantized,
            stacked,
        })
    }

    pub(crate) fn source_files(&self) -> Vec<PathBuf> {
        let mut files = vec![self.dir.join("config.json")];
        files.extend(self.shards.iter().map(|s| s.path.clone()));
        for f in [
            "model.safetensors.index.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "chat_template.jinja",
            "generation_config.json",
        ] {
            let p = self.dir.join(f);
            if p.is_file() {
                files.push(p);
            }
        }
        files
    }

    fn bytes(&self, name: &str, e: &Entry) -> Result<&[u8]> {
        let shard = &self.shards[e.shard];
        shard
            .map
            .get(e.start..e.end)
            .filter(|_| e.start >= shard.data_start)
            .ok_or_else(|| IngestError::tensor(&shard.path, name, e.start as u64, "data lies outside the file"))
    }

    fn float<'a>(&'a self, name: &str, e: &Entry) -> Result<FloatTensor<'a>> {
        let dtype = float_dtype(e.dtype).ok_or_else(|| IngestError::UnknownDtype {
            path: self.shards[e.shard].path.clone(),
            tensor: name.to_string(),
            dtype: format!("{:?}", e.dtype),
        })?;
        Ok(FloatTensor { dtype, shape: e.shape.clone(), data: Cow::Borrowed(self.bytes(name, e)?) })
    }

    /// The experts of a stacked tensor, each borrowed from the map.
    fn expert_parts(&self, info: &TensorInfo, parts: &[Entry]) -> Result<Vec<FloatTensor<'_>>> {
        parts.iter().map(|p| self.float(&info.name, p)).collect()
    }

    /// The tensor in parts where it is stored in parts (experts one by one),
    /// else whole.
    pub(crate) fn float_chunks(&self, info: &TensorInfo) -> Result<super::FloatChunks<'_>> {
        match self.stacked.get(&info.name) {
            Some(parts) => Ok(super::FloatChunks::parts(self.expert_parts(info, parts)?)),
            None => Ok(super::FloatChunks::whole(self.load_float(info)?)),
        }
    }

    pub(crate) fn load(&self, info: &TensorInfo) -> Result<TensorData<'_>> {
        if let Some(parts) = self.stacked.get(&info.name) {
            // The stacked layout is the experts one after another.
            let parts = self.expert_parts(info, parts)?;
            let data: Vec<u8> = parts.iter().flat_map(|p| p.data.iter().copied()).collect();
            let dtype = parts.first().map_or(FloatDtype::F32, |p| p.dtype);
            return Ok(TensorData::Float(FloatTensor { dtype, shape: info.shape.clone(), data: Cow::Owned(data) }));
        }
        if let Some(q) = self.quantized.get(&info.name) {
            let Storage::MlxAffine { bits, group_size, .. } = info.storage else {
                return Err(IngestError::tensor(&info.file, &info.name, info.offset, "storage mismatch"));
            };
            return Ok(TensorData::Affine(AffineTensor {
                shape: info.shape.clone(),
                bits,
                group_size,
                weight: Cow::Borrowed(self.bytes(&info.name, &q.weight)?),
                scales: self.float(&info.name, &q.scales)?,
                biases: self.float(&info.name, &q.biases)?,
            }));
        }
        let e = self
            .plain
            .get(&info.name)
            .ok_or_else(|| IngestError::NoSuchTensor { path: self.dir.clone(), name: info.name.clone() })?;
        self.float(&info.name, e).map(TensorData::Float)
    }

    pub(crate) fn load_float(&self, info: &TensorInfo) -> Result<FloatTensor<'_>> {
        match self.load(info)? {
            TensorData::Float(f) => Ok(f),
            TensorData::Affine(a) => {
                let mlx = |cause| IngestError::Mlx { path: info.file.clone(), tensor: info.name.clone(), cause };
                let w = a.to_quantized().and_then(|q| q.dequantize(None)).map_err(mlx)?;
                let bytes = w.to_bytes().map_err(mlx)?;
                Ok(FloatTensor { dtype: a.scales.dtype, shape: a.shape.clone(), data: Cow::Owned(bytes) })
            }
        }
    }

    pub(crate) fn tokenizer(&self) -> Result<TokenizerAssets> {
        let tj = self.dir.join("tokenizer.json");
        if !tj.is_file() {
            return Err(IngestError::missing(&tj, "tokenizer.json (Hugging Face tokenizers format)"));
        }
        let tokenizer_json = read_text(&tj, mlxcel_tokenizer::validate::MAX_JSON_BYTES as u64)?;
        let tc_path = self.dir.join("tokenizer_config.json");
        let tokenizer_config = read_json_opt(&tc_path)?.unwrap_or_else(|| json!({}));
        let jinja = self.dir.join("chat_template.jinja");
        let chat_template = if jinja.is_file() {
            Some(read_text(&jinja, mlxcel_runtime::chat::MAX_TEMPLATE_BYTES as u64)?)
        } else {
            match tokenizer_config.get("chat_template") {
                Some(Value::String(s)) => Some(s.clone()),
                // A list of named templates: take "default".
                Some(Value::Array(list)) => list
                    .iter()
                    .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                    .or_else(|| list.first())
                    .and_then(|t| t.get("template"))
                    .and_then(Value::as_str)
                    .map(str::to_owned),
                _ => None,
            }
        };
        Ok(TokenizerAssets { tokenizer_json, chat_template, tokenizer_config })
    }

    pub(crate) fn generation(&self) -> Result<GenerationDefaults> {
        let gen_config = read_json_opt(&self.dir.join("generation_config.json"))?.unwrap_or_else(|| json!({}));
        let tc = read_json_opt(&self.dir.join("tokenizer_config.json"))?.unwrap_or_else(|| json!({}));
        let cfg = &self.hf_config;
        let pick =
            |key: &str| gen_config.get(key).filter(|v| !v.is_null()).or_else(|| cfg.get(key).filter(|v| !v.is_null()));
        let id = |v: Option<&Value>| v.and_then(Value::as_u64).and_then(|i| u32::try_from(i).ok());
        let eos_token_ids = match pick("eos_token_id") {
            Some(Value::Array(a)) => a.iter().filter_map(|v| v.as_u64().and_then(|i| u32::try_from(i).ok())).collect(),
            v => id(v).into_iter().collect(),
        };
        Ok(GenerationDefaults {
            bos_token_id: id(pick("bos_token_id")),
            eos_token_ids,
            pad_token_id: id(pick("pad_token_id")),
            add_bos_token: tc.get("add_bos_token").and_then(Value::as_bool).unwrap_or(false),
            add_eos_token: tc.get("add_eos_token").and_then(Value::as_bool).unwrap_or(false),
            generation_config: gen_config,
        })
    }
}

/// The path of a shard `name` that `index` lists: a file name relative to
/// the model directory `dir`, which must stay inside it (an index naming
/// `../../etc/passwd` or `/etc/passwd` is refused). A symbolic link may lead
/// only inside `dir`, or, in the Hugging Face cache's layout
/// (`<repo>/snapshots/<revision>/` linking to `<repo>/blobs/`), into the
/// repository's `blobs`.
fn shard_path(dir: &Path, index: &Path, name: &str) -> Result<PathBuf> {
    use std::path::Component;
    let refuse = |reason: &str| IngestError::ShardPath {
        index: index.to_path_buf(),
        shard: name.to_string(),
        reason: reason.to_string(),
    };
    let relative = Path::new(name);
    if name.is_empty() || !relative.components().all(|c| matches!(c, Component::Normal(_))) {
        return Err(refuse("is not a plain path inside the model directory (no `..`, no absolute path)"));
    }
    let path = dir.join(relative);
    // A missing shard is reported where the shards are opened.
    let Ok(real) = path.canonicalize() else { return Ok(path) };
    let real_dir = dir.canonicalize().map_err(|e| IngestError::io(dir, e))?;
    let blobs = real_dir
        .parent()
        .filter(|p| p.file_name().is_some_and(|n| n == "snapshots"))
        .and_then(Path::parent)
        .map(|repo| repo.join("blobs"));
    if real.starts_with(&real_dir) || blobs.is_some_and(|b| real.starts_with(b)) {
        Ok(path)
    } else {
        Err(refuse(&format!("leads outside the model directory (to {})", real.display())))
    }
}
