//! `mlxcel inspect`: what a bundle holds, as a readable report or JSON.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use indicatif::HumanBytes;
use mlxcel_bundle::{Bundle, hex, kinds};
use serde_json::{Value, json};

/// Hyperparameters worth showing in the readable report, in this order.
const NOTABLE_CONFIG_KEYS: &[&str] = &[
    "model_type",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "max_position_embeddings",
    "rope_theta",
    "rms_norm_eps",
    "sliding_window",
    "tie_word_embeddings",
    "torch_dtype",
];

/// Parses JSON text, keeping it as a string when it is not valid JSON.
fn json_or_text(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_string()))
}

fn quant_label(q: &mlxcel_bundle::QuantizationView<'_>) -> String {
    format!("{} {}-bit g{}", q.mode, q.bits, q.group_size)
}

/// Count and bytes of tensors, grouped by a label.
#[derive(Default)]
struct Tally {
    count: usize,
    bytes: u64,
}

struct TensorSummary {
    total: Tally,
    /// Model parameters: the logical elements of every weight (a quantized
    /// weight counts its unpacked values; its scales and biases do not count).
    parameters: u64,
    by_dtype: BTreeMap<String, Tally>,
    by_quantization: BTreeMap<String, Tally>,
}

fn summarize(bundle: &Bundle) -> TensorSummary {
    let mut summary = TensorSummary {
        total: Tally::default(),
        parameters: 0,
        by_dtype: BTreeMap::new(),
        by_quantization: BTreeMap::new(),
    };
    let mut quant_aux = std::collections::HashSet::new();
    for t in bundle.tensors() {
        if let Some(q) = t.quantization() {
            quant_aux.insert(q.scales.to_string());
            quant_aux.extend(q.biases.map(str::to_string));
        }
    }
    for t in bundle.tensors() {
        let elements: u64 = t.shape().iter().product();
        summary.parameters += match t.quantization() {
            Some(q) => elements * 32 / u64::from(q.bits.max(1)),
            None if quant_aux.contains(t.name()) => 0,
            None => elements,
        };
        let add = |tally: &mut Tally| {
            tally.count += 1;
            tally.bytes += t.byte_len();
        };
        add(&mut summary.total);
        add(summary.by_dtype.entry(t.dtype().to_string()).or_default());
        if let Some(q) = t.quantization() {
            add(summary.by_quantization.entry(quant_label(&q)).or_default());
        }
    }
    summary
}

fn tally_json(map: &BTreeMap<String, Tally>) -> Value {
    map.iter().map(|(k, t)| (k.clone(), json!({"count": t.count, "bytes": t.bytes}))).collect()
}

fn tensor_json(t: &mlxcel_bundle::TensorView<'_>) -> Value {
    json!({
        "name": t.name(),
        "dtype": t.dtype().as_str(),
        "shape": t.shape(),
        "offset": t.offset(),
        "length": t.byte_len(),
        "blake3": hex(&t.blake3()),
        "layout": t.layout(),
        "quantization": t.quantization().map(|q| json!({
            "mode": q.mode, "bits": q.bits, "group_size": q.group_size, "scales": q.scales, "biases": q.biases,
        })),
        "properties": t.entry().properties.iter().map(|kv| (kv.key.to_string(), json!(kv.value.as_str()))).collect::<serde_json::Map<_, _>>(),
    })
}

