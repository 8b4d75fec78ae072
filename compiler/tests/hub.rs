//! `mlxcel-compile owner/name` against a fake Hugging Face hub served on
//! loopback: the download goes through hf-hub into HF_HOME, a transfer cut
//! short resumes from where it stopped (an HTTP range), HF_HUB_OFFLINE
//! compiles from the cache with the hub gone, and an uncached model offline
//! is a clear error.

mod common;

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Output};

use common::{TempDir, python};
use mlxcel_tests::hub::FakeHub;

const REPO: &str = "tiny-org/tiny-llama";
const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

fn compile(model: &str, out: &Path, env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mlxcel-compile"))
        .args([model, "-o", out.to_str().unwrap(), "--quiet"])
        .envs(env.iter().copied())
        .env_remove("HF_TOKEN")
        .output()
        .unwrap()
}

fn read_dir(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let mut data = Vec::new();
            std::fs::File::open(e.path()).unwrap().read_to_end(&mut data).unwrap();
            (e.file_name().to_string_lossy().into_owned(), data)
        })
        .collect()
}

#[test]
fn a_repo_id_downloads_resumes_and_works_offline() {
    let tmp = TempDir::new("hub");
    // A tiny random Llama in Hugging Face layout, made by mlx-lm.
    let src = tmp.path().join("src");
    let script = mlxcel_tests::workspace_root().join("tests/python/tiny_reference.py");
    let out =
        Command::new(python()).arg(&script).args(["llama", src.to_str().unwrap(), "--tokens", "1"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    std::fs::remove_file(src.join("reference.json")).unwrap();
    let mut files = read_dir(&src);
    files.insert("README.md".into(), b"a file the compiler does not need".to_vec());
    let hub = FakeHub::new();
    hub.add_repo(REPO, COMMIT, files);
    hub.cut_once("model.safetensors");
    let endpoint = hub.serve();
    let hf_home = tmp.path().join("hf-home");
    let home = hf_home.to_str().unwrap();

    let bundle = tmp.path().join("from-hub.mlxb");
    let out = compile(REPO, &bundle, &[("HF_ENDPOINT", &endpoint), ("HF_HOME", home)]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // The same model compiled from the local directory gives the same bundle
    // but for the recorded source (provenance names the same files).
    let local = tmp.path().join("local.mlxb");
    assert!(compile(src.to_str().unwrap(), &local, &[]).status.success());
    let (a, b) = (mlxcel_bundle::Bundle::open(&bundle).unwrap(), mlxcel_bundle::Bundle::open(&local).unwrap());
    assert_eq!(a.tensor_count(), b.tensor_count());
    for t in a.tensors() {
        assert_eq!(t.data(), b.tensor(t.name()).unwrap().data(), "{}", t.name());
    }
    let log = hub.log();
    // The cut transfer was resumed with a range starting past zero, and files
    // the compiler does not read were not fetched.
    let resumed = log.iter().any(|l| {
        l.contains("resolve/main/model.safetensors bytes=") && !l.ends_with("bytes=0-") && !l.ends_with("bytes=0-0")
    });
    assert!(resumed, "no resumed range request in {log:?}");
    assert!(!log.iter().any(|l| l.contains("README.md")), "{log:?}");
    assert!(hf_home.join("hub/models--tiny-org--tiny-llama/snapshots").join(COMMIT).join("config.json").exists());

    // Offline: the cache is enough, the hub is not asked.
    let before = hub.log().len();
    let offline = tmp.path().join("offline.mlxb");
    let out =
        compile(REPO, &offline, &[("HF_ENDPOINT", "http://127.0.0.1:9"), ("HF_HOME", home), ("HF_HUB_OFFLINE", "1")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(hub.log().len(), before);

    // Offline without the model in the cache.
    let empty = tmp.path().join("empty-home");
    let out = compile(REPO, &offline, &[("HF_HOME", empty.to_str().unwrap()), ("HF_HUB_OFFLINE", "1")]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("HF_HUB_OFFLINE is set and tiny-org/tiny-llama is not in the Hugging Face cache"), "{err}");

    // A repo the hub does not have.
    let out = compile("tiny-org/missing", &offline, &[("HF_ENDPOINT", &endpoint), ("HF_HOME", home)]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("downloading tiny-org/missing from"), "{err}");
}
