//! `mlxcel`: run, inspect and verify compiled `.mlxb` bundles.

mod bench;
mod inspect;
mod run;
mod verify;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{ArgAction, Parser, Subcommand};
use mlxcel_mlx::Device;
use mlxcel_mlx::device::DeviceRequest;
use mlxcel_mlx::fast::Isa;
use mlxcel_mlx::settings::{self, Settings};

/// Runs large language models from compiled `.mlxb` bundles on MLX.
#[derive(Parser)]
#[command(name = "mlxcel", disable_version_flag = true, arg_required_else_help = true)]
struct Cli {
    /// Print the mlxcel version, the linked MLX version and the default device.
    #[arg(short = 'V', long, action = ArgAction::SetTrue)]
    version: bool,

    /// The device to compute on: cpu, gpu or auto [default: MLXCEL_DEVICE,
    /// else auto: the GPU when the linked MLX has one].
    #[arg(long, global = true, value_parser = parse_device)]
    device: Option<DeviceRequest>,

    /// The instruction set of mlxcel's CPU kernels: scalar, avx2, avx512,
    /// avx512vnni or neon [default: MLXCEL_ISA, else the best this CPU has].
    #[arg(long, global = true)]
    isa: Option<Isa>,

    /// Threads of mlxcel's CPU kernels [default: MLXCEL_THREADS, else the
    /// physical cores this process may use].
    #[arg(short = 't', long, global = true, value_parser = clap::value_parser!(u16).range(1..=4096))]
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
    /// Check every byte of a bundle against its hashes; exits non-zero naming
    /// each tensor or section that does not match.
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

fn devices(chosen: Device) -> Result<()> {
    for d in [Device::Cpu, Device::Gpu] {
        let mark = if d == chosen { "*" } else { " " };
        let state = if d.is_available() { d.description() } else { "not available in this MLX build".to_string() };
        println!("{mark} {:<4} {state}", d.name());
    }
    println!("(* = used by default; set {} to cpu, gpu or auto)", settings::DEVICE);
    Ok(())
}

fn parse_device(value: &str) -> std::result::Result<DeviceRequest, String> {
    DeviceRequest::parse(value).ok_or_else(|| format!("{value:?} is not a device: use cpu, gpu or auto"))
}

fn run(cli: Cli) -> Result<()> {
    // The process settings (device, kernel ISA, threads, ...: README.md),
    // read once from the environment, the flags taking precedence; a bad
    // value stops here, naming the variable or flag.
    let mut settings = Settings::from_env(|name| std::env::var(name).ok())?;
    if let Some(device) = cli.device {
        settings.device = device;
    }
    if let Some(isa) = cli.isa {
        settings.isa = Some(isa);
    }
    if let Some(threads) = cli.threads {
        settings.threads = Some(usize::from(threads));
    }
    let device = settings.apply()?;
    if cli.version {
        println!("{}", version_text(device));
        return Ok(());
    }
    match cli.command {
        Some(Command::Devices) => devices(device),
        Some(Command::Inspect { bundle, json, tensors }) => {
            let opened =
                mlxcel_bundle::Bundle::open(&bundle).with_context(|| format!("opening {}", bundle.display()))?;
            if json {
                let text =
                    serde_json::to_string_pretty(&inspect::to_json(&opened, tensors)).context("encoding JSON")?;
                println!("{text}");
            } else {
                print!("{}", inspect::to_text(&opened, tensors));
            }
            Ok(())
        }
        Some(Command::Verify { bundle }) => verify::run(&bundle),
        Some(Command::Run(args)) => run::run(args),
        Some(Command::Bench(args)) => bench::bench(args),
        None => Ok(()),
    }
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
