//! Prebuilt bundles: the catalog of what mlxcel publishes
//! (`bundles/catalog.toml`), the index each bundle repo carries
//! (`index.json`), and pulling a bundle from the Hugging Face Hub into its
//! cache, checked against that index before anything uses it
//! (docs/prebuilt.md).

pub mod cache;
pub mod catalog;
pub mod index;
pub mod pull;
pub mod reference;

use std::path::{Path, PathBuf};

use catalog::Catalog;
use pull::{HubSettings, PullError, PullOptions, Pulled, pull};
use reference::Reference;

/// What a `--bundle`/`run` argument named.
#[derive(Debug)]
pub enum BundleArg {
    /// A path, used as it is (it exists, or is not shaped like a reference
    /// and the caller says it is missing).
    Path(PathBuf),
    /// A bundle from the Hub, pulled (or found in the cache) and checked.
    Pulled(Box<Pulled>),
}

impl BundleArg {
    /// The file to open.
    pub fn path(&self) -> &Path {
        match self {
            BundleArg::Path(p) => p,
            BundleArg::Pulled(p) => &p.path,
        }
    }
}

/// Resolves the bundle argument of `mlxcel run` and `mlxcel-server
/// --bundle`: a path that exists always wins; otherwise a Hub repo
/// (`owner/repo[/NAME][@REV]`) or a catalog name is pulled on first use (the
/// cache serves it after that, without asking the Hub).
pub fn resolve_bundle_arg(arg: &Path, hub: &HubSettings, progress: bool) -> Result<BundleArg, PullError> {
    if arg.exists() {
        return Ok(BundleArg::Path(arg.to_path_buf()));
    }
    let catalog = Catalog::builtin();
    match arg.to_str().and_then(Reference::parse) {
        Some(reference) if reference.pulls_on_first_use(&catalog) => {
            let target = reference.resolve(&catalog)?;
            pull(hub, &target, PullOptions { refresh_index: false, progress }).map(|p| BundleArg::Pulled(Box::new(p)))
        }
        _ => Ok(BundleArg::Path(arg.to_path_buf())),
    }
}
