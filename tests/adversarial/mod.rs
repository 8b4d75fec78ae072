//! The adversarial corpus: hostile inputs for `mlxcel-compile` and `mlxcel`,
//! generated at test time (no binary blobs in git) by one module per family.
//! `tests/tests/adversarial.rs` runs every case against the real binaries
//! and checks what docs/reliability.md promises of each.

pub mod bundle;
pub mod bundle_writer;
pub mod cli;
pub mod gguf;
pub mod hf;
pub mod model;
pub mod surgery;

/// Which binary a case runs.
#[derive(Clone, Copy, Debug)]
pub enum Tool {
    /// `mlxcel-compile`.
    Compile,
    /// `mlxcel`.
    Mlxcel,
}

/// Where a case's standard output goes.
#[derive(Clone, Copy, Debug)]
pub enum Stdout {
    /// Captured to a file.
    Capture,
    /// A pipe whose reader closes after this many bytes (`| head -c N`).
    ClosedAfter(usize),
    /// `/dev/full`: every write fails with ENOSPC.
    DevFull,
}

/// What a case must end with.
#[derive(Clone, Debug)]
pub enum Expect {
    /// A non-zero exit whose error line names this text (case-insensitive).
    Refuse(String),
    /// Either refused naming this text, or accepted: then (for a compile)
    /// `mlxcel run -n 4` on the bundle succeeds. For inputs where both are
    /// honest answers (a model pruned to nothing may still run).
    RefuseOrRun(String),
    /// Exit 0; for a compile, `mlxcel run -n 4` on the bundle succeeds too.
    Succeed,
    /// Exit 0 and standard error names this text (a recoverable problem
    /// reported without ending the session).
    SucceedNaming(String),
    /// A signal arrived: the process must not exit 0, must not die of any
    /// other signal, and leaves nothing under the output name.
    Interrupted,
}

/// One hostile input and the command it is given to.
#[derive(Clone, Debug)]
pub struct Case {
    /// The family, for the summary (`gguf`, `hf`, `surgery`, `bundle`, `cli`).
    pub family: &'static str,
    /// A short unique name.
    pub name: String,
    /// Files written into the case's own directory first (relative path, bytes).
    pub files: Vec<(String, Vec<u8>)>,
    /// Directories created there first.
    pub dirs: Vec<String>,
    /// The binary.
    pub tool: Tool,
    /// Its arguments; `{dir}` becomes the case's directory, `{smol}` the real
    /// SmolLM2 GGUF (for cases that need a compile long enough to interrupt).
    pub args: Vec<String>,
    /// Standard input, written then left open when `stdin_open`, else closed.
    pub stdin: Vec<u8>,
    /// Keep standard input open (an interactive session waiting for input).
    pub stdin_open: bool,
    /// Where standard output goes.
    pub stdout: Stdout,
    /// A signal sent after this many milliseconds.
    pub signal: Option<(i32, u64)>,
    /// The output path (relative to the case directory) that must not exist
    /// afterwards unless the command succeeded; `*.tmp*` siblings never may.
    pub output: Option<String>,
    /// The most resident memory (MiB) the command may reach, if bounded.
    pub memory_mb: Option<u64>,
    /// The expected outcome.
    pub expect: Expect,
}

impl Case {
    /// A case with no files, captured output and no signal.
    pub fn new(family: &'static str, name: impl Into<String>, tool: Tool, args: &[&str], expect: Expect) -> Case {
        Case {
            family,
            name: name.into(),
            files: Vec::new(),
            dirs: Vec::new(),
            tool,
            args: args.iter().map(|a| a.to_string()).collect(),
            stdin: Vec::new(),
            stdin_open: false,
            stdout: Stdout::Capture,
            signal: None,
            output: None,
            memory_mb: None,
            expect,
        }
    }

    /// `mlxcel-compile {dir}/INPUT -o {dir}/out.mlxb --quiet` after writing
    /// `files`, refused naming `needle` (or accepted, with `Expect::Succeed`).
    pub fn compile(family: &'static str, name: impl Into<String>, input: &str, expect: Expect) -> Case {
        let input = format!("{{dir}}/{input}");
        let mut c = Case::new(family, name, Tool::Compile, &[&input, "-o", "{dir}/out.mlxb", "--quiet"], expect);
        c.output = Some("out.mlxb".into());
        c
    }

    /// Adds a file to write before the command.
    pub fn file(mut self, path: &str, bytes: impl Into<Vec<u8>>) -> Case {
        self.files.push((path.to_string(), bytes.into()));
        self
    }
}

/// Refusal naming `needle`.
pub fn refuse(needle: &str) -> Expect {
    Expect::Refuse(needle.to_string())
}

/// Refusal naming `needle`, or acceptance of a bundle that runs.
pub fn refuse_or_run(needle: &str) -> Expect {
    Expect::RefuseOrRun(needle.to_string())
}

/// Every case of every family.
pub fn all_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    cases.extend(gguf::cases());
    cases.extend(hf::cases());
    cases.extend(surgery::cases());
    cases.extend(bundle::cases());
    cases.extend(cli::cases());
    cases
}
