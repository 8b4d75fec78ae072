//! Writes small valid bundles into a directory: seeds for the fuzz targets
//! and fixtures to try `mlxcel inspect` / `mlxcel verify` on.
//!
//! `cargo run -p mlxcel-bundle --example make_seeds -- DIR`
//!
//! Bundles go to `DIR/open_verify/NAME.mlxb`, their raw manifest bytes to
//! `DIR/manifest/NAME.manifest` (the seeds of the two fuzz targets).

#[path = "../tests/common/mod.rs"]
mod common;

use std::path::PathBuf;

use mlxcel_bundle::{Bundle, BundleWriter, Dtype, ModelInfo, TensorSpec};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::args().nth(1).ok_or("usage: make_seeds DIR")?);
    let dir = root.join("open_verify");
    let manifests = root.join("manifest");
    std::fs::create_dir_all(&dir)?;
    std::fs::create_dir_all(&manifests)?;
    common::write_sample(&dir.join("sample.mlxb"));
    BundleWriter::create(dir.join("empty.mlxb"), ModelInfo::default())?.finish()?;
    let mut w = BundleWriter::create(dir.join("one-tensor.mlxb"), common::model())?;
    w.add_tensor_bytes(TensorSpec::new("w", Dtype::F16, [2, 2]), &[1, 2, 3, 4, 5, 6, 7, 8])?;
    w.finish()?;
    for name in ["sample", "empty", "one-tensor"] {
        let bundle = Bundle::open(dir.join(format!("{name}.mlxb")))?;
        let h = bundle.header();
        let manifest = &bundle.as_bytes()[h.manifest_offset as usize..];
        std::fs::write(manifests.join(format!("{name}.manifest")), manifest)?;
    }
    println!("wrote seeds to {}", root.display());
    Ok(())
}
