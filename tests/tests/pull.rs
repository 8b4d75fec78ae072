//! `mlxcel pull`, `mlxcel list`, and `run`/`mlxcel-server --bundle`
//! pulling on first use, against a fake Hugging Face Hub on loopback
//! (mlxcel_tests::hub): a good pull (resumed after a cut transfer), a second
//! pull from the cache, offline mode, downloads that do not match the index
//! refused and deleted, missing repos and files, and the listing.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use mlxcel_bundle::{Bundle, hex};
use mlxcel_tests::hub::FakeHub;
use mlxcel_tests::server::Server;
use mlxcel_tests::{mlxcel_bin, tiny_bundle};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const COMMIT: &str = "89abcdef0123456789abcdef0123456789abcdef";

/// An index.json entry for `data`, written by hand (the format is what the
/// test pins, independently of the build's writer).
fn entry(name: &str, data: &[u8], root: &str) -> Value {
    json!({
        "name": name,
        "file": format!("{name}.mlxb"),
        "model": "tiny-llama",
        "architecture": "llama",
        "description": "a tiny random Llama",
        "license": "Apache-2.0",
        "source": { "hub": "tiny-org/src", "revision": "0".repeat(40) },
        "options": [],
        "mlxcel_version": "0.1.0",
        "targets": ["cpu"],
        "size": data.len(),
        "blake3_root": root,
        "sha256": hex(&Sha256::digest(data)),
    })
}

fn repo(entries: &[Value], files: &[(&str, &[u8])]) -> BTreeMap<String, Vec<u8>> {
    let index = json!({ "format": 1, "bundles": entries });
    let mut map: BTreeMap<String, Vec<u8>> = files.iter().map(|(f, d)| (f.to_string(), d.to_vec())).collect();
    map.insert("index.json".into(), serde_json::to_vec_pretty(&index).unwrap());
    map
}

struct Env {
    endpoint: String,
    home: PathBuf,
}

impl Env {
    fn mlxcel(&self, args: &[&str], extra: &[(&str, &str)]) -> Output {
        self.mlxcel_in(Path::new("."), args, extra)
    }

    fn mlxcel_in(&self, dir: &Path, args: &[&str], extra: &[(&str, &str)]) -> Output {
        Command::new(mlxcel_bin())
            .current_dir(dir)
            .args(args)
            .env("HF_ENDPOINT", &self.endpoint)
            .env("HF_HOME", &self.home)
            .env("MLXCEL_DEVICE", "cpu")
            .env_remove("HF_TOKEN")
            .env_remove("HF_HUB_OFFLINE")
            .envs(extra.iter().copied())
            .output()
            .unwrap()
    }

