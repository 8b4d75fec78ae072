//! `mlxcel-compile owner/name` against a fake Hugging Face hub served on
//! loopback: the download goes through hf-hub into HF_HOME, a transfer cut
//! short resumes from where it stopped (an HTTP range), HF_HUB_OFFLINE
//! compiles from the cache with the hub gone, and an uncached model offline
//! is a clear error.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

use common::{TempDir, python};

const REPO: &str = "tiny-org/tiny-llama";
const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

/// The files a repo serves, and a log of the requests it answered.
struct FakeHub {
    files: BTreeMap<String, Vec<u8>>,
    log: Mutex<Vec<String>>,
    /// Files whose first full transfer is cut in half (then the connection closes).
    cut_once: Mutex<Vec<String>>,
}

impl FakeHub {
    fn serve(self: Arc<Self>) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let hub = self.clone();
                std::thread::spawn(move || hub.handle(stream));
            }
        });
        format!("http://{addr}")
    }

    fn handle(&self, mut stream: TcpStream) {
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).is_err() {
            return;
        }
        let mut range = None;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                break;
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("range:") {
                range = Some(v.trim().to_string());
            }
        }
        let path = request_line.split_whitespace().nth(1).unwrap_or("").to_string();
        self.log.lock().unwrap().push(format!("{path} {}", range.clone().unwrap_or_default()));
        let info = format!("/api/models/{REPO}/revision/main");
        let resolve = format!("/{REPO}/resolve/main/");
        if path == info {
            let siblings: Vec<_> = self.files.keys().map(|f| serde_json::json!({ "rfilename": f })).collect();
            let body = serde_json::json!({ "id": REPO, "sha": COMMIT, "siblings": siblings }).to_string();
            respond(&mut stream, "200 OK", &[("Content-Type", "application/json".into())], body.as_bytes());
        } else if let Some(data) = path.strip_prefix(&resolve).and_then(|f| self.files.get(f)) {
            let file = path.strip_prefix(&resolve).unwrap().to_string();
            let start: usize = range
                .as_deref()
                .and_then(|r| r.strip_prefix("bytes="))
                .and_then(|r| r.split('-').next())
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            let end = if range.as_deref().is_some_and(|r| r.ends_with("-0")) { 1 } else { data.len() };
            let body = &data[start.min(data.len())..end];
            let headers = [
                ("x-repo-commit", COMMIT.to_string()),
                ("etag", format!("\"{}\"", blake3::hash(data).to_hex())),
                ("Content-Range", format!("bytes {start}-{}/{}", end.saturating_sub(1), data.len())),
            ];
            let mut cut = self.cut_once.lock().unwrap();
            if end > 1 && start == 0 && cut.contains(&file) {
                cut.retain(|f| f != &file);
                // Promise the whole body, send half, hang up.
                let head = format!(
                    "HTTP/1.1 206 Partial Content\r\nContent-Length: {}\r\n{}Connection: close\r\n\r\n",
                    body.len(),
                    headers.iter().map(|(k, v)| format!("{k}: {v}\r\n")).collect::<String>()
                );
                let _ = stream.write_all(head.as_bytes());
                let _ = stream.write_all(&body[..body.len() / 2]);
                return;
            }
            respond(&mut stream, "206 Partial Content", &headers, body);
        } else {
            respond(&mut stream, "404 Not Found", &[], b"not found");
        }
    }
}

fn respond(stream: &mut TcpStream, status: &str, headers: &[(&str, String)], body: &[u8]) {
    let mut head = format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n", body.len());
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let _ = stream.write_all(head.as_bytes());
    let _ = stream.write_all(body);
    let _ = stream.flush();
}

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
    let hub = Arc::new(FakeHub {
        files,
        log: Mutex::new(Vec::new()),
        cut_once: Mutex::new(vec!["model.safetensors".into()]),
    });
    let endpoint = hub.clone().serve();
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
    let log = hub.log.lock().unwrap().clone();
    // The cut transfer was resumed with a range starting past zero, and files
    // the compiler does not read were not fetched.
    let resumed = log.iter().any(|l| {
        l.contains("resolve/main/model.safetensors bytes=") && !l.ends_with("bytes=0-") && !l.ends_with("bytes=0-0")
    });
    assert!(resumed, "no resumed range request in {log:?}");
    assert!(!log.iter().any(|l| l.contains("README.md")), "{log:?}");
    assert!(hf_home.join("hub/models--tiny-org--tiny-llama/snapshots").join(COMMIT).join("config.json").exists());

    // Offline: the cache is enough, the hub is not asked.
    let before = hub.log.lock().unwrap().len();
    let offline = tmp.path().join("offline.mlxb");
    let out =
        compile(REPO, &offline, &[("HF_ENDPOINT", "http://127.0.0.1:9"), ("HF_HOME", home), ("HF_HUB_OFFLINE", "1")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(hub.log.lock().unwrap().len(), before);

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
