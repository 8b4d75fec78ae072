//! What `mlxcel pull` (and `run`/`mlxcel-server --bundle` on a path that does
//! not exist) accepts: a catalog name, or a Hub repo of bundles, with an
//! optional revision.
//!
//! ```text
//! smollm2-135m-instruct-q4          a catalog name (bundles/catalog.toml)
//! smollm2-135m-instruct-q4@v0.2.0   ... at a tag, branch or commit of the catalog's repo
//! owner/repo                        the one bundle of a repo's index.json
//! owner/repo/NAME                   the bundle NAME (or the file NAME.mlxb) of that index
//! owner/repo/NAME@REVISION          ... at a revision
//! ```

use super::catalog::{Catalog, is_repo_part};
use super::pull::PullError;

/// A parsed reference, before the catalog is consulted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reference {
    /// A catalog name.
    Name {
        /// The name.
        name: String,
        /// The revision of the catalog's repo, when given.
        revision: Option<String>,
    },
    /// A Hub repo of bundles.
    Repo(Target),
}

/// A resolved reference: which repo, revision and (when named) bundle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// `owner/name`.
    pub repo: String,
    /// Branch, tag or commit (default `main`).
    pub revision: String,
    /// The bundle's name or file in the repo's index; `None`: the index's only one.
    pub name: Option<String>,
}

impl Reference {
    /// Parses `arg`; `None` when it is not shaped like a reference (a file
    /// name such as `model.mlxb`, or a path of more than three parts).
    pub fn parse(arg: &str) -> Option<Reference> {
        let (path, revision) = match arg.split_once('@') {
            Some((p, r)) if !r.is_empty() && !r.contains('@') => (p, Some(r.to_string())),
            Some(_) => return None,
            None => (arg, None),
        };
        let parts: Vec<&str> = path.split('/').collect();
        if !parts.iter().all(|p| is_repo_part(p)) {
            return None;
        }
        let revision_or_main = || revision.clone().unwrap_or_else(|| "main".into());
        match parts.as_slice() {
            [name] if !name.ends_with(".mlxb") => Some(Reference::Name { name: name.to_string(), revision }),
            [owner, repo] if !repo.ends_with(".mlxb") => Some(Reference::Repo(Target {
                repo: format!("{owner}/{repo}"),
                revision: revision_or_main(),
                name: None,
            })),
            [owner, repo, name] => Some(Reference::Repo(Target {
                repo: format!("{owner}/{repo}"),
                revision: revision_or_main(),
                name: Some(name.to_string()),
            })),
            _ => None,
        }
    }

    /// The repo, revision and bundle this reference names; a name the
    /// catalog lacks is [`PullError::UnknownName`].
    pub fn resolve(&self, catalog: &Catalog) -> Result<Target, PullError> {
        match self {
            Reference::Repo(target) => Ok(target.clone()),
            Reference::Name { name, revision } => match catalog.entry(name) {
                Some(entry) => Ok(Target {
                    repo: catalog.publish.repo.clone(),
                    revision: revision.clone().unwrap_or_else(|| "main".into()),
                    name: Some(entry.name.clone()),
                }),
                None => Err(PullError::UnknownName { name: name.clone(), known: catalog.names().join(", ") }),
            },
        }
    }

    /// Whether `run`/`mlxcel-server` should pull this reference when no file
    /// of that name exists: a repo, or a name the catalog has (any other
    /// bare word is a missing file, and is said to be one).
    pub fn pulls_on_first_use(&self, catalog: &Catalog) -> bool {
        match self {
            Reference::Repo(_) => true,
            Reference::Name { name, .. } => catalog.entry(name).is_some(),
        }
    }
}

impl Target {
    /// `owner/name@revision`, as errors name it.
    pub fn at(&self) -> String {
        format!("{}@{}", self.repo, self.revision)
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.repo)?;
        if let Some(name) = &self.name {
            write!(f, "/{name}")?;
        }
        if self.revision != "main" {
            write!(f, "@{}", self.revision)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo(repo: &str, revision: &str, name: Option<&str>) -> Option<Reference> {
        Some(Reference::Repo(Target { repo: repo.into(), revision: revision.into(), name: name.map(Into::into) }))
    }

    #[test]
    fn references_parse_and_resolve() {
        assert_eq!(Reference::parse("o/r"), repo("o/r", "main", None));
        assert_eq!(Reference::parse("o/r@v1"), repo("o/r", "v1", None));
        assert_eq!(Reference::parse("o/r/m-q4@abc"), repo("o/r", "abc", Some("m-q4")));
        assert_eq!(Reference::parse("o/r/m.mlxb"), repo("o/r", "main", Some("m.mlxb")));
        assert_eq!(
            Reference::parse("m-q4@v2"),
            Some(Reference::Name { name: "m-q4".into(), revision: Some("v2".into()) })
        );
        for not_a_reference in
            ["model.mlxb", "dir/model.mlxb", "a/b/c/d", "./a", "a//b", "o/r@", "a b", "/abs/path", "o/r@x@y"]
        {
            assert_eq!(Reference::parse(not_a_reference), None, "{not_a_reference}");
        }
        let catalog = Catalog::builtin();
        let target = Reference::parse("smollm2-135m-instruct-q4").unwrap().resolve(&catalog).unwrap();
        assert_eq!(target.repo, catalog.publish.repo);
        assert_eq!(target.name.as_deref(), Some("smollm2-135m-instruct-q4"));
        assert_eq!(target.to_string(), format!("{}/smollm2-135m-instruct-q4", catalog.publish.repo));
        let unknown = Reference::parse("no-such-model").unwrap();
        assert!(!unknown.pulls_on_first_use(&catalog));
        let err = unknown.resolve(&catalog).unwrap_err().to_string();
        assert!(err.contains("no-such-model") && err.contains("smollm2-135m-instruct-q4"), "{err}");
    }
}
