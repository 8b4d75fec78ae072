//! `mlxcel`: run, inspect and verify compiled `.mlxb` bundles; pull prebuilt
//! ones from the Hugging Face Hub and list those in its cache.

mod bench;
mod input;
mod inspect;
mod output;
mod pull;
mod run;
mod verify;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{ArgAction, Parser, Subcommand};
use mlxcel_cli::flags;
use mlxcel_cli::process::{apply_settings, check_bundle_path, parse_device};
use mlxcel_mlx::Device;
use mlxcel_mlx::device::DeviceRequest;
use mlxcel_mlx::fast::Isa;
use mlxcel_mlx::settings;

use crate::output::{EXIT_CODES_HELP, EXIT_ERROR, EXIT_OK, EXIT_USAGE, Stdout, describe, exit_code, note};

/// Runs large language models from compiled `.mlxb` bundles on MLX.
#[derive(Parser)]
#[command(name = "mlxcel", disable_version_flag = true, arg_required_else_help = true, after_help = EXIT_CODES_HELP)]
struct Cli {
    /// Print the mlxcel version, the linked MLX version and the default device.
    #[arg(short = 'V', long, action = ArgAction::SetTrue)]
    version: bool,

    /// The device to compute on: cpu, gpu or auto [default: MLXCEL_DEVICE,
    /// else auto: the GPU when the linked MLX has one].
    #[arg(long, global = true, value_parser = parse_device)]
    device: Option<DeviceRequest>,

    /// The instruction set of mlxcel's CPU kernels: scalar, avx2, avx2i16,
    /// avx512, avx512vnni or neon [default: MLXCEL_ISA, else the best this CPU
    /// has]. avx2i16 and avx512vnni round activations to int16 steps in the
    /// quantized products (faster); avx2 and avx512 keep them f32.
    #[arg(long, global = true)]
    isa: Option<Isa>,

    /// Threads of mlxcel's CPU kernels [default: MLXCEL_THREADS, else the
    /// physical cores this process may use].
    #[arg(short = 't', long, global = true, allow_negative_numbers = true, value_parser = clap::value_parser!(u16).range(1..=4096))]
    threads: Option<u16>,

    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// List the compute devices of the linked MLX and which one mlxcel uses
    /// (MLXCEL_DEVICE=cpu|gpu|auto overrides the choice; README.md lists
    /// every MLXCEL_ variable).
    Devices,
    /// Show what a bundle holds: format, provenance, model, tokenizer, tensor
    /// summary and artifacts per target (validates the structure, not every byte).
    Inspect {
        /// The bundle file.
        bundle: PathBuf,
        /// Print JSON instead of the readable report.
        #[arg(long)]
        json: bool,
        /// List every tensor.
        #[arg(long)]
        tensors: bool,
    },
    /// Check every byte of a bundle against its hashes (exits non-zero naming
    /// each tensor or section that does not match), then that `run` can load
    /// it: config, tensors, tokenizer, chat template and token ids.
    Verify {
        /// The bundle file.
        bundle: PathBuf,
    },
    /// Generate text from a bundle: one answer to `-p PROMPT`, or an
    /// interactive chat without it.
    Run(run::RunArgs),
    /// Measure prompt processing (pp) and generation (tg) speed, llama-bench
    /// style: mean ± standard deviation over repetitions.
    Bench(bench::BenchArgs),
    /// Download a prebuilt bundle from the Hugging Face Hub into its cache,
    /// check it against the repo's index.json, and print its path.
    #[command(after_help = pull::PULL_HELP)]
    Pull(pull::PullArgs),
    /// Show the bundles in the Hugging Face cache: repo, file, size, model,
    /// whether `pull` verified it, and root hash (HF_HOME sets the cache).
    List(pull::ListArgs),
}

fn version_text(device: Device) -> String {
    format!(
        "mlxcel {}\nMLX {}\ndefault device: {} ({})",
        env!("CARGO_PKG_VERSION"),
        mlxcel_mlx::mlx_version(),
        device,
        device.description()
    )
}

fn devices(out: &Stdout, chosen: Device) -> Result<()> {
    for d in [Device::Cpu, Device::Gpu] {
        let mark = if d == chosen { "*" } else { " " };
        let state = if d.is_available() { d.description() } else { "not available in this MLX build".to_string() };
        out.line(&format!("{mark} {:<4} {state}", d.name()))?;
    }
    out.line(&format!("(* = used by default; set {} to cpu, gpu or auto)", settings::DEVICE))
}

fn run(cli: Cli) -> Result<()> {
    // The process settings (device, kernel ISA, threads, ...: README.md),
    // read once from the environment, the flags taking precedence; a bad
    // value stops here, naming the variable or flag.
    let device = apply_settings(cli.device, cli.isa, cli.threads.map(usize::from))?;
    let out = Stdout::new();
    if cli.version {
        return out.line(&version_text(device));
    }
    match cli.command {
        Some(Command::Devices) => devices(&out, device),
        Some(Command::Inspect { bundle, json, tensors }) => {
            check_bundle_path(&bundle)?;
            let opened =
                mlxcel_bundle::Bundle::open(&bundle).with_context(|| format!("opening {}", bundle.display()))?;
            if json {
                let text =
                    serde_json::to_string_pretty(&inspect::to_json(&opened, tensors)).context("encoding JSON")?;
                out.line(&text)
            } else {
                out.write(&inspect::to_text(&opened, tensors))
            }
        }
        Some(Command::Verify { bundle }) => verify::run(&out, &bundle),
        Some(Command::Run(mut args)) => {
            // A file that exists wins; else owner/repo or a catalog name is
            // pulled on first use.
            args.bundle = pull::resolve_run_bundle(&args.bundle)?;
            run::run(args)
        }
        Some(Command::Bench(args)) => bench::bench(&out, args),
        Some(Command::Pull(args)) => pull::pull_command(&out, &args),
        Some(Command::List(args)) => pull::list_command(&out, &args),
        None => Ok(()),
    }
}

/// Runs the command; exits with the codes of `output` (`--help` lists them).
/// A closed stdout ends quietly: its reader has gone on purpose (`| head`).
/// After Ctrl-C, `run` has already said "[stopped]".
fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // `--help` goes to stdout; a usage error to stderr. Neither
            // write can panic: a failed one still exits with the code.
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { EXIT_USAGE } else { EXIT_OK });
        }
    };
    match run(cli) {
        Ok(()) => ExitCode::from(EXIT_OK),
        Err(e) => {
            let code = exit_code(&e);
            if code == EXIT_ERROR {
                note!("error: {}", describe(&e));
            }
            ExitCode::from(code)
        }
    }
}