/// The whole report as JSON (`--json`); `tensors` adds every tensor.
pub fn to_json(bundle: &Bundle, tensors: bool) -> Value {
    let h = bundle.header();
    let p = bundle.provenance();
    let summary = summarize(bundle);
    let mut report = json!({
        "path": bundle.path().map(|p| p.display().to_string()),
        "file_len": h.file_len,
        "format": {"major": h.format_major, "minor": h.format_minor},
        "flags": h.flags,
        "root_hash": hex(&h.root_hash),
        "manifest": {"offset": h.manifest_offset, "length": h.manifest_len, "blake3": hex(&h.manifest_blake3)},
        "model": {
            "architecture": bundle.architecture(),
            "name": bundle.model_name(),
            "config": json_or_text(bundle.config_json()),
        },
        "tokenizer": {
            "tokenizer_json_bytes": bundle.tokenizer_json().map(<[u8]>::len),
            "chat_template": bundle.chat_template(),
            "generation_defaults": bundle.generation_defaults_json().map(json_or_text),
        },
        "provenance": {
            "compiler_version": p.compiler_version.as_str(),
            "mlx_version": p.mlx_version.as_str(),
            "source_files": p.source_files.iter().map(|f| json!({
                "name": f.name.as_str(), "size": f.size.to_native(), "digest": f.digest.as_str(),
            })).collect::<Vec<_>>(),
            "compile_options": json_or_text(&p.compile_options_json),
            "quantization_recipe": p.quantization_recipe_json.as_ref().map(|r| json_or_text(r)),
            "surgery": p.surgery.as_ref().map(|s| json!({
                "yaml": s.yaml.as_str(),
                "blake3": hex(&s.blake3),
                "operations": s.operations.iter().map(|o| json!({
                    "description": o.description.as_str(),
                    "matched_tensors": o.matched_tensors.as_ref().map(|m| m.iter().map(|n| n.as_str()).collect::<Vec<_>>()),
                })).collect::<Vec<_>>(),
            })),
            "repacks": p.repacks.iter().map(|r| json!({
                "transform": r.transform.as_str(), "layout": r.layout.as_str(),
                "tensors": r.tensors.iter().map(|n| n.as_str()).collect::<Vec<_>>(),
                "params": json_or_text(&r.params_json),
            })).collect::<Vec<_>>(),
        },
        "tensor_summary": {
            "parameters": summary.parameters,
            "count": summary.total.count,
            "bytes": summary.total.bytes,
            "by_dtype": tally_json(&summary.by_dtype),
            "by_quantization": tally_json(&summary.by_quantization),
        },
        "sections": bundle.sections().map(|s| json!({
            "kind": s.kind(), "key": s.key(), "target": s.target(), "offset": s.offset(), "length": s.byte_len(),
            "blake3": hex(&s.blake3()),
            "properties": s.entry().properties.iter().map(|kv| (kv.key.to_string(), json!(kv.value.as_str()))).collect::<serde_json::Map<_, _>>(),
        })).collect::<Vec<_>>(),
        "metadata": bundle.manifest().metadata.iter().map(|kv| json!({"key": kv.key.as_str(), "value": kv.value.as_str()})).collect::<Vec<_>>(),
        "extensions": bundle.manifest().extensions.iter().map(|e| json!({
            "name": e.name.as_str(), "required": e.required, "payload_bytes": e.payload.len(),
        })).collect::<Vec<_>>(),
    });
    if tensors {
        report["tensors"] = bundle.tensors().map(|t| tensor_json(&t)).collect();
    }
    report
}

fn short_hash(hash: &[u8]) -> String {
    hex(&hash[..8])
}

/// Formats rows as left-aligned columns separated by two spaces.
fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| rows.iter().filter_map(|r| r.get(c)).map(|s| s.chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
        let line: Vec<String> = row.iter().zip(&widths).map(|(cell, &w)| format!("{cell:<w$}")).collect();
        let _ = writeln!(out, "  {}", line.join("  ").trim_end());
    }
    out
}

