//! Compiles the C++ bridge against the pinned MLX wheel and links libmlx.
//!
//! MLX is found through `MLX_DIR` (the wheel's `mlx/` folder, holding
//! `include/` and `lib/`) or, by default, `<workspace>/.deps/mlx-cpu/mlx`, where
//! `make setup` installs it.

use std::path::PathBuf;

fn main() {
    println!("cargo::rerun-if-env-changed=MLX_DIR");
    println!("cargo::rerun-if-changed=cpp");
    println!("cargo::rerun-if-changed=src/ffi.rs");

    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let mlx_dir = match std::env::var_os("MLX_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => manifest_dir.join("../.deps/mlx-cpu/mlx"),
    };
    let header = mlx_dir.join("include/mlx/mlx.h");
    if !header.is_file() {
        println!(
            "cargo::error=MLX not found at {} (no include/mlx/mlx.h): run `make setup`, or set MLX_DIR to an MLX install",
            mlx_dir.display()
        );
        return;
    }
    let mlx_dir = mlx_dir.canonicalize().unwrap_or(mlx_dir);
    let include = mlx_dir.join("include");
    let lib = mlx_dir.join("lib");

    cxx_build::bridge("src/ffi.rs")
        .file("cpp/bridge.cc")
        .std("c++20")
        .include(&include)
        .flag_if_supported("-Wno-unused-parameter")
        .opt_level(2)
        .compile("mlxcel_mlx_bridge");

    println!("cargo::rustc-link-search=native={}", lib.display());
    println!("cargo::rustc-link-lib=dylib=mlx");
    // This crate's own tests need the rpath too; dependents add it themselves
    // from DEP_MLX_LIBDIR (link args do not propagate to dependents).
    println!("cargo::rustc-link-arg=-Wl,--enable-new-dtags,-rpath,{}", lib.display());
    println!("cargo::metadata=libdir={}", lib.display());
}
