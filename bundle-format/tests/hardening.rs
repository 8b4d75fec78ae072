//! Errors that state each cause once and say what the path is; temporary
//! files that disappear when a bundle is sealed but never persisted, and
//! when a signal handler asks.

mod common;

use std::error::Error as _;

use mlxcel_bundle::{Bundle, BundleWriter, TensorSpec, remove_temporary_files};

/// `remove_temporary_files` removes every writer's file in the process:
/// the tests that write hold this lock.
static WRITERS: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn temporaries(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp"))
        .collect()
}

#[test]
fn a_directory_is_not_a_bundle() {
    let dir = tempfile::tempdir().unwrap();
    let err = Bundle::open(dir.path()).unwrap_err();
    assert_eq!(err.to_string(), format!("{} is a directory, not a bundle", dir.path().display()));
}

#[test]
fn an_io_cause_is_stated_once_in_the_chain() {
    let dir = tempfile::tempdir().unwrap();
    let err = Bundle::open(dir.path().join("missing.mlxb")).unwrap_err();
    // The message holds the OS error; `source()` must not return it again
    // (anyhow's `{:#}` prints the message, then every source).
    assert!(err.to_string().contains("os error 2"), "{err}");
    assert!(err.source().is_none(), "{err} also has source {:?}", err.source());
}

#[test]
fn a_sealed_bundle_opens_under_its_temporary_name_and_vanishes_unless_persisted() {
    let _writers = WRITERS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("m.mlxb");
    let mut w = BundleWriter::create(&target, common::model()).unwrap();
    w.add_tensor_bytes(TensorSpec::new("model.norm.weight", mlxcel_bundle::Dtype::F32, [2]), &[0u8; 8]).unwrap();
    let sealed = w.seal().unwrap();
    let b = Bundle::open(sealed.temporary_path()).unwrap();
    assert_eq!(b.tensors().count(), 1);
    assert!(!target.exists());
    drop(sealed);
    assert!(temporaries(dir.path()).is_empty());
    assert!(!target.exists());
}

#[test]
fn remove_temporary_files_removes_the_live_ones() {
    let _writers = WRITERS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = tempfile::tempdir().unwrap();
    let w = BundleWriter::create(dir.path().join("a.mlxb"), common::model()).unwrap();
    assert_eq!(temporaries(dir.path()).len(), 1);
    assert_eq!(remove_temporary_files(), 1);
    assert!(temporaries(dir.path()).is_empty());
    // The writer cannot finish once its file is gone.
    assert!(w.finish().is_err());
    assert!(!dir.path().join("a.mlxb").exists());
}
