//! Downloading a prebuilt bundle with hf-hub into the Hugging Face cache and
//! checking it against its repo's `index.json` before anything uses it.
//!
//! A download goes to hf-hub's `blobs/ETAG.sync.part`, resumes from there
//! (an HTTP range: 3 retries within a run, and the part file survives for
//! the next run), and is renamed into place only when complete. It is then
//! checked: size and sha256 of the file, root hash, and every byte against
//! the bundle's own hashes. A file that fails any check is deleted (blob,
//! snapshot link) and the error names the repo, the file and both hashes.

use std::path::{Path, PathBuf};

use hf_hub::api::Progress;
use hf_hub::api::sync::{ApiBuilder, ApiError, ApiRepo};
use hf_hub::{Cache, Repo, RepoType};
use indicatif::ProgressBar;
use mlxcel_bundle::{Bundle, BundleError, hex};

use super::cache;
use super::index::{Index, IndexEntry, IndexError, file_sha256};
use super::reference::Target;
use crate::integrity;

/// Where and how to reach the Hub: the values of `HF_HOME`, `HF_ENDPOINT`,
/// `HF_TOKEN` and `HF_HUB_OFFLINE`, read by the binaries ([`HubSettings::from_vars`]).
#[derive(Clone, Debug)]
pub struct HubSettings {
    /// The hub cache folder (`$HF_HOME/hub`, default `~/.cache/huggingface/hub`).
    pub cache_dir: PathBuf,
    /// The Hub's URL (`HF_ENDPOINT`, default `https://huggingface.co`).
    pub endpoint: String,
    /// A token for private or gated repos (`HF_TOKEN`, else the cache's token file).
    pub token: Option<String>,
    /// Use only the cache (`HF_HUB_OFFLINE=1`).
    pub offline: bool,
}

impl HubSettings {
    /// The settings from environment values looked up with `var` (the
    /// binaries pass `std::env::var`; an empty value counts as unset), as
    /// hf-hub and huggingface_hub read them.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<HubSettings, PullError> {
        let var = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        let cache_dir = match (var("HF_HOME"), var("HOME")) {
            (Some(home), _) => PathBuf::from(home).join("hub"),
            (None, Some(home)) => PathBuf::from(home).join(".cache/huggingface/hub"),
            (None, None) => return Err(PullError::NoCache),
        };
        let token = var("HF_TOKEN").or_else(|| Cache::new(cache_dir.clone()).token());
        let offline = var("HF_HUB_OFFLINE")
            .is_some_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on"));
        let endpoint = var("HF_ENDPOINT").unwrap_or_else(|| "https://huggingface.co".into());
        Ok(HubSettings { cache_dir, endpoint: endpoint.trim_end_matches('/').to_string(), token, offline })
    }
}

/// Errors of pulling a bundle.
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    /// Neither HF_HOME nor HOME is set.
    #[error("no Hugging Face cache: set HF_HOME (or HOME)")]
    NoCache,
    /// A short name the catalog lacks.
    #[error("{name:?} is not in mlxcel's catalog of prebuilt bundles ({known}); a Hub repo is named owner/repo")]
    UnknownName {
        /// The name given.
        name: String,
        /// The catalog's names.
        known: String,
    },
    /// Offline, and the cache lacks the file.
    #[error("HF_HUB_OFFLINE is set and {at} has no {file} in the Hugging Face cache at {cache}")]
    NotCached {
        /// The repo and revision, `owner/name@revision`.
        at: String,
        /// The file.
        file: String,
        /// The cache folder.
        cache: PathBuf,
    },
    /// The Hub has no such repo, revision or file.
    #[error("{endpoint} has no {file} in {at} (HTTP 404: is the repo, revision or file misspelled?)")]
    NotFound {
        /// The Hub's URL.
        endpoint: String,
        /// The repo and revision, `owner/name@revision`.
        at: String,
        /// The file.
        file: String,
    },
    /// Any other failure to download.
    #[error("downloading {file} of {at} from {endpoint}: {message}")]
    Download {
        /// The Hub's URL.
        endpoint: String,
        /// The repo and revision, `owner/name@revision`.
        at: String,
        /// The file.
        file: String,
        /// What went wrong (a 401/403 says to set HF_TOKEN).
        message: String,
    },
    /// The repo's index.json does not parse.
    #[error("{at}: index.json: {source}")]
    Index {
        /// The repo and revision, `owner/name@revision`.
        at: String,
        /// Why.
        source: IndexError,
    },
    /// The index lacks the bundle asked for, or holds several and none was named.
    #[error("{at}: {message}")]
    Choose {
        /// The repo and revision, `owner/name@revision`.
        at: String,
        /// Which bundles there are, and how to name one.
        message: String,
    },
    /// The download is not the file the index describes; it was deleted.
    #[error(
        "{at}: {file}: {what} is {found}, but index.json says {expected}; \
         the download was refused and deleted"
    )]
    Mismatch {
        /// The repo and revision, `owner/name@revision`.
        at: String,
        /// The file.
        file: String,
        /// What differs: size, sha256, blake3 root hash, or bytes.
        what: &'static str,
        /// What the index says.
        expected: String,
        /// What the file has.
        found: String,
    },
    /// Reading or writing the cache failed.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// How [`pull`] treats the cache.
