//! Building a model's forward steps by hand, to look at their graphs before
//! they are evaluated (node counts, which operations a step runs).

use mlxcel_mlx::{Array, fast};
use mlxcel_runtime::kv_cache::{BatchCaches, KvCache};
use mlxcel_runtime::models::LanguageModel;

/// Runs `steps` through `model` on one fresh sequence, evaluating each, and
/// returns the operations (MLX primitive names) the LAST step's graph held
/// before it was evaluated: its logits and its cache writes.
pub fn last_step_ops(model: &dyn LanguageModel, steps: &[&[u32]]) -> Vec<String> {
    let mut caches: Vec<KvCache> = model.new_caches(None);
    let mut ops = Vec::new();
    for tokens in steps {
        let input = Array::from_slice(tokens, &[1, tokens.len() as i32]).unwrap();
        let hidden = model.hidden_states(&input, &mut BatchCaches::new(&mut [&mut caches])).unwrap();
        let logits = model.logits(&hidden).unwrap();
        let mut outputs: Vec<&Array> = caches.iter().flat_map(KvCache::arrays).collect();
        outputs.push(&logits);
        ops = fast::pending_ops(&outputs);
        fast::eval(&outputs).unwrap();
    }
    ops
}
