//! `mlxcel`: run, inspect and verify compiled `.mlxb` bundles.

use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{ArgAction, Parser, Subcommand};
use mlxcel_mlx::{Device, device};

/// Runs large language models from compiled `.mlxb` bundles on MLX.
#[derive(Parser)]
#[command(name = "mlxcel", disable_version_flag = true, arg_required_else_help = true)]
struct Cli {
    /// Print the mlxcel version, the linked MLX version and the default device.
    #[arg(short = 'V', long, action = ArgAction::SetTrue)]
    version: bool,

    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// List the compute devices of the linked MLX and which one mlxcel uses
    /// (MLXCEL_DEVICE=cpu|gpu|auto overrides the choice).
    Devices,
}

fn version_text() -> Result<String> {
    let device = device::requested_device().context("choosing the default device")?;
    Ok(format!(
        "mlxcel {}\nMLX {}\ndefault device: {} ({})",
        env!("CARGO_PKG_VERSION"),
        mlxcel_mlx::mlx_version(),
        device,
        device.description()
    ))
}

fn devices() -> Result<()> {
    let chosen = device::requested_device().context("choosing the default device")?;
    for d in [Device::Cpu, Device::Gpu] {
        let mark = if d == chosen { "*" } else { " " };
        let state = if d.is_available() { d.description() } else { "not available in this MLX build".to_string() };
        println!("{mark} {:<4} {state}", d.name());
    }
    println!("(* = used by default; set {} to cpu, gpu or auto)", device::DEVICE_ENV);
    Ok(())
}

fn run(cli: Cli) -> Result<()> {
    if cli.version {
        println!("{}", version_text()?);
        return Ok(());
    }
    match cli.command {
        Some(Command::Devices) => devices(),
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