#[derive(Clone, Copy, Debug)]
pub struct PullOptions {
    /// Ask the Hub for the revision's current index even when one is cached
    /// (`mlxcel pull`), rather than using the cached one (`run` on first use).
    pub refresh_index: bool,
    /// Draw progress bars on stderr (when it is a terminal).
    pub progress: bool,
}

/// A bundle ready to use.
#[derive(Clone, Debug)]
pub struct Pulled {
    /// Its path in the cache.
    pub path: PathBuf,
    /// What the index says of it (all of which was checked).
    pub entry: IndexEntry,
    /// Whether this call downloaded it (else the cache had it).
    pub downloaded: bool,
}

/// Downloads (or finds in the cache) the bundle `target` names and checks it
/// against the repo's index: a cached file verified before is only checked
/// for size and root hash; anything else is hashed whole first.
pub fn pull(hub: &HubSettings, target: &Target, options: PullOptions) -> Result<Pulled, PullError> {
    let repo = Repo::with_revision(target.repo.clone(), RepoType::Model, target.revision.clone());
    let cached = Cache::new(hub.cache_dir.clone()).repo(repo.clone());
    let api = (!hub.offline)
        .then(|| {
            ApiBuilder::from_cache(Cache::new(hub.cache_dir.clone()))
                .with_endpoint(hub.endpoint.clone())
                .with_token(hub.token.clone())
                .with_retries(3)
                .with_progress(false)
                .build()
                .map(|api| api.repo(repo.clone()))
                .map_err(|e| download_error(hub, target, "index.json", e))
        })
        .transpose()?;
    let fetch = |file: &str, refresh: bool, bar: bool| -> Result<(PathBuf, bool), PullError> {
        match (&api, cached.get(file)) {
            (_, Some(path)) if !refresh => Ok((path, false)),
            (None, _) => {
                Err(PullError::NotCached { at: target.at(), file: file.to_string(), cache: hub.cache_dir.clone() })
            }
            (Some(api), _) => {
                download(api, file, bar).map(|p| (p, true)).map_err(|e| download_error(hub, target, file, e))
            }
        }
    };

    let (index_path, _) = fetch("index.json", options.refresh_index && api.is_some(), false)?;
    let index_bytes =
        std::fs::read(&index_path).map_err(|source| PullError::Io { path: index_path.clone(), source })?;
    let index = Index::parse(&index_bytes).map_err(|source| PullError::Index { at: target.at(), source })?;
    let entry = choose(&index, target)?.clone();

    let (path, downloaded) = fetch(&entry.file, false, options.progress)?;
    if !downloaded && cache::is_verified(&hub.cache_dir, &entry, &path) {
        return Ok(Pulled { path, entry, downloaded });
    }
    if let Err(e) = check(&path, &entry, target) {
        cache::remove(&path);
        return Err(e);
    }
    cache::mark_verified(&hub.cache_dir, &entry)
        .map_err(|source| PullError::Io { path: hub.cache_dir.join(".mlxcel"), source })?;
    Ok(Pulled { path, entry, downloaded })
}

