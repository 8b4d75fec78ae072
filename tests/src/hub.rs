//! A fake Hugging Face Hub on loopback: a real HTTP server in the test
//! process that answers what hf-hub asks (`/api/models/REPO/revision/REV`,
//! `/REPO/resolve/REV/FILE` with ranges, `etag` and `x-repo-commit`), logs
//! every request, and can cut a transfer short once to exercise resuming.
//! The compiler's hub test and the `mlxcel pull` tests use it.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

/// One repo: its commit and files.
struct FakeRepo {
    commit: String,
    files: BTreeMap<String, Vec<u8>>,
}

/// The fake hub's repos and what it was asked.
#[derive(Default)]
pub struct FakeHub {
    repos: Mutex<BTreeMap<String, FakeRepo>>,
    log: Mutex<Vec<String>>,
    /// Files whose first full transfer is cut in half (then the connection closes).
    cut_once: Mutex<Vec<String>>,
}

impl FakeHub {
    /// An empty hub.
    pub fn new() -> Arc<FakeHub> {
        Arc::new(FakeHub::default())
    }

    /// Adds (or replaces) the repo `id` at `commit` with `files`; it answers
    /// for revision `main` and for the commit itself.
    pub fn add_repo(&self, id: &str, commit: &str, files: BTreeMap<String, Vec<u8>>) {
        self.repos.lock().unwrap().insert(id.to_string(), FakeRepo { commit: commit.to_string(), files });
    }

    /// Cuts the first full transfer of `file` (in any repo) in half.
    pub fn cut_once(&self, file: &str) {
        self.cut_once.lock().unwrap().push(file.to_string());
    }

    /// Every request so far: `PATH RANGE` (the range empty when none).
    pub fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// Starts serving on a free loopback port; returns the endpoint URL
    /// (for `HF_ENDPOINT`). The server lives as long as the test process.
    pub fn serve(self: &Arc<Self>) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let hub = self.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let hub = hub.clone();
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
        let repos = self.repos.lock().unwrap();
        // /api/models/OWNER/NAME/revision/REV
        if let Some(rest) = path.strip_prefix("/api/models/") {
            let parts: Vec<&str> = rest.splitn(4, '/').collect();
            if let [owner, name, "revision", rev] = parts.as_slice()
                && let Some(repo) = repos.get(&format!("{owner}/{name}")).filter(|r| answers(r, rev))
            {
                let siblings: Vec<_> = repo.files.keys().map(|f| serde_json::json!({ "rfilename": f })).collect();
                let body =
                    serde_json::json!({ "id": format!("{owner}/{name}"), "sha": repo.commit, "siblings": siblings });
                return respond(
                    &mut stream,
                    "200 OK",
                    &[("Content-Type", "application/json".into())],
                    body.to_string().as_bytes(),
                );
            }
            return respond(&mut stream, "404 Not Found", &[], b"not found");
        }
        // /OWNER/NAME/resolve/REV/FILE
        let parts: Vec<&str> = path.trim_start_matches('/').splitn(5, '/').collect();
        let found = match parts.as_slice() {
            [owner, name, "resolve", rev, file] => repos
                .get(&format!("{owner}/{name}"))
                .filter(|r| answers(r, rev))
                .and_then(|r| r.files.get(*file).map(|data| (r.commit.clone(), file.to_string(), data.clone()))),
            _ => None,
        };
        drop(repos);
        let Some((commit, file, data)) = found else {
            return respond(&mut stream, "404 Not Found", &[], b"not found");
        };
        let start: usize = range
            .as_deref()
            .and_then(|r| r.strip_prefix("bytes="))
            .and_then(|r| r.split('-').next())
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let end = if range.as_deref().is_some_and(|r| r.ends_with("-0")) { 1 } else { data.len() };
        let body = &data[start.min(data.len())..end];
        let headers = [
            ("x-repo-commit", commit),
            ("etag", format!("\"{}\"", blake3::hash(&data).to_hex())),
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
        drop(cut);
        respond(&mut stream, "206 Partial Content", &headers, body);
    }
}

/// Whether `repo` answers for revision `rev` (main, or its commit).
fn answers(repo: &FakeRepo, rev: &str) -> bool {
    rev == "main" || rev == repo.commit
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
