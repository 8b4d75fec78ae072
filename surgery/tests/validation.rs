//! Every validation error, provoked against a small model description, with
//! its message checked: each names the operation's index, its op and its line.

use std::path::Path;

use mlxcel_arch::{Architecture, ModelConfig};
use mlxcel_surgery::{ModelTensor, ModelView, Surgery};
use serde_json::json;

/// A two-layer Llama with 4 heads (2 KV heads) of 8, hidden 32, MLP 64.
fn model() -> (ModelConfig, Vec<ModelTensor>) {
    let config = ModelConfig::from_hf(
        Architecture::Llama,
        &json!({
            "model_type": "llama", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "intermediate_size": 64, "vocab_size": 100
        }),
    )
    .unwrap();
    let mut tensors = vec![ModelTensor { name: "model.embed_tokens.weight".into(), shape: vec![100, 32] }];
    for l in 0..2 {
        for (t, s) in [
            ("input_layernorm.weight", vec![32]),
            ("self_attn.q_proj.weight", vec![32, 32]),
            ("self_attn.k_proj.weight", vec![16, 32]),
            ("self_attn.v_proj.weight", vec![16, 32]),
            ("self_attn.o_proj.weight", vec![32, 32]),
            ("post_attention_layernorm.weight", vec![32]),
            ("mlp.gate_proj.weight", vec![64, 32]),
            ("mlp.up_proj.weight", vec![64, 32]),
            ("mlp.down_proj.weight", vec![32, 64]),
        ] {
            tensors.push(ModelTensor { name: format!("model.layers.{l}.{t}"), shape: s });
        }
    }
    tensors.push(ModelTensor { name: "model.norm.weight".into(), shape: vec![32] });
    (config, tensors)
}

/// A donor file with `model.norm.weight` (f32 [32]), `other` (f32 [5]) and
/// `codes` (u32 [32]).
fn donor(dir: &Path) {
    let f32s = vec![0u8; 32 * 4];
    let five = vec![0u8; 5 * 4];
    let views = vec![
        ("model.norm.weight", safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![32], &f32s).unwrap()),
        ("other", safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![5], &five).unwrap()),
        ("codes", safetensors::tensor::TensorView::new(safetensors::Dtype::U32, vec![32], &f32s).unwrap()),
    ];
    safetensors::serialize_to_file(views, None, &dir.join("donor.safetensors")).unwrap();
}

fn err(yaml: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    donor(dir.path());
    let (config, tensors) = model();
    let view = ModelView { config: &config, tensors: &tensors };
    match Surgery::parse(yaml, dir.path()) {
        Err(e) => e.to_string(),
        Ok(s) => s.plan(view).err().map(|e| e.to_string()).unwrap_or_else(|| panic!("accepted:\n{yaml}")),
    }
}

/// Wraps operations in a version-1 document; the first operation starts on line 3.
fn ops(body: &str) -> String {
    format!("version: 1\noperations:\n{body}")
}

#[test]
fn document_errors() {
    assert_eq!(
        err("version: 2\noperations: []\n"),
        "surgery: version 2 is not supported: this mlxcel reads surgery version 1"
    );
    assert_eq!(err("version: 1\noperations: []\n"), "surgery: operations is empty");
    let e = err("version: 1\noperations:\n  - op: scale\n    targets: x\n    factor: 1\nextra: 3\n");
    assert!(e.starts_with("surgery: unknown field `extra`"), "{e}");
    let e = err("version: 1\noperations: [\n");
    assert!(e.starts_with("surgery: ") && e.contains("line"), "{e}");
}

