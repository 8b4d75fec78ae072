//! `model.safetensors.index.json` may name only shards inside the model's
//! directory: `..`, absolute paths and symbolic links leading out are
//! refused naming the index and the shard. The Hugging Face cache's
//! snapshot links into the repository's `blobs` stay allowed.

mod common;

use std::path::Path;

use common::{TempDir, llama_config, llama_dir};
use mlxcel_compiler::ingest::SourceModel;
use serde_json::json;

fn write_index(dir: &Path, shard: &str) {
    let index = json!({"metadata": {}, "weight_map": {"model.embed_tokens.weight": shard}});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
}

#[test]
fn shards_outside_the_model_directory_are_refused() {
    let tmp = TempDir::new("shards");
    let dir = tmp.path().join("model");
    llama_dir(&dir, &llama_config(), false);
    std::os::unix::fs::symlink("/etc/passwd", dir.join("evil.safetensors")).unwrap();
    let index = dir.join("model.safetensors.index.json");
    for (shard, reason) in [
        ("../../../../etc/passwd", "is not a plain path inside the model directory (no `..`, no absolute path)"),
        ("/etc/passwd", "is not a plain path inside the model directory (no `..`, no absolute path)"),
        ("evil.safetensors", "leads outside the model directory (to /etc/passwd)"),
    ] {
        write_index(&dir, shard);
        let e = SourceModel::open(&dir).expect_err("refused").to_string();
        assert_eq!(e, format!("{}: weight_map names the shard {shard:?}, which {reason}", index.display()));
    }
    write_index(&dir, "model.safetensors");
    SourceModel::open(&dir).unwrap();
}

#[test]
fn hugging_face_cache_snapshot_links_into_blobs_are_followed() {
    let tmp = TempDir::new("shards-cache");
    let staging = tmp.path().join("staging");
    llama_dir(&staging, &llama_config(), false);
    let repo = tmp.path().join("models--o--n");
    let snapshot = repo.join("snapshots/abc");
    std::fs::create_dir_all(&snapshot).unwrap();
    std::fs::create_dir_all(repo.join("blobs")).unwrap();
    for f in ["config.json", "tokenizer.json", "model.safetensors"] {
        std::fs::rename(staging.join(f), repo.join("blobs").join(f)).unwrap();
        std::os::unix::fs::symlink(format!("../../blobs/{f}"), snapshot.join(f)).unwrap();
    }
    write_index(&snapshot, "model.safetensors");
    SourceModel::open(&snapshot).unwrap();
}
