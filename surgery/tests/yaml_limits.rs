//! The YAML loader's limits: a file of nested aliases (an "alias bomb"), an
//! oversized file and deep nesting are refused with an error naming the
//! limit, in well under a second, instead of expanding to gigabytes.

use std::time::{Duration, Instant};

use mlxcel_surgery::{MAX_YAML_BYTES, Surgery, limits};

/// A surgery whose targets hold `levels` lists of ten aliases of the
/// previous one: 10^levels scalars once expanded, from ~40 bytes per level.
fn alias_bomb(levels: usize) -> String {
    let mut yaml = String::from("version: 1\noperations:\n  - op: scale\n    factor: 2\n    targets:\n");
    yaml.push_str("      - &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for l in 1..=levels {
        let previous = format!("*a{}", l - 1);
        yaml.push_str(&format!("      - &a{l} [{}]\n", vec![previous; 10].join(", ")));
    }
    yaml
}

#[test]
fn an_alias_bomb_is_refused_quickly() {
    // 10^6 scalars (a serde_yaml Value of ~100 MB before this limit); the
    // 10^9 of the files is refused the same way.
    for levels in [6, 9] {
        let start = Instant::now();
        let err = Surgery::parse(&alias_bomb(levels), std::path::Path::new(".")).unwrap_err().to_string();
        assert!(err.starts_with("surgery: ") && err.contains("alias"), "{err}");
        assert!(start.elapsed() < Duration::from_secs(2), "{:?}", start.elapsed());
    }
    // A few aliases within the limits are still YAML as usual.
    let ok = "version: 1\noperations:\n  - op: scale\n    factor: &f 2\n    targets: &t model.norm.weight\n  - op: scale\n    factor: *f\n    targets: *t\n";
    assert_eq!(Surgery::parse(ok, std::path::Path::new(".")).unwrap().operations.len(), 2);
}

#[test]
fn an_oversized_file_is_refused_before_it_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.yaml");
    let mut yaml = alias_bomb(0);
    yaml.push_str(&format!("# {}\n", "x".repeat(MAX_YAML_BYTES)));
    std::fs::write(&path, &yaml).unwrap();
    let err = Surgery::from_file(&path).unwrap_err().to_string();
    assert_eq!(
        err,
        format!("surgery: {}: {} bytes is more than the limit of {MAX_YAML_BYTES}", path.display(), yaml.len())
    );
    // A missing file names itself once.
    let missing = dir.path().join("missing.yaml");
    let err = Surgery::from_file(&missing).unwrap_err().to_string();
    assert_eq!(err, format!("surgery: {}: No such file or directory (os error 2)", missing.display()));
}

#[test]
fn deep_nesting_is_refused() {
    let depth = limits::DEPTH + 8;
    let yaml = format!(
        "version: 1\noperations:\n  - op: scale\n    factor: 2\n    targets: {}x{}\n",
        "[".repeat(depth),
        "]".repeat(depth)
    );
    let err = Surgery::parse(&yaml, std::path::Path::new(".")).unwrap_err().to_string();
    assert!(err.starts_with("surgery: ") && err.contains("depth"), "{err}");
}
