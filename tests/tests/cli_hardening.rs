//! `mlxcel` under hostile conditions: a closed or full stdout, a closed
//! stderr, Ctrl-C, chat input that is not UTF-8 or does not fit, numeric
//! flags out of range, and bad generation defaults stored in a bundle. No
//! case may panic; each ends with the documented exit code and one clear
//! message.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use mlxcel_tests::{mlxcel_bin, tiny_bundle};

fn command(args: &[&str]) -> Command {
    let mut c = Command::new(mlxcel_bin());
    c.args(args).env("MLXCEL_DEVICE", "cpu").env("RUST_BACKTRACE", "0");
    c
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Runs `mlxcel args` with `stdin` as its input.
fn mlxcel(args: &[&str], stdin: &[u8]) -> Output {
    let mut child =
        command(args).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("start");
    child.stdin.take().expect("stdin").write_all(stdin).expect("write stdin");
    child.wait_with_output().expect("mlxcel runs")
}

/// Waits for `child` to exit, killing it (and failing) after `limit`.
fn wait_at_most(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("mlxcel did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn stderr_of(child: &mut Child) -> String {
    let mut err = String::new();
    child.stderr.take().expect("stderr").read_to_string(&mut err).expect("read stderr");
    err
}

fn signal(child: &Child, name: &str) {
    let status = Command::new("kill").args(["-s", name, &child.id().to_string()]).status().expect("kill");
    assert!(status.success());
}

/// A copy of the unquantized tiny bundle `source` whose generation defaults
/// are `defaults` and whose chat template is `template` (else the same).
fn rebuilt(source: &Path, defaults: &str, template: Option<&str>, out: &Path) -> PathBuf {
    use mlxcel_bundle::{Bundle, BundleWriter, ModelInfo, TensorSpec};
    let b = Bundle::open(source).unwrap();
    let model = ModelInfo {
        architecture: b.architecture().into(),
        name: b.model_name().into(),
        config_json: b.config_json().into(),
    };
    let mut w = BundleWriter::create(out, model).unwrap();
    w.add_tokenizer_json(b.tokenizer_json().unwrap()).unwrap();
    w.set_chat_template(template.unwrap_or(b.chat_template().unwrap()));
    w.set_generation_defaults_json(defaults);
    for t in b.tensors() {
        assert!(t.quantization().is_none(), "an unquantized bundle");
        w.add_tensor_bytes(TensorSpec::new(t.name(), t.dtype(), t.shape()), t.data()).unwrap();
    }
    w.finish().unwrap();
    out.to_path_buf()
}

#[test]
fn a_closed_stdout_ends_quietly_with_141() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = tiny_bundle(dir.path(), "llama", 0);
    let b = bundle.to_str().unwrap();
    let commands: [&[&str]; 6] = [
        &["run", b, "-p", "Hello", "-n", "50", "--no-chat-template"],
        &["inspect", b, "--tensors"],
        &["inspect", b, "--json"],
        &["verify", b],
        &["bench", b, "-p", "8", "-n", "2", "-r", "1", "--json"],
        &["devices"],
    ];
    for args in commands {
        // The reader closes its end before anything is written.
        let mut child = command(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("start");
        drop(child.stdout.take());
        let status = wait_at_most(&mut child, Duration::from_secs(120));
        let err = stderr_of(&mut child);
        assert_eq!(status.code(), Some(141), "{args:?}: {err}");
        assert!(!err.contains("panicked") && !err.contains("error"), "{args:?}: {err}");
    }
}

#[test]
fn a_full_stdout_is_one_error_line() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = tiny_bundle(dir.path(), "llama", 0);
    let b = bundle.to_str().unwrap();
    let commands: [&[&str]; 4] = [
        &["run", b, "-p", "Hello", "-n", "5", "--no-chat-template"],
        &["inspect", b],
        &["bench", b, "-p", "8", "-n", "2", "-r", "1"],
        &["-V"],
    ];
    for args in commands {
        let full = std::fs::OpenOptions::new().write(true).open("/dev/full").expect("/dev/full");
        let out = command(args).stdout(full).stderr(Stdio::piped()).output().expect("run");
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert_eq!(err, "error: writing to stdout: No space left on device (os error 28)\n", "{args:?}");
    }
}

#[test]
fn a_closed_stderr_does_not_panic() {
    // An error to report with nowhere to report it: the exit code still says so.
    let mut child =
        command(&["run", "/nonexistent/model.mlxb", "-p", "x"]).stderr(Stdio::piped()).spawn().expect("start");
    drop(child.stderr.take());
    let status = wait_at_most(&mut child, Duration::from_secs(60));
    assert_eq!(status.code(), Some(1));
}

#[test]
fn ctrl_c_stops_generation_and_exits_130() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = tiny_bundle(dir.path(), "llama", 0);
    let b = bundle.to_str().unwrap();
    // One-shot: the answer stops, "[stopped]" is said, the exit code is 130.
    // The signal goes once the first text arrives; should the answer end on
    // its own first (an end token on a busy machine), the run is repeated.
    let stopped = (0..5).any(|_| {
        let mut child = command(&["run", b, "-p", "x", "-n", "100000", "--no-chat-template", "--temp", "1"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start");
        let mut first = [0u8; 1];
        child.stdout.as_mut().unwrap().read_exact(&mut first).expect("some text");
        signal(&child, "INT");
        let mut rest = Vec::new();
        child.stdout.take().unwrap().read_to_end(&mut rest).unwrap();
        let status = wait_at_most(&mut child, Duration::from_secs(60));
        let err = stderr_of(&mut child);
        assert!(!err.contains("panicked"), "{err}");
        if !err.contains("[stopped]") {
            return false;
        }
        assert_eq!(status.code(), Some(130), "{err}");
        true
    });
    assert!(stopped, "no run was stopped by Ctrl-C");
    // At the chat prompt, Ctrl-C ends the chat with 130 too (it used to
    // print a hint and wait for more input forever).
    let mut child = command(&["run", b, "-n", "2"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start");
    let mut stderr = child.stderr.take().unwrap();
    let mut seen = Vec::new();
    let mut byte = [0u8; 1];
    while !text(&seen).contains("> ") {
        stderr.read_exact(&mut byte).expect("the chat's prompt");
        seen.push(byte[0]);
    }
    signal(&child, "INT");
    let status = wait_at_most(&mut child, Duration::from_secs(30));
    assert_eq!(status.code(), Some(130), "{}", text(&seen));
}

#[test]
fn chat_survives_bad_lines_and_messages_that_do_not_fit() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = tiny_bundle(dir.path(), "qwen3", 0);
    let b = bundle.to_str().unwrap();
    // The tiny model's context is 512 tokens; the byte tokenizer makes one per byte.
    let long = "y".repeat(600);
    let input = format!("hi\n\u{0}\n{long}\nagain\n").replace('\u{0}', "\u{fffd}");
    let mut input = input.into_bytes();
    // Line 2 becomes invalid UTF-8 (a lone continuation byte).
    let pos = input.windows(3).position(|w| w == "\u{fffd}".as_bytes()).unwrap();
    input.splice(pos..pos + 3, [0x80u8]);
    let out = mlxcel(&["run", b, "-n", "4"], &input);
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("line 2 is not valid UTF-8 (at byte 0); ignored"), "{err}");
    assert!(err.contains("but the context holds 512; message ignored (/reset clears the conversation)"), "{err}");
    // The first and the last message are answered: two answers, two newlines.
    assert_eq!(text(&out.stdout).matches('\n').count(), 2, "{}", text(&out.stdout));
}

#[test]
fn numeric_flags_are_checked_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = tiny_bundle(dir.path(), "llama", 0);
    let b = bundle.to_str().unwrap();
    let cases: [(&[&str], &str); 12] = [
        (&["run", b, "-p", "x", "--temp", "-1"], "invalid value '-1' for '--temp <T>': must be a finite number >= 0"),
        (&["run", b, "-p", "x", "--temp", "nan"], "invalid value 'nan' for '--temp <T>'"),
        (&["run", b, "-p", "x", "--top-p", "inf"], "invalid value 'inf' for '--top-p <P>': must be in (0, 1]"),
        (&["run", b, "-p", "x", "--top-k", "-3"], "invalid value '-3' for '--top-k <K>': must be at least 0"),
        (&["run", b, "-p", "x", "--min-p", "2"], "invalid value '2' for '--min-p <P>': must be in [0, 1]"),
        (
            &["run", b, "-p", "x", "--repetition-penalty", "0"],
            "'--repetition-penalty <R>': must be a finite number > 0",
        ),
        (&["run", b, "-p", "x", "-n", "-1"], "invalid value '-1' for '--max-tokens <N>': must be at least 0"),
        (&["run", b, "-p", "x", "--max-kv-size", "0"], "invalid value '0' for '--max-kv-size <N>': must be at least 1"),
        (&["run", b, "-p", "x", "--prefill-chunk", "0"], "'--prefill-chunk <N>': must be at least 1"),
        (&["run", b, "-p", "x", "--seed", "-1"], "invalid value '-1' for '--seed <S>'"),
        (&["bench", b, "-r", "0"], "invalid value '0' for '--repetitions <R>': must be at least 1"),
        (&["bench", b, "-b", "5000"], "invalid value '5000' for '--batch <B>': must be at most 1024"),
    ];
    for (args, message) in cases {
        let out = mlxcel(args, b"");
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(message) && !err.contains("panicked"), "{args:?}: {err}");
    }
    // An empty raw prompt (the tiny tokenizer adds no BOS) names the flag.
    let out = mlxcel(&["run", b, "-p", "", "--no-chat-template"], b"");
    let err = text(&out.stderr);
    assert_eq!(err, "error: -p: the prompt gives no tokens (it is empty, and the tokenizer adds none to raw text)\n");
}

