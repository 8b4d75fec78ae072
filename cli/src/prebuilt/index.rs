//! `index.json`: what a repo of prebuilt bundles holds, written by the build
//! (`scripts/build-bundles.sh`) beside the bundles and read by `mlxcel pull`
//! before it trusts a download. Every field is a pure function of the inputs
//! (no times, no local paths), so building twice gives the same bytes.

use std::io::Read;
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::catalog::Source;

/// The index format this binary writes and reads.
pub const INDEX_FORMAT: u32 = 1;

/// The index of a bundle repo.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct Index {
    /// [`INDEX_FORMAT`]; a reader refuses a newer one.
    pub format: u32,
    /// The bundles, in catalog order.
    pub bundles: Vec<IndexEntry>,
}

/// One bundle of an index.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct IndexEntry {
    /// The catalog name.
    pub name: String,
    /// The bundle's file name in the repo.
    pub file: String,
    /// The model name stored in the bundle.
    pub model: String,
    /// The model's architecture.
    pub architecture: String,
    /// One line on what the bundle is.
    pub description: String,
    /// The model's licence.
    pub license: String,
    /// Where the weights came from (as the catalog says).
    pub source: Source,
    /// The `mlxcel-compile` flags used.
    pub options: Vec<String>,
    /// The surgery applied, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub surgery: Option<SurgeryFile>,
    /// The version of the mlxcel that built it (`mlxcel --version`).
    pub mlxcel_version: String,
    /// The targets it carries artifacts for.
    pub targets: Vec<String>,
    /// The file's size in bytes.
    pub size: u64,
    /// The bundle's blake3 root hash (hex; `mlxcel verify` prints it).
    pub blake3_root: String,
    /// The sha256 of the whole file (hex; what `sha256sum` prints).
    pub sha256: String,
}

/// A surgery YAML an entry was compiled with.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct SurgeryFile {
    /// Its path relative to the catalog's folder.
    pub file: String,
    /// Its sha256 (hex).
    pub sha256: String,
}

/// Errors of reading an index.
#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    /// Not JSON of the index's shape.
    #[error("not a bundle index: {0}")]
    Parse(#[from] serde_json::Error),
    /// A format this binary does not know.
    #[error("index format {found} is newer than this mlxcel reads ({INDEX_FORMAT}): upgrade mlxcel")]
    Newer {
        /// The index's format.
        found: u32,
    },
    /// An entry that could not be checked against.
    #[error("entry {name:?}: {message}")]
    Invalid {
        /// The entry's name.
        name: String,
        /// What is wrong.
        message: String,
    },
}

impl Index {
    /// Parses and checks an index.
    pub fn parse(bytes: &[u8]) -> Result<Index, IndexError> {
        let index: Index = serde_json::from_slice(bytes)?;
        if index.format > INDEX_FORMAT {
            return Err(IndexError::Newer { found: index.format });
        }
        for e in &index.bundles {
            let invalid = |message: &str| IndexError::Invalid { name: e.name.clone(), message: message.into() };
            if !is_hex(&e.blake3_root, 64) || !is_hex(&e.sha256, 64) {
                return Err(invalid("blake3_root and sha256 must be 64 hex digits"));
            }
            // The file name is joined to cache paths: one plain component.
            if !super::catalog::is_repo_part(&e.file) || !e.file.ends_with(".mlxb") {
                return Err(invalid("file must be one plain file name ending in .mlxb"));
            }
        }
        Ok(index)
    }

    /// The entry named `name` (its catalog name, or its file name).
    pub fn find(&self, name: &str) -> Option<&IndexEntry> {
        self.bundles.iter().find(|e| e.name == name || e.file == name)
    }

    /// The index as written: pretty JSON with a final newline.
    pub fn to_json(&self) -> String {
        // Serializing plain structs of strings and numbers cannot fail.
        serde_json::to_string_pretty(self).expect("an index serializes") + "\n"
    }
}

fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The size and sha256 of a file, read once in 1 MiB pieces.
pub fn file_sha256(path: &Path) -> std::io::Result<(u64, String)> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut size = 0u64;
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        size += n as u64;
    }
    Ok((size, mlxcel_bundle::hex(&hasher.finalize())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> IndexEntry {
        IndexEntry {
            name: "m".into(),
            file: "m.mlxb".into(),
            model: "M".into(),
            architecture: "llama".into(),
            description: "d".into(),
            license: "MIT".into(),
            source: Source {
                package: None,
                file: None,
                sha256: None,
                hub: Some("o/m".into()),
                revision: Some("0".repeat(40)),
            },
            options: vec!["--quantize".into(), "q4".into()],
            surgery: None,
            mlxcel_version: "0.1.0".into(),
            targets: vec!["cpu".into()],
            size: 3,
            blake3_root: "ab".repeat(32),
            sha256: "cd".repeat(32),
        }
    }

    #[test]
    fn an_index_round_trips_and_bad_ones_are_refused() {
        let index = Index { format: INDEX_FORMAT, bundles: vec![entry()] };
        let text = index.to_json();
        assert_eq!(Index::parse(text.as_bytes()).unwrap(), index);
        assert_eq!(index.find("m.mlxb"), index.find("m"));
        let newer = text.replace("\"format\": 1", "\"format\": 2");
        assert!(Index::parse(newer.as_bytes()).unwrap_err().to_string().contains("upgrade mlxcel"));
        let escape = text.replace("\"m.mlxb\"", "\"../m.mlxb\"");
        assert!(Index::parse(escape.as_bytes()).unwrap_err().to_string().contains("one plain file name"));
        let short = text.replace(&"ab".repeat(32), "ab");
        assert!(Index::parse(short.as_bytes()).unwrap_err().to_string().contains("64 hex digits"));
    }

    #[test]
    fn the_file_digest_is_sha256sums() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"abc").unwrap();
        let (size, sha) = file_sha256(&path).unwrap();
        assert_eq!(size, 3);
        assert_eq!(sha, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }
}