#[test]
fn operation_errors_name_index_op_and_line() {
    let cases: &[(&str, &str)] = &[
        // Unknown op, unknown field.
        (
            "  - op: shear\n    targets: x\n",
            "surgery operation #1 (shear, line 3): Unknown variant shear. Expected one of scale, add",
        ),
        (
            "  - op: scale\n    targets: model.norm.weight\n    facter: 2\n",
            "surgery operation #1 (scale, line 3): Unknown field facter. Expected one of targets, factor",
        ),
        // A value of the wrong type names its field.
        (
            "  - op: scale\n    targets: model.norm.weight\n    factor: ~\n",
            "surgery operation #1 (scale, line 3): factor: must be a number, found nothing (null)",
        ),
        (
            "  - op: scale\n    targets: model.norm.weight\n    factor: [1, 2]\n",
            "surgery operation #1 (scale, line 3): factor: must be a number, found a list",
        ),
        // A bad glob; a glob matching nothing.
        (
            "  - op: scale\n    targets: \"model.[norm\"\n    factor: 2\n",
            "surgery operation #1 (scale, line 3): bad glob \"model.[norm\"",
        ),
        (
            "  - op: scale\n    targets: [\"model.nope.*\", \"x\"]\n    factor: 2\n",
            "surgery operation #1 (scale, line 3): targets model.nope.*, x match no tensor of the model",
        ),
        // Non-finite numbers (refused by the parser, with their line and
        // column); a ratio outside [0, 1].
        (
            "  - op: scale\n    targets: model.norm.weight\n    factor: .nan\n",
            "surgery: non-finite float `.nan` rejected by reject_non_finite_typeless_float at line 5, column 13",
        ),
        (
            "  - op: add\n    targets: model.norm.weight\n    source: donor.safetensors\n    alpha: .inf\n",
            "surgery: non-finite float `.inf` rejected by reject_non_finite_typeless_float at line 6, column 12",
        ),
        (
            "  - op: interpolate\n    targets: model.norm.weight\n    sources: [model, donor.safetensors]\n    ratio: 1.5\n",
            "surgery operation #1 (interpolate, line 3): ratio must be a number in [0, 1], got 1.5",
        ),
        // Finite as f64 but not as the f32 the edit applies (1e39 is
        // infinite there), or past the multiplier limit: the model printed
        // nothing.
        (
            "  - op: scale\n    targets: model.norm.weight\n    factor: 1e39\n",
            "surgery operation #1 (scale, line 3): factor must be a number in [-1000, 1000], got 1e39",
        ),
        (
            "  - op: scale\n    targets: model.norm.weight\n    factor: -1e300\n",
            "surgery operation #1 (scale, line 3): factor must be a number in [-1000, 1000], got -1e300",
        ),
        (
            "  - op: add\n    targets: model.norm.weight\n    source: donor.safetensors\n    alpha: 1000.5\n",
            "surgery operation #1 (add, line 3): alpha must be a number in [-1000, 1000], got 1000.5",
        ),
        // Empty ids; ids out of range.
        (
            "  - op: prune\n    granularity: layer\n    ids: []\n    mode: zero\n",
            "surgery operation #1 (prune, line 3): ids is empty",
        ),
        (
            "  - op: prune\n    granularity: layer\n    ids: [2]\n    mode: remove\n",
            "surgery operation #1 (prune, line 3): layer 2 is out of range (the model has layers 0..2, less any removed)",
        ),
        (
            "  - op: prune\n    granularity: attention_head\n    ids: [4]\n    mode: zero\n",
            "surgery operation #1 (prune, line 3): head 4 is out of range (the model has 4 heads)",
        ),
        (
            "  - op: prune\n    granularity: mlp_channel\n    ids: [64]\n    mode: zero\n",
            "surgery operation #1 (prune, line 3): channel 64 is out of range (the MLP has 64 channels)",
        ),
        // Missing source file or key; shape and dtype mismatches.
        (
            "  - op: add\n    targets: model.norm.weight\n    source: nope.safetensors\n",
            "surgery operation #1 (add, line 3): source cannot open",
        ),
        (
            "  - op: replace\n    targets: model.layers.0.input_layernorm.weight\n    source: donor.safetensors\n",
            "surgery operation #1 (replace, line 3): source ",
        ),
        (
            "  - op: replace\n    targets: model.norm.weight\n    source: donor.safetensors\n    key: other\n",
            "surgery operation #1 (replace, line 3): other in ",
        ),
        (
            "  - op: replace\n    targets: model.norm.weight\n    source: donor.safetensors\n    key: codes\n",
            "surgery operation #1 (replace, line 3): codes in ",
        ),
        // Removal that the config cannot express.
        (
            "  - op: prune\n    granularity: attention_head\n    ids: [0]\n    layers: [0]\n    mode: remove\n",
            "surgery operation #1 (prune, line 3): removing attention_heads needs every layer",
        ),
        (
            "  - op: prune\n    granularity: attention_head\n    ids: [0, 1, 2]\n    mode: remove\n",
            "surgery operation #1 (prune, line 3): removing heads [0, 1, 2] leaves key/value groups of unequal sizes",
        ),
    ];
    for (body, want) in cases {
        let e = err(&ops(body));
        assert!(e.starts_with(want), "got: {e}\nwant a message starting: {want}");
    }
    // Specifics of the source errors.
    let e = err(&ops(
        "  - op: replace\n    targets: model.layers.0.input_layernorm.weight\n    source: donor.safetensors\n",
    ));
    assert!(
        e.ends_with("has no tensor model.layers.0.input_layernorm.weight (for model.layers.0.input_layernorm.weight)"),
        "{e}"
    );
    let e =
        err(&ops("  - op: replace\n    targets: model.norm.weight\n    source: donor.safetensors\n    key: other\n"));
    assert!(e.ends_with("has shape [5] but model.norm.weight has shape [32]"), "{e}");
    let e =
        err(&ops("  - op: replace\n    targets: model.norm.weight\n    source: donor.safetensors\n    key: codes\n"));
    assert!(e.ends_with("is U32, not a float tensor"), "{e}");
}

