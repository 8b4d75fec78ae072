//! `mlxcel-compile --target iree-*`: what is refused, and refused before the
//! output exists. (A compiled module run against mlx-lm is
//! tests/tests/traced_model.rs's `bundle_module_*`.)

mod common;

use std::process::{Command, Output};

use common::{SMOLLM2, TempDir, model};

fn mlxcel_compile(args: &[&str], tmp: &TempDir) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mlxcel-compile"))
        .args(args)
        .env("MLXCEL_DEPS_DIR", tmp.path().join("no-deps"))
        .env_remove("MLXCEL_IREE_COMPILE")
        .output()
        .unwrap()
}

#[test]
fn bad_iree_options_fail_before_the_output_exists() {
    let tmp = TempDir::new("iree-options");
    let out = tmp.path().join("x.mlxb");
    let (gguf, out_arg) = (model(SMOLLM2), out.to_str().unwrap().to_string());
    let gguf = gguf.to_str().unwrap();
    let fake_compiler = tmp.path().join("iree-compile");
    std::fs::write(&fake_compiler, "").unwrap();
    let fake = fake_compiler.to_str().unwrap();
    for (args, says) in [
        (vec!["--target", "iree-vulkan"], "unknown IREE target \"iree-vulkan\""),
        (vec!["--target", "cuda-sm75"], "or an IREE target: iree-llvm-cpu"),
        (vec!["--iree-context", "64"], "--iree-context needs a --target iree-*"),
        (vec!["--target", "iree-llvm-cpu"], "no-deps/iree/iree/compiler/_mlir_libs/iree-compile: no such file"),
        (vec!["--target", "iree-llvm-cpu", "--iree-compile", "/nonexistent/iree-compile"], "/nonexistent/iree-compile"),
        (
            vec!["--target", "iree-llvm-cpu", "--iree-compile", fake, "--weight-layout", "rows16"],
            "--weight-layout rows16 with --target iree-*",
        ),
        (vec!["--target", "iree-llvm-cpu", "--iree-compile", fake, "--iree-context", "0"], "--iree-context 0"),
    ] {
        let mut full = vec![gguf, "-o", &out_arg, "--quiet"];
        full.extend(args.iter().copied());
        let o = mlxcel_compile(&full, &tmp);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(says), "{args:?}: {err}");
        assert!(!out.exists(), "{args:?} left {}", out.display());
    }
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.iter().all(|n| !n.to_string_lossy().starts_with("x.mlxb")), "left behind: {left:?}");
}
