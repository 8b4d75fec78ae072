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

/// What a replayed decode step writes (`KvCache::replay_row`, GPU step
/// graphs) is the write `reserve` would make for one position: the same
/// position, slot and visible range, in the same buffers; `None` exactly
/// when `reserve` must grow the buffers. A cache moved on by
/// `advance_replayed` continues as one moved on by `commit`.
#[test]
fn replay_rows_are_the_writes_reserve_makes() {
    use std::num::NonZeroUsize;

    use mlxcel_mlx::Dtype;
    use mlxcel_runtime::kv_cache::{CACHE_CHUNK, KvCache, KvLayout};

    let layout = KvLayout { kv_heads: 2, key_dim: 4, value_dim: 4, dtype: Dtype::F32 };
    for window in [None, Some(5), Some(CACHE_CHUNK + 3)] {
        let make = || match window {
            Some(w) => KvCache::sliding(NonZeroUsize::new(w).unwrap()),
            None => KvCache::full(),
        };
        let (mut reserved, mut replayed) = (make(), make());
        let mut grew = 0;
        for step in 0..2 * CACHE_CHUNK + 7 {
            let row = reserved.replay_row().map(|r| (r.offset, r.cache.slot, r.cache.visible, r.cache.causal));
            let capacity = reserved.nbytes();
            let offset = reserved.offset();
            let w = reserved.reserve(1, &layout).unwrap();
            match row {
                Some(row) => {
                    assert_eq!(row, (offset, w.slot, w.visible, w.causal), "window {window:?} step {step}");
                    assert_eq!(reserved.nbytes(), capacity, "window {window:?} step {step}: no growth");
                }
                None => grew += 1,
            }
            reserved.commit(w.keys, w.values, 1);
            // The twin replays where it can.
            if replayed.replay_row().is_some() {
                replayed.advance_replayed();
            } else {
                let w = replayed.reserve(1, &layout).unwrap();
                replayed.commit(w.keys, w.values, 1);
            }
            assert_eq!(replayed.offset(), reserved.offset());
        }
        let growths = match window {
            Some(5) => 1,
            Some(_) => 2,
            None => 3,
        };
        assert_eq!(grew, growths, "window {window:?}: steps that had to grow the buffers");
    }
}
