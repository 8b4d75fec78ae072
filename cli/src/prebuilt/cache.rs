//! The bundles in the Hugging Face cache: which ones `mlxcel pull` verified
//! (a small marker per root hash, so that later uses skip re-hashing every
//! byte), listing them (`mlxcel list`), and removing a refused download.
//!
//! The cache's layout is hf-hub's (and Python huggingface_hub's):
//! `<cache>/models--OWNER--NAME/{blobs/ETAG, snapshots/COMMIT/FILE -> blob, refs/REVISION}`.
//! Markers live in `$HF_HOME/assets/mlxcel/verified/ROOT_HASH` (the folder
//! huggingface_hub gives libraries for their own files, beside `hub/`, so
//! that `hf cache scan` finds nothing unknown in the cache), holding the
//! file's sha256 and size.

use std::path::{Path, PathBuf};

use mlxcel_bundle::{Bundle, hex};

use super::index::IndexEntry;

/// The folder of verification markers of the hub cache `cache` (`$HF_HOME/hub`).
pub fn markers(cache: &Path) -> PathBuf {
    cache.parent().unwrap_or(cache).join("assets").join("mlxcel").join("verified")
}

fn marker_text(sha256: &str, size: u64) -> String {
    format!("{sha256} {size}\n")
}

/// Records that the file of `entry` was verified byte for byte.
pub fn mark_verified(cache: &Path, entry: &IndexEntry) -> std::io::Result<()> {
    let dir = markers(cache);
    std::fs::create_dir_all(&dir)?;
    // Written whole then renamed: a reader never sees half a marker.
    let tmp = dir.join(format!(".{}.tmp{}", entry.blake3_root, std::process::id()));
    std::fs::write(&tmp, marker_text(&entry.sha256, entry.size))?;
    std::fs::rename(&tmp, dir.join(&entry.blake3_root))
}

/// Whether the cached file at `path` is the verified file of `entry`: a
/// marker for its root hash with the entry's sha256 and size, the file of
/// that size, and its header's root hash (checked against the manifest on
/// open) the entry's.
pub fn is_verified(cache: &Path, entry: &IndexEntry, path: &Path) -> bool {
    let marked = std::fs::read_to_string(markers(cache).join(&entry.blake3_root))
        .is_ok_and(|text| text == marker_text(&entry.sha256, entry.size));
    marked
        && std::fs::metadata(path).is_ok_and(|m| m.len() == entry.size)
        && Bundle::open(path).is_ok_and(|b| hex(&b.root_hash()) == entry.blake3_root)
}

/// Removes a cached file: the snapshot's link, the blob it points to and
/// the blob's lock file (hf-hub's). Returns what it removed. Markers stay:
/// one certifies a (root hash, sha256, size), which a refused file never
/// had, and another file may still have.
pub fn remove(path: &Path) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    // The blob first (the link names it); a plain file is its own blob.
    if let Ok(blob) = std::fs::canonicalize(path)
        && blob != path
    {
        for file in [blob.with_extension("lock"), blob] {
            if std::fs::remove_file(&file).is_ok() {
                removed.push(file);
            }
        }
    }
    if std::fs::remove_file(path).is_ok() {
        removed.push(path.to_path_buf());
    }
    removed
}

/// One bundle in the cache.
#[derive(Clone, Debug, serde::Serialize)]
pub struct CachedBundle {
    /// The repo id.
    pub repo: String,
    /// The commit of the snapshot holding it.
    pub commit: String,
    /// The branches and tags pointing at that commit.
    pub refs: Vec<String>,
    /// Its file name.
    pub file: String,
    /// Its path (the snapshot's link).
    pub path: PathBuf,
    /// Its size in bytes.
    pub size: u64,
    /// The model name it holds, when it opens.
    pub model: Option<String>,
    /// Its root hash (hex), when it opens.
    pub root_hash: Option<String>,
    /// Why it does not open, when it does not.
    pub error: Option<String>,
    /// Whether `mlxcel pull` verified every byte of it.
    pub verified: bool,
}

/// Every `.mlxb` file of every model repo in the cache, sorted by repo,
/// commit and file. A cache that does not exist holds none.
pub fn list(cache: &Path) -> std::io::Result<Vec<CachedBundle>> {
    let mut found = Vec::new();
    let repos = match std::fs::read_dir(cache) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(found),
        Err(e) => return Err(e),
    };
    for repo_dir in repos.flatten() {
        let folder = repo_dir.file_name().to_string_lossy().into_owned();
        // hf-hub's folder name: "models--" + the id with '/' as "--".
        let Some(id) = folder.strip_prefix("models--") else { continue };
        let repo = id.replacen("--", "/", 1);
        let refs = read_refs(&repo_dir.path().join("refs"));
        let Ok(snapshots) = std::fs::read_dir(repo_dir.path().join("snapshots")) else { continue };
        for snapshot in snapshots.flatten() {
            let commit = snapshot.file_name().to_string_lossy().into_owned();
            let Ok(files) = std::fs::read_dir(snapshot.path()) else { continue };
            for file in files.flatten() {
                let name = file.file_name().to_string_lossy().into_owned();
                if !name.ends_with(".mlxb") {
                    continue;
                }
                found.push(describe(cache, &repo, &commit, &refs, name, file.path()));
            }
        }
    }
    found.sort_by(|a, b| (&a.repo, &a.commit, &a.file).cmp(&(&b.repo, &b.commit, &b.file)));
    Ok(found)
}

fn describe(
    cache: &Path,
    repo: &str,
    commit: &str,
    refs: &[(String, String)],
    file: String,
    path: PathBuf,
) -> CachedBundle {
    let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    let opened = Bundle::open(&path);
    let (model, root_hash, error) = match &opened {
        Ok(b) => (Some(b.model_name().to_string()), Some(hex(&b.root_hash())), None),
        Err(e) => (None, None, Some(e.to_string())),
    };
    let verified = root_hash.as_ref().is_some_and(|root| {
        std::fs::read_to_string(markers(cache).join(root))
            .is_ok_and(|t| t.split_whitespace().nth(1) == Some(size.to_string().as_str()))
    });
    CachedBundle {
        repo: repo.to_string(),
        commit: commit.to_string(),
        refs: refs.iter().filter(|(_, c)| c == commit).map(|(r, _)| r.clone()).collect(),
        file,
        path,
        size,
        model,
        root_hash,
        error,
        verified,
    }
}

/// The `refs/` of a repo folder: (revision, commit) pairs.
fn read_refs(dir: &Path) -> Vec<(String, String)> {
    let mut refs: Vec<(String, String)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let commit = std::fs::read_to_string(e.path()).ok()?;
            Some((e.file_name().to_string_lossy().into_owned(), commit.trim().to_string()))
        })
        .collect();
    refs.sort();
    refs
}
