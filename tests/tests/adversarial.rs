//! The adversarial corpus (tests/adversarial/, several hundred hostile
//! inputs generated here, at test time) against the real `mlxcel-compile`
//! and `mlxcel` binaries. Each case must end the way docs/reliability.md
//! promises: a non-zero exit with an error line naming the problem, no
//! panic, no death by signal, no run past the time bound, no file under the
//! output name and no `*.tmp*` leftover, the inputs untouched, and every
//! bundle that compile accepts runs (`mlxcel run -n 4`).
//!
//! `ADVERSARIAL_FILTER=text` runs only the cases whose `family/name`
//! contains `text`; `ADVERSARIAL_THREADS` sets the parallelism (default 2).

#[path = "../adversarial/mod.rs"]
mod corpus;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use corpus::{Case, Expect, Stdout, Tool};
use mlxcel_tests::{mlxcel_bin, mlxcel_compile_bin, models_dir};

/// The most a case's command may run.
const TIME_BOUND: Duration = Duration::from_secs(20);

/// How a case failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Failure {
    /// Panic text on standard error.
    Panic,
    /// Killed by a signal it was not sent (SIGSEGV, SIGABRT, ...).
    Signal,
    /// Still running at the time bound.
    Hang,
    /// Past the case's memory bound.
    Memory,
    /// A file under the output name, or a `*.tmp*` beside it.
    Leftover,
    /// An input file changed or vanished.
    InputClobbered,
    /// Compile accepted it and `run -n 4` then refused or crashed.
    AcceptedButRunRefuses,
    /// Accepted what must be refused.
    Accepted,
    /// Refused a valid input.
    RefusedValid,
    /// Refused without an error line naming the problem, or with an unclear one.
    UnclearError,
    /// Exited 0 after a signal asked it to stop.
    ExitZeroAfterSignal,
}

/// What one command did.
struct Outcome {
    status: Option<ExitStatus>,
    /// Whether the case's signal was sent (it finished first otherwise).
    signalled: bool,
    /// Killed for passing the case's memory bound.
    over_memory: bool,
    stderr: String,
    stdout: String,
    elapsed: Duration,
}

impl Outcome {
    fn timed_out(&self) -> bool {
        self.status.is_none()
    }

    fn code(&self) -> Option<i32> {
        self.status.and_then(|s| s.code())
    }

    fn signal(&self) -> Option<i32> {
        self.status.and_then(|s| s.signal())
    }

    fn panicked(&self) -> bool {
        self.stderr.contains("panicked at") || self.stderr.contains("RUST_BACKTRACE")
    }
}

fn smol() -> PathBuf {
    models_dir().join("SmolLM2-135M-Instruct.Q4_1.gguf")
}

fn expand(arg: &str, dir: &Path) -> String {
    arg.replace("{dir}", dir.to_str().expect("utf-8 temp path")).replace("{smol}", smol().to_str().expect("utf-8 path"))
}

/// Resident memory of a running process, MiB (0 once it is gone).
fn rss_mb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<u64>().ok());
    kb.unwrap_or(0) / 1024
}