#[test]
fn bad_generation_defaults_are_blamed_on_the_bundle() {
    let dir = tempfile::tempdir().unwrap();
    let tiny = tiny_bundle(dir.path(), "llama", 0);
    let bad = rebuilt(&tiny, r#"{"eos_token_id": 255, "top_p": 7}"#, None, &dir.path().join("bad.mlxb"));
    let b = bad.to_str().unwrap();
    // With --temp the bundle's top_p applies: the bundle is named, not a flag.
    let out = mlxcel(&["run", b, "-p", "x", "-n", "2", "--temp", "0.5"], b"");
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err, format!("error: loading {b}: bundle: generation defaults: top_p: 7 is not in (0, 1]\n"));
    assert!(!err.contains("--top-p 7") && !err.contains("invalid parameter top_p"), "{err}");
    // Load refuses the bundle whatever the flags (compile never writes one:
    // its self-check is the same code), still naming the bundle.
    let out = mlxcel(&["run", b, "-p", "x", "-n", "2", "--temp", "0.5", "--top-p", "0.9"], b"");
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("generation defaults: top_p: 7"), "{}", text(&out.stderr));
    // A flag out of range is the flag's error.
    let out = mlxcel(&["run", b, "-p", "x", "--top-p", "7"], b"");
    assert!(text(&out.stderr).contains("for '--top-p <P>': must be in (0, 1]"), "{}", text(&out.stderr));
}

