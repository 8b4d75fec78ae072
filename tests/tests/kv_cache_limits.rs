//! The KV cache's window limits: `--max-kv-size 0` (a remainder by zero in
//! the sliding ring's arithmetic) and absurd sizes are refused when the
//! backend is built, with an error naming the parameter, and a window of
//! one position (the smallest ring) still generates.

use mlxcel_runtime::backend::{Backend, MlxBackend, MlxOptions};
use mlxcel_runtime::kv_cache::MAX_KV_POSITIONS;
use mlxcel_runtime::models;
use mlxcel_tests::tiny::tiny_model;

#[test]
fn zero_and_absurd_max_kv_are_refused_and_one_position_works() {
    let dir = tempfile::tempdir().unwrap();
    let tiny = tiny_model(dir.path(), "llama", 0, 1);
    let backend = |max_kv| {
        let model = models::build(&tiny.config, &tiny.weights).unwrap();
        MlxBackend::new(model, MlxOptions { prefill_chunk: 4, max_kv: Some(max_kv) })
    };
    for (max_kv, message) in [
        (0, "must be at least 1 position".to_string()),
        (
            MAX_KV_POSITIONS + 1,
            format!("{} positions is more than the limit of {MAX_KV_POSITIONS}", MAX_KV_POSITIONS + 1),
        ),
    ] {
        let err = backend(max_kv).err().expect("refused").to_string();
        assert_eq!(err, format!("invalid parameter max_kv_size: {message}"));
    }
    // A one-position ring: prefill chunks and decode steps wrap at every position.
    let mut b = backend(1).unwrap();
    let seq = b.new_sequence();
    let prompt: Vec<u32> = (1..11).collect();
    assert!(b.prefill(seq, &prompt, true).unwrap().is_some());
    for t in 0..3 {
        assert_eq!(b.decode(&[(seq, t)]).unwrap().len(), 1);
    }
    assert_eq!(b.position(seq).unwrap(), prompt.len() + 3);
}
