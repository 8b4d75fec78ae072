//! Driving `iree-compile` (from the pinned pip package
//! `iree-base-compiler==3.13.0`, which `make setup` installs into
//! `.deps/iree`): StableHLO text in, a VM flatbuffer (`.vmfb`) out.
//!
//! The module goes in on stdin and the vmfb comes back on stdout, so nothing
//! is written to disk and nothing is left behind if the compile fails.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::str::FromStr;

use crate::error::{Error, Result};

/// What an executable is compiled for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// IREE's LLVM CPU backend.
    LlvmCpu {
        /// The target triple (`x86_64-unknown-linux-gnu`).
        triple: String,
        /// The CPU (`host` for the compiling machine's, or an LLVM CPU name
        /// such as `x86-64-v3`).
        cpu: String,
    },
    /// IREE's CUDA backend for one GPU architecture.
    Cuda {
        /// The SM version (90 for `sm_90`).
        sm: u32,
    },
}

impl Target {
    /// The LLVM CPU target of the machine this runs on.
    pub fn host_cpu() -> Target {
        Target::LlvmCpu { triple: mlxcel_bundle::kinds::host_llvm_triple(), cpu: "host".into() }
    }

    /// The key of this target's `iree-vmfb` artifact in a bundle
    /// (docs/bundle-format.md): `llvm-cpu:TRIPLE:CPU` or `cuda:sm_NN`. A
    /// `host` CPU names no machine another host could match; the compiler
    /// resolves it to the CPU's name before it stores an artifact.
    pub fn artifact_key(&self) -> String {
        match self {
            Target::LlvmCpu { triple, cpu } => format!("llvm-cpu:{triple}:{cpu}"),
            Target::Cuda { sm } => format!("cuda:sm_{sm}"),
        }
    }

    /// The flags that make `iree-compile` build for this target.
    pub fn flags(&self) -> Vec<String> {
        match self {
            Target::LlvmCpu { triple, cpu } => vec![
                "--iree-hal-target-device=local".into(),
                "--iree-hal-local-target-device-backends=llvm-cpu".into(),
                format!("--iree-llvmcpu-target-triple={triple}"),
                format!("--iree-llvmcpu-target-cpu={cpu}"),
            ],
            Target::Cuda { sm } => vec!["--iree-hal-target-device=cuda".into(), format!("--iree-cuda-target=sm_{sm}")],
        }
    }
}

impl std::fmt::Display for Target {
    /// The name `--target` takes and artifacts are keyed by.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::LlvmCpu { triple, cpu } => write!(f, "iree-llvm-cpu:{triple}:{cpu}"),
            Target::Cuda { sm } => write!(f, "iree-cuda-sm{sm}"),
        }
    }
}

/// Why a `--target` name was not understood.
#[derive(Debug, thiserror::Error)]
#[error(
    "unknown IREE target {0:?}: expected iree-llvm-cpu (this machine's CPU), \
     iree-llvm-cpu:TRIPLE:CPU or iree-cuda-smNN (e.g. iree-cuda-sm90)"
)]
pub struct UnknownTarget(pub String);

impl FromStr for Target {
    type Err = UnknownTarget;

    fn from_str(s: &str) -> std::result::Result<Target, UnknownTarget> {
        let unknown = || UnknownTarget(s.to_string());
        if s == "iree-llvm-cpu" {
            return Ok(Target::host_cpu());
        }
        if let Some(rest) = s.strip_prefix("iree-llvm-cpu:") {
            let (triple, cpu) = rest.split_once(':').ok_or_else(unknown)?;
            if triple.is_empty() || cpu.is_empty() {
                return Err(unknown());
            }
            return Ok(Target::LlvmCpu { triple: triple.into(), cpu: cpu.into() });
        }
        let sm = s.strip_prefix("iree-cuda-sm").ok_or_else(unknown)?;
        if sm.is_empty() || !sm.bytes().all(|b| b.is_ascii_digit()) {
            return Err(unknown());
        }
        sm.parse().map(|sm| Target::Cuda { sm }).map_err(|_| unknown())
    }
}

