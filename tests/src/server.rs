//! Running the `mlxcel-server` binary in tests: find it next to the test
//! executable, start it on a free loopback port, wait for `/health` to answer
//! 200, and stop it with SIGTERM.
//!
//! The HTTP probe of `/health` is a plain HTTP/1.1 GET over `TcpStream`, so
//! this module needs no HTTP client crate.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::{mlxcel_bin, workspace_root};

/// How long a server may take from spawn to `/health` 200.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a server may take to exit after SIGTERM.
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(60);

/// Whether the workspace declares the `mlxcel-server` binary (in
/// `cli/Cargo.toml`). Tests of the server skip, saying so, while it does not;
/// once it does, a missing binary is a failure.
pub fn server_declared() -> bool {
    let manifest = workspace_root().join("cli/Cargo.toml");
    let text = std::fs::read_to_string(&manifest).unwrap_or_else(|e| panic!("reading {}: {e}", manifest.display()));
    text.lines().any(|l| l.trim().replace(' ', "") == "name=\"mlxcel-server\"")
}

/// The `mlxcel-server` binary built for this test run (beside `mlxcel`).
pub fn mlxcel_server_bin() -> PathBuf {
    let p = mlxcel_bin().with_file_name("mlxcel-server");
    assert!(p.is_file(), "{} is missing: build the workspace first (cargo build)", p.display());
    p
}

/// A loopback port that was free a moment ago: bind 127.0.0.1:0, read the
/// port the kernel gave, and release it (servers are not assumed to accept
/// `--port 0`).
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local address").port()
}

/// The status code of `GET path` on 127.0.0.1:port, or `None` when nothing
/// answers (connection refused, timeout, not HTTP).
pub fn http_get_status(port: u16, path: &str) -> Option<u16> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    stream.set_write_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n").ok()?;
    let mut head = [0u8; 64];
    let mut n = 0;
    while n < 12 {
        match stream.read(&mut head[n..]) {
            Ok(0) | Err(_) => break,
            Ok(k) => n += k,
        }
    }
    let line = std::str::from_utf8(&head[..n]).ok()?;
    let code = line.strip_prefix("HTTP/1.")?.get(2..5)?;
    code.parse().ok()
}

/// A running `mlxcel-server`; killed on drop if [`SpawnedServer::stop`] was
/// not called.
pub struct SpawnedServer {
    child: Option<Child>,
    port: u16,
    log: PathBuf,
}

impl SpawnedServer {
    /// The loopback port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:PORT`.
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// What the server wrote to stdout and stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_else(|e| format!("(reading {}: {e})", self.log.display()))
    }

    /// Sends SIGTERM and waits for the process to exit; panics, with its log,
    /// when it is still running after [`SHUTDOWN_TIMEOUT`]. Returns its exit
    /// status.
    pub fn stop(mut self) -> ExitStatus {
        let mut child = self.child.take().expect("a running server");
        let pid = child.id().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status().expect("running kill");
        assert!(sent.success(), "kill -TERM {pid} failed");
        let start = Instant::now();
        loop {
            if let Some(status) = child.try_wait().expect("waiting for the server") {
                return status;
            }
            if start.elapsed() > SHUTDOWN_TIMEOUT {
                let _ = child.kill();
                let _ = child.wait();
                panic!("mlxcel-server did not exit within {SHUTDOWN_TIMEOUT:?} of SIGTERM; its log:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for SpawnedServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Starts `mlxcel-server --bundle BUNDLE --host 127.0.0.1 --port P ARGS...`
/// on a free port, on the CPU (`MLXCEL_DEVICE=cpu`), with its output in
/// `log_dir/server.log`, and waits until `GET /health` answers 200. Panics,
/// with the server's log, when it exits first or takes longer than
/// [`STARTUP_TIMEOUT`].
pub fn spawn_server(bundle: &Path, args: &[&str], log_dir: &Path) -> SpawnedServer {
    let port = free_port();
    let log = log_dir.join("server.log");
    let out = std::fs::File::create(&log).unwrap_or_else(|e| panic!("creating {}: {e}", log.display()));
    let err = out.try_clone().expect("clone the log file");
    let child = Command::new(mlxcel_server_bin())
        .arg("--bundle")
        .arg(bundle)
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(args)
        .env("MLXCEL_DEVICE", "cpu")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", mlxcel_server_bin().display()));
    let mut server = SpawnedServer { child: Some(child), port, log };
    let start = Instant::now();
    loop {
        if let Some(status) = server.child.as_mut().expect("child").try_wait().expect("waiting for the server") {
            server.child = None;
            panic!("mlxcel-server exited before /health answered 200 ({status}); its log:\n{}", server.log());
        }
        if http_get_status(port, "/health") == Some(200) {
            return server;
        }
        if start.elapsed() > STARTUP_TIMEOUT {
            panic!("mlxcel-server's /health did not answer 200 within {STARTUP_TIMEOUT:?}; its log:\n{}", server.log());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