/// The entry `target` names, or the index's only one.
fn choose<'a>(index: &'a Index, target: &Target) -> Result<&'a IndexEntry, PullError> {
    let names = || index.bundles.iter().map(|e| e.name.as_str()).collect::<Vec<_>>().join(", ");
    let choose = |message: String| PullError::Choose { at: target.at(), message };
    match (&target.name, index.bundles.as_slice()) {
        (Some(name), _) => {
            index.find(name).ok_or_else(|| choose(format!("index.json has no bundle {name:?} (it has: {})", names())))
        }
        (None, [only]) => Ok(only),
        (None, []) => Err(choose("index.json lists no bundle".into())),
        (None, _) => {
            Err(choose(format!("index.json lists several bundles ({}): name one as {}/NAME", names(), target.repo)))
        }
    }
}

/// Checks the file at `path` against `entry`: size, sha256, root hash, then
/// every byte against the bundle's own hashes.
fn check(path: &Path, entry: &IndexEntry, target: &Target) -> Result<(), PullError> {
    let mismatch = |what, expected: String, found: String| PullError::Mismatch {
        at: target.at(),
        file: entry.file.clone(),
        what,
        expected,
        found,
    };
    let (size, sha256) = file_sha256(path).map_err(|source| PullError::Io { path: path.to_path_buf(), source })?;
    if size != entry.size {
        return Err(mismatch("the size", format!("{} bytes", entry.size), format!("{size} bytes")));
    }
    if sha256 != entry.sha256 {
        return Err(mismatch("the sha256", entry.sha256.clone(), sha256));
    }
    let bundle = Bundle::open(path).map_err(|e| mismatch("the file", "a bundle".into(), format!("not one ({e})")))?;
    let root = hex(&bundle.root_hash());
    if root != entry.blake3_root {
        return Err(mismatch("the blake3 root hash", entry.blake3_root.clone(), root));
    }
    match integrity::verify_every_byte(&bundle) {
        Ok(_) => Ok(()),
        Err(BundleError::VerifyFailed { failures }) => Err(mismatch(
            "the content",
            "bytes matching the bundle's hashes".into(),
            failures.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "),
        )),
        Err(e) => Err(mismatch("the file", "a valid bundle".into(), e.to_string())),
    }
}

/// Downloads `file` with a progress bar (when asked and stderr is a terminal).
fn download(api: &ApiRepo, file: &str, bar: bool) -> Result<PathBuf, ApiError> {
    if bar { api.download_with_progress(file, DownloadBar(integrity::bytes_bar(0))) } else { api.download(file) }
}

fn download_error(hub: &HubSettings, target: &Target, file: &str, e: ApiError) -> PullError {
    let status = match &e {
        ApiError::RequestError(e) => match e.as_ref() {
            ureq::Error::Status(code, _) => Some(*code),
            ureq::Error::Transport(_) => None,
        },
        _ => None,
    };
    let (endpoint, at, file) = (hub.endpoint.clone(), target.at(), file.to_string());
    match status {
        Some(404) => PullError::NotFound { endpoint, at, file },
        Some(401 | 403) => PullError::Download {
            endpoint,
            at,
            file,
            message: format!("{e} (a private or gated repo needs a token: set HF_TOKEN)"),
        },
        _ => PullError::Download { endpoint, at, file, message: e.to_string() },
    }
}

/// hf-hub's progress callbacks on an indicatif bar.
struct DownloadBar(ProgressBar);

impl Progress for DownloadBar {
    fn init(&mut self, size: usize, filename: &str) {
        // Called again on each retry, followed by update(bytes already there).
        self.0.set_length(size as u64);
        self.0.set_position(0);
        self.0.set_message(filename.to_string());
    }

    fn update(&mut self, size: usize) {
        self.0.inc(size as u64);
    }

    fn finish(&mut self) {
        self.0.finish_and_clear();
    }
}