#[test]
fn later_operations_have_later_lines() {
    let yaml = ops(
        "  # a comment\n  - op: scale\n    targets: model.norm.weight\n    factor: 2\n\n  - op: scale\n    targets: nothing\n    factor: 2\n",
    );
    assert_eq!(err(&yaml), "surgery operation #2 (scale, line 8): targets nothing match no tensor of the model");
}

#[test]
fn a_valid_plan_renumbers_and_shrinks() {
    let dir = tempfile::tempdir().unwrap();
    donor(dir.path());
    let (config, tensors) = model();
    let view = ModelView { config: &config, tensors: &tensors };
    let yaml = ops(
        "  - op: prune\n    granularity: layer\n    ids: [0]\n    mode: remove\n  - op: prune\n    granularity: attention_head\n    ids: [1, 3]\n    mode: remove\n  - op: prune\n    granularity: mlp_channel\n    ids: [0, 5, 63]\n    mode: remove\n  - op: add\n    targets: \"model.layers.*.mlp.down_proj.weight\"\n    source: donor.safetensors\n    key: \"other\"\n    alpha: 0\n",
    );
    // The add names a key of the wrong shape: rejected before anything runs.
    assert!(Surgery::parse(&yaml, dir.path()).unwrap().plan(view).is_err());
    let yaml = yaml.replace("  - op: add\n    targets: \"model.layers.*.mlp.down_proj.weight\"\n    source: donor.safetensors\n    key: \"other\"\n    alpha: 0\n", "");
    let plan = Surgery::parse(&yaml, dir.path()).unwrap().plan(view).unwrap();
    assert_eq!(plan.config.num_hidden_layers, 1);
    assert_eq!(plan.config.layer_types.len(), 1);
    assert_eq!((plan.config.num_attention_heads, plan.config.num_key_value_heads), (2, 2));
    assert_eq!(plan.config.head_dim, 8);
    assert_eq!(plan.config.intermediate_size, 61);
    let q = plan.outputs.iter().find(|o| o.name == "model.layers.0.self_attn.q_proj.weight").unwrap();
    assert_eq!((q.source.as_str(), q.shape.clone()), ("model.layers.1.self_attn.q_proj.weight", vec![16, 32]));
    let down = plan.outputs.iter().find(|o| o.name == "model.layers.0.mlp.down_proj.weight").unwrap();
    assert_eq!(down.shape, vec![32, 61]);
    assert_eq!(plan.removed.len(), 9);
    assert!(!plan.outputs.iter().any(|o| o.name.starts_with("model.layers.1.")));
}