/// Waits for `child` up to `bound`, sending the case's signal on time and
/// killing it past `memory_mb`; returns its status (`None`: killed at the
/// bound), whether the signal was sent, and whether memory ran over.
fn wait_bounded(
    child: &mut Child,
    bound: Duration,
    signal: Option<(i32, u64)>,
    memory_mb: Option<u64>,
) -> (Option<ExitStatus>, bool, bool) {
    let start = Instant::now();
    let mut signalled = false;
    loop {
        if let Some(status) = child.try_wait().expect("wait for the case") {
            return (Some(status), signalled, false);
        }
        if let Some(limit) = memory_mb
            && rss_mb(child.id()) > limit
        {
            let _ = child.kill();
            return (child.wait().ok(), signalled, true);
        }
        if let Some((sig, ms)) = signal.filter(|_| !signalled)
            && start.elapsed() >= Duration::from_millis(ms)
        {
            let _ = Command::new("kill").arg(format!("-{sig}")).arg(child.id().to_string()).status();
            signalled = true;
        }
        if start.elapsed() > bound {
            let _ = child.kill();
            let _ = child.wait();
            return (None, signalled, false);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Runs `bin args` in `dir` with the case's streams and signal.
fn execute(bin: &Path, args: &[String], dir: &Path, case: &Case) -> Outcome {
    let err_path = dir.join(".stderr");
    let out_path = dir.join(".stdout");
    let stdout = match case.stdout {
        Stdout::Capture => Stdio::from(std::fs::File::create(&out_path).expect("stdout file")),
        Stdout::ClosedAfter(_) => Stdio::piped(),
        Stdout::DevFull => Stdio::from(std::fs::OpenOptions::new().write(true).open("/dev/full").expect("/dev/full")),
    };
    let start = Instant::now();
    let mut child = Command::new(bin)
        .args(args)
        .current_dir(dir)
        .env("MLXCEL_DEVICE", "cpu")
        .env("MLXCEL_QUIET_JIT", "1")
        .env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE")
        .stdin(Stdio::piped())
        .stdout(stdout)
        .stderr(std::fs::File::create(&err_path).expect("stderr file"))
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
    let mut stdin = child.stdin.take();
    let writer = (!case.stdin.is_empty()).then(|| {
        let (bytes, mut pipe) = (case.stdin.clone(), stdin.take().expect("stdin pipe"));
        let open = case.stdin_open;
        std::thread::spawn(move || {
            let _ = pipe.write_all(&bytes);
            open.then_some(pipe)
        })
    });
    if !case.stdin_open {
        drop(stdin.take());
    }
    let reader = match case.stdout {
        Stdout::ClosedAfter(n) => {
            let mut pipe = child.stdout.take().expect("stdout pipe");
            Some(std::thread::spawn(move || {
                let mut buf = vec![0; n];
                let _ = pipe.read_exact(&mut buf);
            }))
        }
        _ => None,
    };
    let (status, signalled, over_memory) = wait_bounded(&mut child, TIME_BOUND, case.signal, case.memory_mb);
    drop(stdin);
    if let Some(w) = writer {
        drop(w.join());
    }
    if let Some(r) = reader {
        let _ = r.join();
    }
    let read = |p: &Path| String::from_utf8_lossy(&std::fs::read(p).unwrap_or_default()).into_owned();
    Outcome {
        status,
        signalled,
        over_memory,
        stderr: read(&err_path),
        stdout: read(&out_path),
        elapsed: start.elapsed(),
    }
}

/// The error: the first standard error line that says `error`, with the
/// indented lines right after it (clap lists a missing argument there).
fn error_line(stderr: &str) -> Option<String> {
    let mut lines = stderr.lines().skip_while(|l| !l.to_ascii_lowercase().contains("error"));
    let first = lines.next()?;
    let rest = lines.take_while(|l| l.starts_with([' ', '\t']) && !l.trim().is_empty());
    Some(std::iter::once(first).chain(rest).collect::<Vec<_>>().join(" "))
}

/// Why an error line is unclear, if it is.
fn unclear(line: &str) -> Option<String> {
    if line.contains("without error information") {
        return Some("rkyv's placeholder instead of a message".into());
    }
    if line.matches("(os error").count() > 1 {
        return Some("the OS error repeated".into());
    }
    let parts: Vec<&str> = line.split(": ").map(str::trim).filter(|p| p.len() >= 10).collect();
    for (i, p) in parts.iter().enumerate() {
        if parts[i + 1..].contains(p) {
            return Some(format!("cause repeated: {p:?}"));
        }
    }
    None
}

fn names(line: &str, needle: &str) -> bool {
    let line = line.to_lowercase();
    needle.split('|').any(|n| line.contains(&n.to_lowercase()))
}

/// The result of one case: its failures (empty: passed) and a report.
struct Verdict {
    failures: Vec<Failure>,
    report: String,
}

fn check_refusal(o: &Outcome, needle: &str, failures: &mut Vec<Failure>, notes: &mut Vec<String>) {
    if needle.is_empty() {
        return;
    }
    match error_line(&o.stderr) {
        None => {
            failures.push(Failure::UnclearError);
            notes.push("no error line on stderr".into());
        }
        Some(line) => {
            if !names(&line, needle) {
                failures.push(Failure::UnclearError);
                notes.push(format!("error line does not name {needle:?}"));
            } else if let Some(why) = unclear(&line) {
                failures.push(Failure::UnclearError);
                notes.push(why);
            }
        }
    }
}

/// Runs the compiled bundle: `mlxcel run OUT -p hello -n 4`.
fn run_compiled(out: &Path, dir: &Path, failures: &mut Vec<Failure>, notes: &mut Vec<String>) {
    let args: Vec<String> =
        ["run", out.to_str().expect("utf-8"), "-p", "hello", "-n", "4"].iter().map(|s| s.to_string()).collect();
    let plain = Case::new("check", "run", Tool::Mlxcel, &[], Expect::Succeed);
    let o = execute(&mlxcel_bin(), &args, dir, &plain);
    let ok = o.code() == Some(0) && !o.panicked();
    if !ok {
        failures.push(Failure::AcceptedButRunRefuses);
        let how = if o.timed_out() { "hung".to_string() } else { format!("{:?}", o.status) };
        notes.push(format!("run -n 4 on the bundle: {how}: {}", o.stderr.trim()));
    }
}

fn judge(case: &Case, scratch: &Path) -> Verdict {
    let dir = scratch.join(format!("{}-{}", case.family, case.name.replace(['/', ' '], "_")));
    std::fs::create_dir_all(&dir).expect("case directory");
    for d in &case.dirs {
        std::fs::create_dir_all(dir.join(d)).expect("case subdirectory");
    }
    for (p, bytes) in &case.files {
        let p = dir.join(p);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("parent directory");
        std::fs::write(&p, bytes).expect("case file");
    }
    let bin = match case.tool {
        Tool::Compile => mlxcel_compile_bin(),
        Tool::Mlxcel => mlxcel_bin(),
    };
    let args: Vec<String> = case.args.iter().map(|a| expand(a, &dir)).collect();
    let o = execute(&bin, &args, &dir, case);
    let (mut failures, mut notes) = (Vec::new(), Vec::new());
    if o.panicked() {
        failures.push(Failure::Panic);
    }
    if o.timed_out() {
        failures.push(Failure::Hang);
    }
    if o.over_memory {
        failures.push(Failure::Memory);
        notes.push(format!("over {} MiB of memory", case.memory_mb.unwrap_or(0)));
    }
    let sent = case.signal.map(|(s, _)| s);
    if let Some(sig) = o.signal()
        && Some(sig) != sent
        && !o.over_memory
    {
        failures.push(Failure::Signal);
        notes.push(format!("killed by signal {sig}"));
    }
    let exit0 = o.code() == Some(0);
    let output = case.output.as_ref().map(|p| dir.join(p));
    match &case.expect {
        Expect::Refuse(needle) => {
            if exit0 {
                match (&output, case.tool) {
                    (Some(out), Tool::Compile) if out.is_file() => {
                        let before = failures.len();
                        run_compiled(out, &dir, &mut failures, &mut notes);
                        if failures.len() == before {
                            failures.push(Failure::Accepted);
                        }
                    }
                    _ => failures.push(Failure::Accepted),
                }
            } else if !o.timed_out() && o.signal().is_none() {
                check_refusal(&o, needle, &mut failures, &mut notes);
            }
        }
        Expect::RefuseOrRun(needle) => {
            if exit0 {
                if let (Some(out), Tool::Compile) = (&output, case.tool)
                    && out.is_file()
                {
                    run_compiled(out, &dir, &mut failures, &mut notes);
                }
            } else if !o.timed_out() && o.signal().is_none() {
                check_refusal(&o, needle, &mut failures, &mut notes);
            }
        }
        Expect::Succeed | Expect::SucceedNaming(_) => {
            if !exit0 {
                failures.push(Failure::RefusedValid);
            } else if let Expect::SucceedNaming(needle) = &case.expect
                && !names(&o.stderr, needle)
            {
                failures.push(Failure::UnclearError);
                notes.push(format!("stderr does not name {needle:?}"));
            } else if let (Some(out), Tool::Compile) = (&output, case.tool) {
                run_compiled(out, &dir, &mut failures, &mut notes);
            }
        }
        Expect::Interrupted => {
            if exit0 && o.signalled {
                failures.push(Failure::ExitZeroAfterSignal);
            } else if !exit0 && !o.signalled && !o.timed_out() {
                // It ended before the signal: then it must have succeeded.
                failures.push(Failure::RefusedValid);
            }
        }
    }
    // Leftovers: the output name after a failure, `*.tmp*` beside it always.
    if let Some(out) = &output {
        let succeeded = exit0 && !(matches!(case.expect, Expect::Interrupted) && o.signalled);
        if !succeeded && out.exists() && !case.files.iter().any(|(p, _)| dir.join(p) == *out) {
            failures.push(Failure::Leftover);
            notes.push(format!("{} exists", out.display()));
        }
        let parent = out.parent().expect("output parent");
        for e in std::fs::read_dir(parent).into_iter().flatten().flatten() {
            if e.file_name().to_string_lossy().contains(".tmp") {
                failures.push(Failure::Leftover);
                notes.push(format!("leftover {}", e.path().display()));
            }
        }
    }
    for (p, bytes) in &case.files {
        if std::fs::read(dir.join(p)).ok().as_deref() != Some(bytes.as_slice()) {
            failures.push(Failure::InputClobbered);
            notes.push(format!("input {p} changed"));
        }
    }
    failures.sort();
    failures.dedup();
    let report = format!(
        "[{}/{}] {:?}\n  $ {} {}\n  status: {} in {:.1}s{}\n  error: {}\n  stderr: {}\n  stdout: {}\n  {}",
        case.family,
        case.name,
        failures,
        bin.file_name().expect("name").to_string_lossy(),
        args.iter()
            .map(|a| if a.chars().count() > 80 {
                format!("{}...", a.chars().take(80).collect::<String>())
            } else {
                a.clone()
            })
            .collect::<Vec<_>>()
            .join(" "),
        if o.timed_out() { "timed out".into() } else { format!("{:?}", o.status.expect("status")) },
        o.elapsed.as_secs_f64(),
        if o.signalled { " (signalled)" } else { "" },
        error_line(&o.stderr).unwrap_or_default(),
        tail(&o.stderr),
        tail(&o.stdout),
        notes.join("; "),
    );
    // Passed cases leave nothing behind; failed ones keep their files for a look.
    if failures.is_empty() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Verdict { failures, report }
}

fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.trim_end().lines().collect();
    let kept = lines[lines.len().saturating_sub(6)..].join("\n    ");
    let n = kept.chars().count();
    if n > 1500 { format!("...{}", kept.chars().skip(n - 1500).collect::<String>()) } else { kept }
}

#[test]
fn adversarial_corpus() {
    let started = Instant::now();
    let mut cases = corpus::all_cases();
    let total = cases.len();
    let mut seen = std::collections::HashSet::new();
    let dups: Vec<String> =
        cases.iter().map(|c| format!("{}/{}", c.family, c.name)).filter(|n| !seen.insert(n.clone())).collect();
    assert!(dups.is_empty(), "duplicate case names: {dups:?}");
    if let Ok(filter) = std::env::var("ADVERSARIAL_FILTER") {
        cases.retain(|c| format!("{}/{}", c.family, c.name).contains(&filter));
    } else {
        assert!(total >= 500, "the corpus has {total} cases, fewer than 500");
    }
    if cases.iter().any(|c| c.args.iter().any(|a| a.contains("{smol}"))) {
        assert!(smol().is_file(), "{} is missing: run `make setup`", smol().display());
    }
    let scratch = tempfile::tempdir().expect("scratch directory");
    let threads: usize = std::env::var("ADVERSARIAL_THREADS").ok().and_then(|t| t.parse().ok()).unwrap_or(2);
    let next = AtomicUsize::new(0);
    let verdicts: Mutex<Vec<(usize, Verdict)>> = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(case) = cases.get(i) else { break };
                    let v = judge(case, scratch.path());
                    verdicts.lock().expect("verdicts").push((i, v));
                }
            });
        }
    });
    let mut verdicts = verdicts.into_inner().expect("verdicts");
    verdicts.sort_by_key(|(i, _)| *i);
    // The summary: cases per family, failures by kind.
    let mut per_family: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    let mut per_kind: BTreeMap<Failure, usize> = BTreeMap::new();
    let mut failed = Vec::new();
    for (i, v) in &verdicts {
        let e = per_family.entry(cases[*i].family).or_default();
        e.0 += 1;
        if !v.failures.is_empty() {
            e.1 += 1;
            failed.push(v.report.as_str());
        }
        for f in &v.failures {
            *per_kind.entry(*f).or_default() += 1;
        }
    }
    let mut summary = format!(
        "adversarial corpus: {} cases ({} generated) in {:.0}s\n",
        cases.len(),
        total,
        started.elapsed().as_secs_f64()
    );
    summary.push_str(&format!("{:<10} {:>6} {:>7}\n", "family", "cases", "failed"));
    for (family, (n, bad)) in &per_family {
        summary.push_str(&format!("{family:<10} {n:>6} {bad:>7}\n"));
    }
    summary.push_str("failures by kind:\n");
    for (kind, n) in &per_kind {
        summary.push_str(&format!("  {kind:?}: {n}\n"));
    }
    eprintln!("{summary}");
    if !failed.is_empty() {
        let report = failed.join("\n\n");
        if let Ok(path) = std::env::var("ADVERSARIAL_REPORT") {
            std::fs::write(&path, format!("{summary}\n{report}\n")).expect("write the report");
        }
        panic!("{} of {} cases failed:\n\n{report}\n\n{summary}", failed.len(), cases.len());
    }
}