/// The readable report; `tensors` adds a table of every tensor.
pub fn to_text(bundle: &Bundle, tensors: bool) -> String {
    let h = bundle.header();
    let p = bundle.provenance();
    let mut out = String::new();
    let path = bundle.path().map(|p| p.display().to_string()).unwrap_or_default();
    let _ = writeln!(out, "bundle     {path} ({})", HumanBytes(h.file_len));
    let _ = writeln!(out, "format     {}.{}  flags {:#x}", h.format_major, h.format_minor, h.flags);
    let _ = writeln!(out, "root hash  {}", hex(&h.root_hash));
    let _ = writeln!(out, "manifest   offset {}, {} bytes", h.manifest_offset, h.manifest_len);

    let or_unset = |s: &str| if s.is_empty() { "(unset)".to_string() } else { s.to_string() };
    let _ = writeln!(
        out,
        "\nmodel      {} (architecture {})",
        or_unset(bundle.model_name()),
        or_unset(bundle.architecture())
    );
    match serde_json::from_str::<Value>(bundle.config_json()) {
        Ok(Value::Object(config)) => {
            let notable: Vec<String> =
                NOTABLE_CONFIG_KEYS.iter().filter_map(|k| config.get(*k).map(|v| format!("{k}={v}"))).collect();
            let _ = writeln!(out, "config     {} keys: {}", config.len(), notable.join(" "));
        }
        _ => {
            let _ = writeln!(out, "config     (not a JSON object, {} bytes)", bundle.config_json().len());
        }
    }
    let tokenizer = bundle
        .tokenizer_json()
        .map_or("none".to_string(), |t| format!("tokenizer.json {}", HumanBytes(t.len() as u64)));
    let template = bundle.chat_template().map_or("none".to_string(), |t| format!("{} chars", t.chars().count()));
    let _ = writeln!(out, "tokenizer  {tokenizer}; chat template: {template}");
    let _ = writeln!(out, "generation {}", bundle.generation_defaults_json().unwrap_or("(no defaults)"));

    let _ = writeln!(out, "\nprovenance");
    let mut rows = vec![
        vec!["compiler".to_string(), p.compiler_version.to_string()],
        vec!["MLX".to_string(), p.mlx_version.to_string()],
    ];
    for f in p.source_files.iter() {
        rows.push(vec!["source".into(), format!("{} ({}, {})", f.name, HumanBytes(f.size.to_native()), f.digest)]);
    }
    rows.push(vec!["options".into(), p.compile_options_json.to_string()]);
    if let Some(recipe) = p.quantization_recipe_json.as_ref() {
        rows.push(vec!["quantization".into(), recipe.to_string()]);
    }
    if let Some(s) = p.surgery.as_ref() {
        rows.push(vec![
            "surgery".into(),
            format!(
                "{} operation(s), YAML {} bytes, blake3 {}",
                s.operations.len(),
                s.yaml.len(),
                short_hash(&s.blake3)
            ),
        ]);
        for op in s.operations.iter() {
            let matched = op.matched_tensors.as_ref().map_or(String::new(), |m| format!(" ({} tensors)", m.len()));
            rows.push(vec![String::new(), format!("- {}{matched}", op.description)]);
        }
    }
    for r in p.repacks.iter() {
        rows.push(vec!["repack".into(), format!("{} -> {} ({} tensors)", r.transform, r.layout, r.tensors.len())]);
    }
    out.push_str(&table(&rows));

    let summary = summarize(bundle);
    let _ = writeln!(
        out,
        "\ntensors    {} ({}), {:.2} M parameters",
        summary.total.count,
        HumanBytes(summary.total.bytes),
        summary.parameters as f64 / 1e6
    );
    let mut rows = vec![vec!["dtype".to_string(), "count".into(), "bytes".into()]];
    for (dtype, t) in &summary.by_dtype {
        rows.push(vec![dtype.clone(), t.count.to_string(), HumanBytes(t.bytes).to_string()]);
    }
    for (label, t) in &summary.by_quantization {
        rows.push(vec![format!("quantized {label}"), t.count.to_string(), HumanBytes(t.bytes).to_string()]);
    }
    out.push_str(&table(&rows));

    let _ = writeln!(out, "\nsections   {}", bundle.section_count());
    if bundle.section_count() > 0 {
        let mut rows = vec![vec!["kind".to_string(), "key".into(), "target".into(), "size".into(), "blake3".into()]];
        for s in bundle.sections() {
            let target = if s.target().is_empty() { "-".to_string() } else { s.target().to_string() };
            rows.push(vec![
                s.kind().into(),
                s.key().into(),
                target,
                HumanBytes(s.byte_len()).to_string(),
                short_hash(&s.blake3()),
            ]);
        }
        out.push_str(&table(&rows));
    }
    let gpu = mlxcel_runtime::gpu_kernels::bundle_targets(bundle);
    if !gpu.is_empty() {
        let _ = writeln!(out, "\nGPU kernels (mlxcel-compile --target) for: {}", gpu.join(", "));
    }
    for s in bundle.sections().filter(|s| s.kind() == kinds::IREE_VMFB) {
        // The IREE modules of `--target iree-*` (docs/bundle-format.md §4.2.3).
        let prop = |k: &str| s.property(k).unwrap_or("?").to_string();
        let _ = writeln!(
            out,
            "\nIREE module {} for {} (iree-compile {}): prefill chunks {}, decode batches {}, caches of {} positions",
            s.key(),
            s.target(),
            prop(kinds::IREE_VERSION_KEY),
            prop(kinds::PREFILL_KEY),
            prop(kinds::DECODE_KEY),
            prop(kinds::CACHE_CAPACITY_KEY)
        );
        if let Some(features) = s.property(kinds::CPU_FEATURES_KEY) {
            let _ = writeln!(out, "  needs CPU features: {features}");
        }
    }
    let manifest = bundle.manifest();
    if !manifest.metadata.is_empty() {
        let _ = writeln!(out, "\nmetadata");
        let rows: Vec<Vec<String>> =
            manifest.metadata.iter().map(|kv| vec![kv.key.to_string(), kv.value.to_string()]).collect();
        out.push_str(&table(&rows));
    }
    if !manifest.extensions.is_empty() {
        let _ = writeln!(out, "\nextensions");
        let rows: Vec<Vec<String>> = manifest
            .extensions
            .iter()
            .map(|e| {
                vec![
                    e.name.to_string(),
                    if e.required { "required" } else { "optional" }.into(),
                    format!("{} bytes", e.payload.len()),
                ]
            })
            .collect();
        out.push_str(&table(&rows));
    }
    if tensors {
        let _ = writeln!(out, "\ntensor table");
        let mut rows = vec![vec![
            "name".to_string(),
            "dtype".into(),
            "shape".into(),
            "size".into(),
            "offset".into(),
            "quantization".into(),
            "layout".into(),
        ]];
        for t in bundle.tensors() {
            rows.push(vec![
                t.name().into(),
                t.dtype().to_string(),
                format!("{:?}", t.shape()),
                HumanBytes(t.byte_len()).to_string(),
                t.offset().to_string(),
                t.quantization().map_or("-".to_string(), |q| quant_label(&q)),
                t.layout().into(),
            ]);
        }
        out.push_str(&table(&rows));
    }
    out
}
