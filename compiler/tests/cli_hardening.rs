//! `mlxcel-compile` on hostile command lines and in hostile environments:
//! an output that is an input, a directory or unwritable is refused before
//! any work, naming the flag; a signal mid-compile leaves no temporary file
//! and exits with 128 + the signal; a closed or full stdout never panics.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{GEMMA3, SMOLLM2, TempDir, model};

fn compile_bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_mlxcel-compile"));
    c.env("MLXCEL_DEVICE", "cpu");
    c
}

fn run(args: &[&str]) -> Output {
    compile_bin().args(args).output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn leftovers(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp") || n.contains("probe"))
        .collect()
}

/// A copy of SmolLM2 in `dir` (the test may try to overwrite it).
fn smollm2_copy(dir: &Path) -> PathBuf {
    let p = dir.join("s.gguf");
    std::fs::copy(model(SMOLLM2), &p).unwrap();
    p
}

#[test]
fn outputs_that_cannot_or_must_not_be_written_are_refused_before_any_work() {
    let tmp = TempDir::new("cli-output");
    let src = smollm2_copy(tmp.path());
    let src_s = src.to_str().unwrap();
    let before = std::fs::read(&src).unwrap().len();
    let hard = tmp.path().join("hard.mlxb");
    std::fs::hard_link(&src, &hard).unwrap();
    let dir = tmp.path().join("d");
    std::fs::create_dir(&dir).unwrap();
    // A stand-in for a device such as /dev/full: the rename would replace it.
    let fifo = tmp.path().join("fifo");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    for (out, expected) in [
        (src.clone(), format!("error: -o/--output {src_s}: is the input {src_s}; the bundle would replace it")),
        (
            hard.clone(),
            format!("error: -o/--output {}: is the input {src_s}; the bundle would replace it", hard.display()),
        ),
        (dir.clone(), format!("error: -o/--output {}: is a directory; give the bundle's file name", dir.display())),
        (
            fifo.clone(),
            format!(
                "error: -o/--output {}: exists and is not a regular file; give the bundle's file name",
                fifo.display()
            ),
        ),
        (
            PathBuf::from("/nonexistent-dir/x.mlxb"),
            "error: -o/--output /nonexistent-dir/x.mlxb: the directory /nonexistent-dir does not exist".into(),
        ),
        // Not even root can create a file in /proc.
        (PathBuf::from("/proc/x.mlxb"), "error: -o/--output /proc/x.mlxb: cannot create a file in /proc: ".into()),
    ] {
        let start = Instant::now();
        let o = run(&[src_s, "-o", out.to_str().unwrap(), "--quiet"]);
        assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
        let e = stderr(&o);
        assert!(e.starts_with(&expected), "{e:?} should start with {expected:?}");
        assert_eq!(e.lines().count(), 1, "{e}");
        // Refused before reading the model: well under the second a compile takes.
        assert!(start.elapsed() < Duration::from_millis(900), "{:?}", start.elapsed());
    }
    assert_eq!(std::fs::read(&src).unwrap().len(), before, "the source is intact");
    assert!(leftovers(tmp.path()).is_empty(), "{:?}", leftovers(tmp.path()));
}

#[test]
fn a_file_inside_a_model_directory_is_an_input_too() {
    let tmp = TempDir::new("cli-hf-input");
    let dir = tmp.path().join("model");
    common::llama_dir(&dir, &common::llama_config(), false);
    let out = dir.join("model.safetensors");
    let o = run(&[dir.to_str().unwrap(), "-o", out.to_str().unwrap(), "--quiet"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("is the input"), "{}", stderr(&o));
    assert!(safetensors::SafeTensors::deserialize(&std::fs::read(&out).unwrap()).is_ok(), "intact");
}

#[test]
fn a_signal_mid_compile_leaves_nothing_and_exits_with_128_plus_the_signal() {
    let tmp = TempDir::new("cli-signal");
    let gemma = model(GEMMA3);
    for (signal, number) in [("INT", 2), ("TERM", 15), ("HUP", 1)] {
        let out = tmp.path().join(format!("g-{signal}.mlxb"));
        let mut child = compile_bin()
            .args([gemma.to_str().unwrap(), "-o", out.to_str().unwrap(), "--quiet"])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Wait until the temporary bundle holds real data (mid-way).
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let partial = std::fs::read_dir(tmp.path())
                .unwrap()
                .filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().contains(".tmp"))
                .any(|e| e.metadata().is_ok_and(|m| m.len() > 8 << 20));
            if partial {
                break;
            }
            assert!(child.try_wait().unwrap().is_none(), "the compile ended before it could be interrupted");
            assert!(Instant::now() < deadline, "no partial bundle appeared");
            std::thread::sleep(Duration::from_millis(10));
        }
        let kill = Command::new("kill").args([&format!("-{signal}"), &child.id().to_string()]).status().unwrap();
        assert!(kill.success());
        let o = child.wait_with_output().unwrap();
        assert_eq!(o.status.code(), Some(128 + number), "SIG{signal}: {}", stderr(&o));
        assert!(stderr(&o).contains(&format!("interrupted by SIG{signal}")), "{}", stderr(&o));
        assert!(leftovers(tmp.path()).is_empty(), "SIG{signal} left {:?}", leftovers(tmp.path()));
        assert!(!out.exists());
    }
}

#[test]
fn a_closed_or_full_stdout_is_an_error_not_a_panic() {
    let tmp = TempDir::new("cli-stdout");
    let src = smollm2_copy(tmp.path());
    let out = tmp.path().join("r.mlxb");
    let args = [src.to_str().unwrap(), "-o", out.to_str().unwrap(), "--quiet", "--report"];
    // A reader that has gone: the first write fails with EPIPE.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let o = compile_bin().args(args).stdout(writer).output().unwrap();
    assert_eq!(o.status.code(), Some(141), "{}", stderr(&o));
    assert!(!stderr(&o).contains("panicked"), "{}", stderr(&o));
    assert!(!stderr(&o).contains("error"), "nobody to tell: {}", stderr(&o));
    // A full device: one error, stated once.
    let full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
    let o = compile_bin().args(args).stdout(full).output().unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains("error: writing to standard output: No space left on device (os error 28)\n"), "{e}");
    assert_eq!(e.matches("No space left").count(), 1, "{e}");
    assert!(!e.contains("panicked"), "{e}");
}