#[test]
fn errors_state_each_cause_once() {
    let dir = tempfile::tempdir().unwrap();
    for args in [&["inspect", "/nonexistent/model.mlxb"][..], &["verify", "/nonexistent/model.mlxb"]] {
        let out = mlxcel(args, b"");
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert_eq!(err.matches("No such file or directory").count(), 1, "{err}");
        assert_eq!(err.matches("/nonexistent/model.mlxb").count(), 1, "{err}");
    }
    // A directory is named as one rather than as "No such device".
    let d = dir.path().to_str().unwrap();
    for args in [&["run", d, "-p", "x"][..], &["inspect", d], &["verify", d], &["bench", d]] {
        let out = mlxcel(args, b"");
        let err = text(&out.stderr);
        assert_eq!(err, format!("error: {d} is a directory, not a bundle file\n"), "{args:?}");
    }
    // The exit codes are documented in --help.
    let help = text(&mlxcel(&["--help"], b"").stdout);
    assert!(help.contains("Exit codes: 0 success, 1 error, 2 usage error"), "{help}");
    assert!(help.contains("130 interrupted (Ctrl-C), 141 stdout closed (broken pipe)"), "{help}");
}

#[test]
fn prompt_tokens_outside_the_vocabulary_fail_the_request() {
    use mlxcel_runtime::engine::{Engine, EngineOptions, Request};
    let dir = tempfile::tempdir().unwrap();
    let bundle = tiny_bundle(dir.path(), "llama", 0);
    let engine = Engine::load(&bundle, EngineOptions::default()).unwrap();
    let vocab = engine.model().config.vocab_size;
    // Token ids a tokenizer or a client may produce beyond the embedding's rows.
    for bad in [vocab as u32, 1 << 31, u32::MAX] {
        let request = Request { prompt: vec![1, bad, 2], options: Default::default() };
        let err = engine.generate(request).unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "invalid parameter prompt: token {bad} at position 1 is not in the model's vocabulary of {vocab} tokens"
            )
        );
    }
    // The engine still serves good requests.
    let ok = engine.generate(Request { prompt: vec![1, 2, 3], options: Default::default() });
    assert!(ok.is_ok(), "{:?}", ok.err());
}

#[test]
fn template_errors_name_the_bundle_and_spare_the_chat() {
    let dir = tempfile::tempdir().unwrap();
    let tiny = tiny_bundle(dir.path(), "llama", 0);
    // A template that refuses any message containing "forbidden".
    let template = "{% for m in messages %}{% if 'forbidden' in m.content %}{{ raise_exception('no forbidden words') }}\
        {% endif %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:";
    let path = rebuilt(&tiny, r#"{"eos_token_id": 255}"#, Some(template), &dir.path().join("t.mlxb"));
    let b = path.to_str().unwrap();
    let out = mlxcel(&["run", b, "-p", "a forbidden word"], b"");
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.starts_with(&format!("error: bundle {b}: chat template: ")) && err.contains("no forbidden words"),
        "{err}"
    );
    // In the chat, the message is refused and the next one answered.
    let out = mlxcel(&["run", b, "-n", "3"], b"a forbidden word\nhello\n");
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("no forbidden words") && err.contains("message ignored"), "{err}");
    assert_eq!(text(&out.stdout).matches('\n').count(), 1, "{}", text(&out.stdout));
}