    fn cached(&self, repo: &str, file: &str) -> PathBuf {
        self.home
            .join("hub")
            .join(format!("models--{}", repo.replace('/', "--")))
            .join("snapshots")
            .join(COMMIT)
            .join(file)
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn fails_with(out: &Output, parts: &[&str]) {
    assert!(!out.status.success(), "succeeded: {}", text(&out.stdout));
    let err = text(&out.stderr);
    for part in parts {
        assert!(err.contains(part), "{part:?} missing from: {err}");
    }
}

/// The blobs of a cached repo whose length is `len` (a refused download must leave none).
fn blobs_of_len(env: &Env, repo: &str, len: usize) -> Vec<PathBuf> {
    let dir = env.home.join("hub").join(format!("models--{}", repo.replace('/', "--"))).join("blobs");
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| std::fs::metadata(p).is_ok_and(|m| m.len() == len as u64))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn pull_checks_downloads_against_the_index() {
    let dir = tempfile::tempdir().unwrap();
    let good = std::fs::read(tiny_bundle(dir.path(), "llama", 4)).unwrap();
    let root = hex(&Bundle::from_bytes(&good).unwrap().root_hash());
    // A byte of the last tensor flipped: the header (root hash) is unchanged.
    let mut flipped = good.clone();
    let last = Bundle::from_bytes(&good).unwrap().tensors().map(|t| t.offset()).max().unwrap() as usize;
    flipped[last] ^= 1;
    let flipped_root = hex(&Bundle::from_bytes(&flipped).unwrap().root_hash());
    assert_eq!(flipped_root, root);

    let hub = FakeHub::new();
    let tiny = entry("tiny", &good, &root);
    hub.add_repo("tiny-org/bundles", COMMIT, repo(std::slice::from_ref(&tiny), &[("tiny.mlxb", &good)]));
    hub.cut_once("tiny.mlxb");
    // The catalog's repo, serving the tiny model under a catalog name.
    let catalog_name = "smollm2-135m-instruct-q4";
    hub.add_repo(
        "mlxcel/bundles",
        COMMIT,
        repo(&[entry(catalog_name, &good, &root)], &[(&format!("{catalog_name}.mlxb"), &good)]),
    );
    // Served bytes differ from what the index says (sha256).
    hub.add_repo("tiny-org/corrupt", COMMIT, repo(std::slice::from_ref(&tiny), &[("tiny.mlxb", &flipped)]));
    // The index's root hash is not the file's.
    let mut lying = tiny.clone();
    lying["blake3_root"] = json!("0".repeat(64));
    hub.add_repo("tiny-org/lying-root", COMMIT, repo(&[lying], &[("tiny.mlxb", &good)]));
    // The index describes the damaged file exactly: only hashing every byte catches it.
    hub.add_repo("tiny-org/damaged", COMMIT, repo(&[entry("tiny", &flipped, &root)], &[("tiny.mlxb", &flipped)]));
    hub.add_repo("tiny-org/two", COMMIT, repo(&[tiny.clone(), entry("other", &good, &root)], &[]));
    hub.add_repo("tiny-org/no-file", COMMIT, repo(std::slice::from_ref(&tiny), &[]));
    let env = Env { endpoint: hub.serve(), home: dir.path().join("hf-home") };

    // A good pull: the cut transfer resumed, the path printed.
    let out = env.mlxcel(&["pull", "tiny-org/bundles"], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let cached = env.cached("tiny-org/bundles", "tiny.mlxb");
    assert_eq!(text(&out.stdout).trim(), cached.display().to_string());
    assert_eq!(std::fs::read(&cached).unwrap(), good);
    let err = text(&out.stderr);
    assert!(err.contains("downloaded") && err.contains(&root[..16]), "{err}");
    let log = hub.log();
    let resumed = log
        .iter()
        .any(|l| l.contains("/resolve/main/tiny.mlxb bytes=") && !l.ends_with("bytes=0-") && !l.ends_with("bytes=0-0"));
    assert!(resumed, "no resumed range request in {log:?}");

    // Again: the cache has it; only the index is asked for.
    let before = hub.log().len();
    let out = env.mlxcel(&["pull", "tiny-org/bundles@main"], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("in the cache"), "{}", text(&out.stderr));
    let asked: Vec<String> = hub.log()[before..].to_vec();
    assert!(asked.iter().all(|l| l.contains("index.json")), "{asked:?}");

    // Offline: no request at all; offline with an empty cache: a clear error.
    let before = hub.log().len();
    let offline = [("HF_HUB_OFFLINE", "1"), ("HF_ENDPOINT", "http://127.0.0.1:9")];
    let out = env.mlxcel(&["pull", "tiny-org/bundles"], &offline);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(hub.log().len(), before);
    let empty = dir.path().join("empty-home");
    let out = env.mlxcel(&["pull", "tiny-org/bundles"], &[offline[0], ("HF_HOME", empty.to_str().unwrap())]);
    fails_with(&out, &["HF_HUB_OFFLINE is set and tiny-org/bundles@main has no index.json in the Hugging Face cache"]);

    // A catalog name resolves to the catalog's repo.
    let out = env.mlxcel(&["pull", catalog_name], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout).trim(),
        env.cached("mlxcel/bundles", &format!("{catalog_name}.mlxb")).display().to_string()
    );
    fails_with(
        &env.mlxcel(&["pull", "no-such-model"], &[]),
        &["\"no-such-model\" is not in mlxcel's catalog", catalog_name],
    );

    // Downloads that are not what the index says: refused, named, deleted.
    let out = env.mlxcel(&["pull", "tiny-org/corrupt"], &[]);
    let found = hex(&Sha256::digest(&flipped));
    fails_with(
        &out,
        &[
            "tiny-org/corrupt@main: tiny.mlxb: the sha256 is",
            &found,
            tiny["sha256"].as_str().unwrap(),
            "refused and deleted",
        ],
    );
    let out = env.mlxcel(&["pull", "tiny-org/lying-root"], &[]);
    fails_with(&out, &["tiny-org/lying-root@main: tiny.mlxb: the blake3 root hash is", &root, &"0".repeat(64)]);
    let out = env.mlxcel(&["pull", "tiny-org/damaged"], &[]);
    fails_with(&out, &["tiny-org/damaged@main: tiny.mlxb: the content is", "tensor", "refused and deleted"]);
    for repo in ["tiny-org/corrupt", "tiny-org/lying-root", "tiny-org/damaged"] {
        assert!(!env.cached(repo, "tiny.mlxb").exists(), "{repo}: the refused file is still cached");
        assert_eq!(blobs_of_len(&env, repo, good.len()), Vec::<PathBuf>::new(), "{repo}: a blob is left");
    }

    // Missing repos, files and names.
    fails_with(
        &env.mlxcel(&["pull", "tiny-org/missing"], &[]),
        &["has no index.json in tiny-org/missing@main", "HTTP 404"],
    );
    fails_with(&env.mlxcel(&["pull", "tiny-org/no-file"], &[]), &["has no tiny.mlxb in tiny-org/no-file@main"]);
    fails_with(&env.mlxcel(&["pull", "tiny-org/bundles@v9"], &[]), &["has no index.json in tiny-org/bundles@v9"]);
    fails_with(
        &env.mlxcel(&["pull", "tiny-org/two"], &[]),
        &["several bundles (tiny, other): name one as tiny-org/two/NAME"],
    );
    fails_with(
        &env.mlxcel(&["pull", "tiny-org/bundles/nope"], &[]),
        &["index.json has no bundle \"nope\" (it has: tiny)"],
    );

    // The listing: what pull verified, with size, model and root hash.
    let out = env.mlxcel(&["list"], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    for part in ["tiny-org/bundles/tiny.mlxb (main)", "tiny-llama", &root, "yes", "2 bundle(s)"] {
        assert!(table.contains(part), "{part:?} missing from:\n{table}");
    }
    assert!(!table.contains("corrupt") && !table.contains("damaged"), "{table}");
    let listed: Value = serde_json::from_slice(&env.mlxcel(&["list", "--json"], &[]).stdout).unwrap();
    assert_eq!(listed[1]["size"], json!(good.len()));
    assert_eq!(listed[1]["path"], json!(cached));
    let out = env.mlxcel(&["list"], &[("HF_HOME", empty.to_str().unwrap())]);
    assert!(out.status.success() && text(&out.stderr).contains("no bundles in the Hugging Face cache"));
}

#[test]
fn run_and_the_server_pull_on_first_use() {
    let dir = tempfile::tempdir().unwrap();
    let good = std::fs::read(tiny_bundle(dir.path(), "llama", 4)).unwrap();
    let root = hex(&Bundle::from_bytes(&good).unwrap().root_hash());
    let hub = FakeHub::new();
    hub.add_repo("tiny-org/runnable", COMMIT, repo(&[entry("tiny", &good, &root)], &[("tiny.mlxb", &good)]));
    let env = Env { endpoint: hub.serve(), home: dir.path().join("hf-home") };

    let generate = ["run", "tiny-org/runnable", "-p", "hello", "-n", "4"];
    let out = env.mlxcel(&generate, &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("downloaded"), "{}", text(&out.stderr));
    assert!(env.cached("tiny-org/runnable", "tiny.mlxb").exists());
    // Later runs use the cache without asking the Hub.
    let before = hub.log().len();
    let again = env.mlxcel(&generate, &[]);
    assert!(again.status.success(), "{}", text(&again.stderr));
    assert_eq!(text(&again.stdout), text(&out.stdout));
    assert_eq!(hub.log().len(), before);
    // A file that exists always wins over a repo of the same name.
    std::fs::create_dir_all(dir.path().join("tiny-org")).unwrap();
    std::fs::write(dir.path().join("tiny-org/other"), &good).unwrap();
    let local = env.mlxcel_in(dir.path(), &["run", "tiny-org/other", "-p", "hello", "-n", "4"], &[]);
    assert!(local.status.success(), "{}", text(&local.stderr));
    assert_eq!(hub.log().len(), before);
    // A missing file that is not a reference is said to be missing.
    let missing = env.mlxcel(&["run", "missing.mlxb", "-p", "x"], &[]);
    assert!(!missing.status.success());
    assert_eq!(hub.log().len(), before);

    // mlxcel-server --bundle owner/repo, from a fresh cache.
    let server_home = dir.path().join("server-home");
    let server = Server::start_env(
        Path::new("tiny-org/runnable"),
        &[],
        &[("HF_ENDPOINT", &env.endpoint), ("HF_HOME", server_home.to_str().unwrap())],
    );
    assert!(server.log().contains("downloaded and verified"), "{}", server.log());
    let (status, body) = server.get("/v1/models");
    assert_eq!(status, 200, "{body}");
    assert!(server_home.join("hub/models--tiny-org--runnable/snapshots").join(COMMIT).join("tiny.mlxb").exists());
}