/// A three-layer Qwen3-MoE (layer 1 dense) with Gemma-like per-layer
/// attention types written out, to check the per-layer lists.
fn moe_model() -> (ModelConfig, Vec<ModelTensor>) {
    let mut config = ModelConfig::from_hf(
        Architecture::Qwen3Moe,
        &json!({
            "hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
            "intermediate_size": 64, "vocab_size": 100, "num_experts": 4, "num_experts_per_tok": 2,
            "moe_intermediate_size": 16, "mlp_only_layers": [1]
        }),
    )
    .unwrap();
    // Distinguishable entries: only layer 1 slides.
    config.layer_types[1] = mlxcel_arch::LayerType::SlidingAttention;
    config.sliding_window = Some(8);
    let mut tensors = vec![ModelTensor { name: "model.embed_tokens.weight".into(), shape: vec![100, 32] }];
    for l in 0..3 {
        let mut layer = vec![
            ("input_layernorm.weight", vec![32]),
            ("self_attn.q_proj.weight", vec![32, 32]),
            ("self_attn.o_proj.weight", vec![32, 32]),
        ];
        if l == 1 {
            layer.extend([
                ("mlp.gate_proj.weight", vec![64, 32]),
                ("mlp.up_proj.weight", vec![64, 32]),
                ("mlp.down_proj.weight", vec![32, 64]),
            ]);
        } else {
            layer.extend([
                ("mlp.gate.weight", vec![4, 32]),
                ("mlp.switch_mlp.gate_proj.weight", vec![4, 16, 32]),
                ("mlp.switch_mlp.up_proj.weight", vec![4, 16, 32]),
                ("mlp.switch_mlp.down_proj.weight", vec![4, 32, 16]),
            ]);
        }
        tensors.extend(layer.into_iter().map(|(t, s)| ModelTensor { name: format!("model.layers.{l}.{t}"), shape: s }));
    }
    (config, tensors)
}

fn moe_plan(body: &str) -> mlxcel_surgery::Result<mlxcel_surgery::Plan> {
    let dir = tempfile::tempdir().unwrap();
    let (config, tensors) = moe_model();
    Surgery::parse(&ops(body), dir.path()).unwrap().plan(ModelView { config: &config, tensors: &tensors })
}

#[test]
fn removing_layers_keeps_every_per_layer_list_in_step() {
    use mlxcel_arch::LayerType::*;
    // Two operations: ids always name original layers.
    let plan = moe_plan(
        "  - op: prune\n    granularity: layer\n    ids: [0]\n    mode: remove\n  - op: prune\n    granularity: layer\n    ids: [2]\n    mode: remove\n",
    )
    .unwrap();
    assert_eq!(plan.config.num_hidden_layers, 1);
    assert_eq!(plan.config.layer_types, vec![SlidingAttention]);
    assert_eq!(plan.config.moe.as_ref().unwrap().sparse_layers, vec![false]);
    assert!(plan.outputs.iter().any(|o| o.name == "model.layers.0.mlp.gate_proj.weight"));
    let plan = moe_plan("  - op: prune\n    granularity: layer\n    ids: [1]\n    mode: remove\n").unwrap();
    assert_eq!(plan.config.layer_types, vec![FullAttention, FullAttention]);
    assert_eq!(plan.config.moe.as_ref().unwrap().sparse_layers, vec![true, true]);
}

#[test]
fn mixture_of_experts_layers_refuse_channel_pruning_and_zero_every_expert() {
    let e = moe_plan("  - op: prune\n    granularity: mlp_channel\n    ids: [0]\n    mode: zero\n").unwrap_err();
    assert_eq!(
        e.to_string(),
        "surgery operation #1 (prune, line 3): pruning mlp_channels is not supported for mixture-of-experts layers: layer 0 routes tokens to 4 experts with 16 channels each, not to one MLP of intermediate_size; zero the channels of dense layers only, naming them in `layers`"
    );
    // The dense layer's channels can be zeroed.
    let plan = moe_plan("  - op: prune\n    granularity: mlp_channel\n    ids: [0]\n    layers: [1]\n    mode: zero\n")
        .unwrap();
    assert_eq!(plan.operations[0].matched.len(), 3);
    // Zeroing a mixture-of-experts layer zeroes every expert's output.
    let plan = moe_plan("  - op: prune\n    granularity: layer\n    ids: [2]\n    mode: zero\n").unwrap();
    assert_eq!(
        plan.operations[0].matched,
        vec!["model.layers.2.self_attn.o_proj.weight", "model.layers.2.mlp.switch_mlp.down_proj.weight"]
    );
}

/// Each cause is stated once: an MLX error is in the message, not repeated
/// as the error's `source()` (anyhow's chain printed it twice).
#[test]
fn an_mlx_error_is_stated_once() {
    let e = mlxcel_surgery::SurgeryError::Mlx {
        tensor: "model.norm.weight".into(),
        error: mlxcel_mlx::Error::Invalid { op: "read", message: "no such key".into() },
    };
    assert!(std::error::Error::source(&e).is_none());
    assert!(e.to_string().starts_with("surgery on model.norm.weight: "), "{e}");
}