/// An `iree-compile` program.
#[derive(Clone, Debug)]
pub struct IreeCompiler {
    program: PathBuf,
}

impl IreeCompiler {
    /// Where `make setup` installs `iree-compile` under a deps folder.
    pub fn in_deps(deps: &Path) -> PathBuf {
        deps.join("iree/iree/compiler/_mlir_libs/iree-compile")
    }

    /// The compiler at `program`.
    pub fn new(program: impl Into<PathBuf>) -> IreeCompiler {
        IreeCompiler { program: program.into() }
    }

    /// The program's path.
    pub fn program(&self) -> &Path {
        &self.program
    }

    /// The compiler's version as `iree-compile --version` prints it
    /// (`3.13.0rc20261016`): what a runtime compares before loading a module.
    pub fn version(&self) -> Result<String> {
        let io = |source| Error::Io { what: "running", path: self.program.clone(), source };
        let output = Command::new(&self.program).arg("--version").output().map_err(io)?;
        let text = String::from_utf8_lossy(&output.stdout);
        text.lines()
            .find_map(|l| l.trim().strip_prefix("IREE compiler version "))
            .and_then(|rest| rest.split_whitespace().next())
            .map(str::to_string)
            .ok_or_else(|| Error::Compile {
                target: "--version".into(),
                status: output.status.to_string(),
                stderr: format!("no \"IREE compiler version\" line in: {text}"),
            })
    }

    /// Compiles a StableHLO module (MLIR text) for `target` into a vmfb.
    pub fn compile(&self, mlir: &str, target: &Target) -> Result<Vec<u8>> {
        let io = |what, source| Error::Io { what, path: self.program.clone(), source };
        let mut child = Command::new(&self.program)
            .arg("--iree-input-type=stablehlo")
            .args(target.flags())
            .args(["-", "-o", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| io("running", e))?;
        // Written from another thread: the compiler may print before it has
        // read everything, and both pipes must drain.
        let mut stdin =
            child.stdin.take().ok_or_else(|| io("writing the module to", std::io::Error::other("no stdin pipe")))?;
        let text = mlir.to_string();
        let writer = std::thread::spawn(move || stdin.write_all(text.as_bytes()));
        let output = child.wait_with_output().map_err(|e| io("waiting for", e))?;
        let written = writer.join().unwrap_or_else(|_| Err(std::io::Error::other("the writer thread panicked")));
        if !output.status.success() {
            return Err(Error::Compile {
                target: target.to_string(),
                status: output.status.to_string(),
                stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            });
        }
        written.map_err(|e| io("writing the module to", e))?;
        Ok(output.stdout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_names_round_trip_and_bad_ones_are_refused() {
        for name in ["iree-cuda-sm90", "iree-llvm-cpu:x86_64-unknown-linux-gnu:x86-64-v3"] {
            assert_eq!(name.parse::<Target>().unwrap().to_string(), name);
        }
        assert_eq!("iree-cuda-sm90".parse::<Target>().unwrap().artifact_key(), "cuda:sm_90");
        assert!(matches!("iree-llvm-cpu".parse::<Target>().unwrap(), Target::LlvmCpu { ref cpu, .. } if cpu == "host"));
        for bad in ["iree-cuda-sm", "iree-cuda-sm9x", "cuda-sm90", "iree-llvm-cpu:x86_64", "iree-llvm-cpu::host", ""] {
            let e = bad.parse::<Target>().unwrap_err();
            assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
        }
    }

    #[test]
    fn a_missing_compiler_is_an_error_naming_it() {
        let c = IreeCompiler::new("/nonexistent/iree-compile");
        let e = c.compile("module {}", &Target::host_cpu()).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/iree-compile"), "{e}");
    }
}
