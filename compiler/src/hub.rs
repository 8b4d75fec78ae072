//! Models named by Hugging Face repo id (`owner/name`, optionally
//! `owner/name@revision` or `owner/name/file.gguf`), downloaded with hf-hub
//! into the shared Hugging Face cache. Honours `HF_HOME` (cache location),
//! `HF_ENDPOINT` (another hub or a mirror), `HF_TOKEN` (else the token file in
//! the cache), and `HF_HUB_OFFLINE` (use only what the cache holds). A broken
//! transfer resumes where it stopped (HTTP ranges), within a run (3 retries)
//! and across runs (the partial `.part` file is kept).

use std::path::{Path, PathBuf};

use hf_hub::api::sync::ApiBuilder;
use hf_hub::{Cache, Repo, RepoType};

/// Errors of resolving a repo id.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// The hub answered with an error or could not be reached.
    #[error("downloading {repo} from {endpoint}: {message}")]
    Download {
        /// The repo id.
        repo: String,
        /// The hub URL.
        endpoint: String,
        /// What went wrong.
        message: String,
    },
    /// `HF_HUB_OFFLINE` is set and the cache lacks the model.
    #[error("HF_HUB_OFFLINE is set and {repo} is not in the Hugging Face cache at {cache}")]
    NotCached {
        /// The repo id.
        repo: String,
        /// The cache folder.
        cache: PathBuf,
    },
    /// The repo holds nothing mlxcel-compile can read.
    #[error("{repo} has {found}; mlxcel-compile needs safetensors weights with config.json, or one GGUF file")]
    Unusable {
        /// The repo id.
        repo: String,
        /// What the repo has.
        found: String,
    },
}

/// A parsed repo reference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepoRef {
    /// `owner/name`.
    pub id: String,
    /// Branch, tag or commit (default `main`).
    pub revision: String,
    /// One file to fetch (a GGUF), when named.
    pub file: Option<String>,
}

/// Parses `owner/name[@revision]` or `owner/name/file.gguf`; `None` when
/// `arg` is not shaped like a repo id or exists as a local path.
pub fn parse_repo_ref(arg: &str) -> Option<RepoRef> {
    if Path::new(arg).exists() {
        return None;
    }
    let (path, revision) = match arg.split_once('@') {
        Some((p, r)) if !r.is_empty() => (p, r.to_string()),
        Some(_) => return None,
        None => (arg, "main".to_string()),
    };
    let parts: Vec<&str> = path.split('/').collect();
    let ok = |s: &str| {
        !s.is_empty() && !s.starts_with('.') && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    };
    match parts.as_slice() {
        [owner, name] if ok(owner) && ok(name) => Some(RepoRef { id: format!("{owner}/{name}"), revision, file: None }),
        [owner, name, file] if ok(owner) && ok(name) && ok(file) && file.ends_with(".gguf") => {
            Some(RepoRef { id: format!("{owner}/{name}"), revision, file: Some(file.to_string()) })
        }
        _ => None,
    }
}

/// Files of a Hugging Face model directory that the compiler reads.
fn wanted(name: &str) -> bool {
    const META: [&str; 8] = [
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "model.safetensors.index.json",
        "chat_template.jinja",
        "chat_template.json",
    ];
    !name.contains('/') && (name.ends_with(".safetensors") || META.contains(&name))
}

fn offline() -> bool {
    std::env::var("HF_HUB_OFFLINE")
        .is_ok_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on"))
}

/// Downloads (or finds in the cache) what the compiler needs from `repo`;
/// returns the local model path (the snapshot folder, or the GGUF file).
pub fn fetch(repo: &RepoRef, progress: bool) -> Result<PathBuf, HubError> {
    let hf_repo = Repo::with_revision(repo.id.clone(), RepoType::Model, repo.revision.clone());
    let cache = Cache::from_env();
    if offline() {
        let cached = cache.repo(hf_repo);
        let first = repo.file.as_deref().unwrap_or("config.json");
        let path = cached
            .get(first)
            .ok_or_else(|| HubError::NotCached { repo: repo.id.clone(), cache: cache.path().clone() })?;
        return Ok(if repo.file.is_some() { path } else { path.parent().map(Path::to_path_buf).unwrap_or(path) });
    }
    let endpoint = std::env::var("HF_ENDPOINT").unwrap_or_else(|_| "https://huggingface.co".into());
    let err = |message: String| HubError::Download { repo: repo.id.clone(), endpoint: endpoint.clone(), message };
    let mut builder = ApiBuilder::from_env().with_progress(progress).with_retries(3);
    if let Ok(token) = std::env::var("HF_TOKEN") {
        builder = builder.with_token(Some(token));
    }
    let api = builder.build().map_err(|e| err(e.to_string()))?;
    let api_repo = api.repo(hf_repo);
    if let Some(file) = &repo.file {
        return api_repo.get(file).map_err(|e| err(format!("{file}: {e}")));
    }
    let info = api_repo.info().map_err(|e| err(e.to_string()))?;
    let files: Vec<String> = info.siblings.iter().map(|s| s.rfilename.clone()).collect();
    let mut wanted_files: Vec<&String> = files.iter().filter(|f| wanted(f)).collect();
    wanted_files.sort();
    let has_weights = wanted_files.iter().any(|f| f.ends_with(".safetensors"));
    if !has_weights || !wanted_files.iter().any(|f| *f == "config.json") {
        let ggufs: Vec<&String> = files.iter().filter(|f| f.ends_with(".gguf")).collect();
        if let [gguf] = ggufs.as_slice() {
            return api_repo.get(gguf).map_err(|e| err(format!("{gguf}: {e}")));
        }
        let found = if ggufs.is_empty() {
            format!("no safetensors weights with a config.json ({} files)", files.len())
        } else {
            format!(
                "several GGUF files ({}); name one as {}/FILE.gguf",
                ggufs.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", "),
                repo.id
            )
        };
        return Err(HubError::Unusable { repo: repo.id.clone(), found });
    }
    let mut dir = None;
    for f in wanted_files {
        let path = api_repo.get(f).map_err(|e| err(format!("{f}: {e}")))?;
        dir.get_or_insert_with(|| path.parent().map(Path::to_path_buf).unwrap_or_default());
    }
    Ok(dir.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_references() {
        let r = |id: &str, rev: &str, file: Option<&str>| {
            Some(RepoRef { id: id.into(), revision: rev.into(), file: file.map(str::to_string) })
        };
        assert_eq!(parse_repo_ref("HuggingFaceTB/SmolLM2-135M"), r("HuggingFaceTB/SmolLM2-135M", "main", None));
        assert_eq!(parse_repo_ref("a/b@v1.0"), r("a/b", "v1.0", None));
        assert_eq!(parse_repo_ref("a/b/model.Q4_0.gguf"), r("a/b", "main", Some("model.Q4_0.gguf")));
        for not_a_repo in ["model.gguf", "a/b/c", "a/b@", "./a/b", "a//b", "a/b/c/d.gguf", "a b/c"] {
            assert_eq!(parse_repo_ref(not_a_repo), None, "{not_a_repo}");
        }
    }
}
