//! A real `mlxcel-server` on loopback for end-to-end tests: started on a
//! free port, its log captured, driven over HTTP (ureq), killed when dropped.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::mlxcel_server_bin;

/// A running server; killed when dropped.
pub struct Server {
    /// The server process.
    pub child: Child,
    /// Where it listens (`127.0.0.1:PORT`).
    pub addr: String,
    log: Arc<Mutex<String>>,
}

impl Server {
    /// Starts `mlxcel-server --bundle BUNDLE --port 0 ARGS` and waits for
    /// its startup line (not for the model).
    pub fn spawn(bundle: &Path, args: &[&str]) -> Server {
        Server::spawn_env(bundle, args, &[])
    }

    /// [`Server::spawn`] with environment variables.
    pub fn spawn_env(bundle: &Path, args: &[&str], env: &[(&str, &str)]) -> Server {
        let mut child = Command::new(mlxcel_server_bin())
            .args(["--bundle", bundle.to_str().unwrap(), "--port", "0"])
            // One kernel thread each: tests run side by side on few cores.
            .args(if args.contains(&"--threads") { &[][..] } else { &["--threads", "1"][..] })
            .args(args)
            .env("MLXCEL_DEVICE", "cpu")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting mlxcel-server");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        {
            let log = log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    if let Some(rest) = line.split("listening on http://").nth(1) {
                        let _ = tx.send(rest.split_whitespace().next().unwrap_or("").to_string());
                    }
                    log.lock().unwrap().push_str(&(line + "\n"));
                }
            });
        }
        let addr = rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("mlxcel-server printed no address:\n{}", log.lock().unwrap()));
        Server { child, addr, log }
    }

    /// Starts a server and waits until /health answers 200.
    pub fn start(bundle: &Path, args: &[&str]) -> Server {
        Server::start_env(bundle, args, &[])
    }

    /// [`Server::start`] with environment variables.
    pub fn start_env(bundle: &Path, args: &[&str], env: &[(&str, &str)]) -> Server {
        let server = Server::spawn_env(bundle, args, env);
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let (status, _) = server.get("/health");
            if status == 200 {
                return server;
            }
            assert!(Instant::now() < deadline, "not healthy in time:\n{}", server.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn agent() -> ureq::Agent {
        ureq::Agent::config_builder().http_status_as_error(false).build().into()
    }

    /// GET: status and body text.
    pub fn get(&self, path: &str) -> (u16, String) {
        self.get_with(path, &[])
    }

    pub fn get_with(&self, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
        let mut request = Server::agent().get(&self.url(path));
        for (k, v) in headers {
            request = request.header(*k, *v);
        }
        match request.call() {
            Ok(mut r) => (r.status().as_u16(), r.body_mut().read_to_string().unwrap_or_default()),
            Err(_) => (0, String::new()),
        }
    }

    /// POST a raw body: status, headers we check, and body text.
    pub fn post_raw(&self, path: &str, body: &str, headers: &[(&str, &str)]) -> (u16, Option<String>, String) {
        let mut request = Server::agent().post(&self.url(path)).header("content-type", "application/json");
        for (k, v) in headers {
            request = request.header(*k, *v);
        }
        let mut r = request.send(body).expect("POST");
        let retry = r.headers().get("retry-after").map(|v| v.to_str().unwrap().to_string());
        let text = r.body_mut().with_config().limit(64 << 20).read_to_string().unwrap();
        (r.status().as_u16(), retry, text)
    }

    /// POST JSON: status and JSON body.
    pub fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let (status, _, text) = self.post_raw(path, &body.to_string(), &[]);
        (status, serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}")))
    }

    /// POST a streamed request: status and the `data:` payloads.
    pub fn post_stream(&self, path: &str, body: &Value) -> (u16, Vec<String>) {
        let (status, _, text) = self.post_raw(path, &body.to_string(), &[]);
        (status, sse_data(&text))
    }

    /// A metric's value from /metrics.
    pub fn metric(&self, name: &str) -> f64 {
        let (status, text) = self.get("/metrics");
        assert_eq!(status, 200, "{text}");
        text.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
            .unwrap_or_else(|| panic!("no {name} in\n{text}"))
            .trim()
            .parse()
            .unwrap()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM and waits (20 s at most) for the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let status = Command::new("kill").args(["-TERM", &self.pid().to_string()]).status().unwrap();
        assert!(status.success());
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "the server did not exit:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `data:` payloads of an SSE body.
pub fn sse_data(text: &str) -> Vec<String> {
    text.split("\n\n")
        .filter_map(|event| event.lines().find_map(|l| l.strip_prefix("data: ")).map(str::to_string))
        .collect()
}
