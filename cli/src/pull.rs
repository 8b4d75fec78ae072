//! `mlxcel pull` and `mlxcel list`: prebuilt bundles in the Hugging Face
//! cache, and `run`'s pull on first use (docs/prebuilt.md).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;
use mlxcel_cli::prebuilt::catalog::Catalog;
use mlxcel_cli::prebuilt::pull::{HubSettings, PullOptions, Pulled, pull};
use mlxcel_cli::prebuilt::reference::Reference;
use mlxcel_cli::prebuilt::{BundleArg, cache, resolve_bundle_arg};

use crate::output::{Stdout, note};

/// The help after `mlxcel pull --help`.
pub const PULL_HELP: &str = "\
REFERENCE is one of:
  NAME                      a bundle of mlxcel's catalog (`mlxcel list --catalog`)
  owner/repo                the one bundle a Hub repo's index.json lists
  owner/repo/NAME           the bundle NAME (or file NAME.mlxb) of that index
  ...@REVISION              at a branch, tag or commit (default: main)

The bundle is downloaded into the Hugging Face cache (resumed where a broken
transfer stopped), then its size, sha256, blake3 root hash and every byte are
checked against the repo's index.json; a file that does not match is deleted.
The path is printed on stdout.

Environment: HF_HOME (cache folder, default ~/.cache/huggingface), HF_ENDPOINT
(another hub or a mirror), HF_TOKEN (private or gated repos), HF_HUB_OFFLINE=1
(only the cache, no network).";

/// Options of `mlxcel pull`.
#[derive(Args, Debug)]
pub struct PullArgs {
    /// What to pull: a catalog name or owner/repo[/NAME][@REVISION] (see below).
    #[arg(value_name = "REFERENCE")]
    pub reference: String,
}

/// Options of `mlxcel list`.
#[derive(Args, Debug)]
pub struct ListArgs {
    /// List the catalog's bundles (what `mlxcel pull NAME` knows) instead.
    #[arg(long)]
    pub catalog: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// The Hub settings from the environment (read here, in the binary).
pub fn hub_settings() -> Result<HubSettings> {
    Ok(HubSettings::from_vars(|name| std::env::var(name).ok())?)
}

/// Runs `mlxcel pull`.
pub fn pull_command(out: &Stdout, args: &PullArgs) -> Result<()> {
    let catalog = Catalog::builtin();
    let reference = Reference::parse(&args.reference)
        .with_context(|| format!("{:?} is neither a catalog name nor owner/repo[/NAME][@REVISION]", args.reference))?;
    let target = reference.resolve(&catalog)?;
    let hub = hub_settings()?;
    let pulled = pull(&hub, &target, PullOptions { refresh_index: !hub.offline, progress: true })?;
    report(&pulled, &target.to_string());
    out.line(&pulled.path.display().to_string())
}

/// `run`'s bundle argument: the file itself, or a reference pulled on first use.
pub fn resolve_run_bundle(arg: &Path) -> Result<PathBuf> {
    let hub = hub_settings()?;
    let resolved = resolve_bundle_arg(arg, &hub, true)
        .with_context(|| format!("there is no file {}, and pulling it as a prebuilt bundle failed", arg.display()))?;
    match resolved {
        BundleArg::Path(path) => Ok(path),
        BundleArg::Pulled(pulled) => {
            if pulled.downloaded {
                report(&pulled, &arg.display().to_string());
            }
            Ok(pulled.path)
        }
    }
}

fn report(pulled: &Pulled, what: &str) {
    let e = &pulled.entry;
    let how = if pulled.downloaded { "downloaded" } else { "in the cache" };
    note!(
        "{what}: {} ({}, {}), {how}; size, sha256 {} and root hash {} match index.json",
        e.file,
        e.model,
        megabytes(e.size),
        &e.sha256[..16],
        &e.blake3_root[..16]
    );
}

fn megabytes(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

/// Runs `mlxcel list`.
pub fn list_command(out: &Stdout, args: &ListArgs) -> Result<()> {
    if args.catalog {
        let catalog = Catalog::builtin();
        if args.json {
            return out.line(&serde_json::to_string_pretty(&catalog).context("encoding JSON")?);
        }
        out.line(&format!(
            "{:<28} {:<28} {:<12} description (from {})",
            "name", "model", "targets", catalog.publish.repo
        ))?;
        for e in &catalog.bundles {
            out.line(&format!("{:<28} {:<28} {:<12} {}", e.name, e.model, e.targets.join(","), e.description))?;
        }
        return Ok(());
    }
    let hub = hub_settings()?;
    let bundles = cache::list(&hub.cache_dir).with_context(|| format!("reading {}", hub.cache_dir.display()))?;
    if args.json {
        return out.line(&serde_json::to_string_pretty(&bundles).context("encoding JSON")?);
    }
    if bundles.is_empty() {
        note!("no bundles in the Hugging Face cache at {} (`mlxcel pull NAME` adds one)", hub.cache_dir.display());
        return Ok(());
    }
    let rows: Vec<[String; 5]> = bundles
        .iter()
        .map(|b| {
            let revision = b.refs.first().cloned().unwrap_or_else(|| b.commit.chars().take(12).collect());
            let model =
                b.model.clone().unwrap_or_else(|| format!("(unreadable: {})", b.error.as_deref().unwrap_or("?")));
            [
                format!("{}/{} ({revision})", b.repo, b.file),
                megabytes(b.size),
                model,
                (if b.verified { "yes" } else { "no" }).to_string(),
                b.root_hash.clone().unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    let header = ["repo/file (revision)", "size", "model", "verified", "root hash"].map(String::from);
    let width = |i: usize| rows.iter().chain([&header]).map(|r| r[i].chars().count()).max().unwrap_or(0);
    let (w0, w1, w2) = (width(0), width(1), width(2));
    for r in [&header].into_iter().chain(&rows) {
        out.line(&format!("{:<w0$}  {:>w1$}  {:<w2$}  {:<8}  {}", r[0], r[1], r[2], r[3], r[4]))?;
    }
    out.line(&format!("{} bundle(s) in {}", bundles.len(), hub.cache_dir.display()))
}
