//! What a normalized config implies about the tensors of a model: the shape
//! of each canonical (Hugging Face) tensor name, per layer (a mixture-of-
//! experts layer has a router and stacked experts where a dense layer has
//! `gate_proj`/`up_proj`/`down_proj`).

use mlxcel_arch::ModelConfig;

/// The layer index of a canonical `model.layers.N.` name.
pub fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("model.layers.")?.split('.').next()?.parse().ok()
}

/// The feed-forward tensors of a dense layer, which a mixture-of-experts
/// layer does not have.
const DENSE_MLP: [&str; 6] = [
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
    "mlp.gate_proj.bias",
    "mlp.up_proj.bias",
    "mlp.down_proj.bias",
];

/// The feed-forward tensors of a mixture-of-experts layer: the router and the
/// experts stacked along a leading axis (mlx-lm's `switch_mlp` names).
const MOE_MLP: [&str; 4] = [
    "mlp.gate.weight",
    "mlp.switch_mlp.gate_proj.weight",
    "mlp.switch_mlp.up_proj.weight",
    "mlp.switch_mlp.down_proj.weight",
];

/// The shape `config` implies for a canonical tensor name, with the config
/// keys it comes from; `None` for names the config says nothing about.
pub fn expected_shape(config: &ModelConfig, name: &str) -> Option<(Vec<usize>, &'static str)> {
    let h = config.hidden_size;
    if name == "model.embed_tokens.weight" || name == "lm_head.weight" {
        return Some((vec![config.vocab_size, h], "[vocab_size, hidden_size]"));
    }
    if name == "model.norm.weight" {
        return Some((vec![h], "[hidden_size]"));
    }
    let rest = name.strip_prefix("model.layers.")?;
    let (_, leaf) = rest.split_once('.')?;
    let (heads, kv, hd, inter) =
        (config.num_attention_heads, config.num_key_value_heads, config.head_dim, config.intermediate_size);
    // Saturating: a normalized config's sizes fit an i32, but products need not.
    let mul = |a: usize, b: usize| a.saturating_mul(b);
    let moe = config.moe.as_ref();
    Some(match leaf {
        "input_layernorm.weight"
        | "post_attention_layernorm.weight"
        | "pre_feedforward_layernorm.weight"
        | "post_feedforward_layernorm.weight" => (vec![h], "[hidden_size]"),
        "self_attn.q_norm.weight" | "self_attn.k_norm.weight" => (vec![hd], "[head_dim]"),
        "self_attn.q_proj.weight" => (vec![mul(heads, hd), h], "[num_attention_heads * head_dim, hidden_size]"),
        "self_attn.k_proj.weight" | "self_attn.v_proj.weight" => {
            (vec![mul(kv, hd), h], "[num_key_value_heads * head_dim, hidden_size]")
        }
        "self_attn.q_proj.bias" => (vec![mul(heads, hd)], "[num_attention_heads * head_dim]"),
        "self_attn.k_proj.bias" | "self_attn.v_proj.bias" => (vec![mul(kv, hd)], "[num_key_value_heads * head_dim]"),
        "self_attn.o_proj.weight" => (vec![h, mul(heads, hd)], "[hidden_size, num_attention_heads * head_dim]"),
        "self_attn.qkv_proj.weight" => (
            vec![mul(heads.saturating_add(mul(2, kv)), hd), h],
            "[(num_attention_heads + 2 * num_key_value_heads) * head_dim, hidden_size]",
        ),
        "mlp.gate_proj.weight" | "mlp.up_proj.weight" => (vec![inter, h], "[intermediate_size, hidden_size]"),
        "mlp.gate_up_proj.weight" => (vec![mul(2, inter), h], "[2 * intermediate_size, hidden_size]"),
        "mlp.down_proj.weight" => (vec![h, inter], "[hidden_size, intermediate_size]"),
        "mlp.gate.weight" => (vec![moe?.num_experts, h], "[moe.num_experts, hidden_size]"),
        "mlp.switch_mlp.gate_proj.weight" | "mlp.switch_mlp.up_proj.weight" => {
            let m = moe?;
            (
                vec![m.num_experts, m.moe_intermediate_size, h],
                "[moe.num_experts, moe.moe_intermediate_size, hidden_size]",
            )
        }
        "mlp.switch_mlp.down_proj.weight" => {
            let m = moe?;
            (
                vec![m.num_experts, h, m.moe_intermediate_size],
                "[moe.num_experts, hidden_size, moe.moe_intermediate_size]",
            )
        }
        _ => return None,
    })
}

/// Checks one tensor against `config`: its layer exists, it belongs to that
/// layer's kind of feed-forward, and its shape is the one the config implies.
/// The error says what was expected.
pub fn check_tensor(config: &ModelConfig, name: &str, shape: &[usize]) -> Result<(), String> {
    if let Some(l) = layer_of(name) {
        let n = config.num_hidden_layers;
        if l >= n {
            return Err(format!("layer {l} does not exist: num_hidden_layers is {n}"));
        }
        let leaf = name.splitn(4, '.').nth(3).unwrap_or_default();
        let sparse = config.is_moe_layer(l);
        if sparse && DENSE_MLP.contains(&leaf) {
            return Err(format!(
                "layer {l} is a mixture-of-experts layer (moe.sparse_layers): its feed-forward is mlp.gate and mlp.switch_mlp, not a dense MLP"
            ));
        }
        if !sparse && MOE_MLP.contains(&leaf) {
            return Err(format!("layer {l} has a dense MLP (moe.sparse_layers), not a router and experts"));
        }
    }
    match expected_shape(config, name) {
        Some((expected, keys)) if expected != shape => Err(format!("{expected:?} = {keys}")),
        _ => Ok(()),
    }
}
