//! Compiles the C++ bridge against the pinned MLX wheel and links libmlx.
//!
//! MLX is found through `MLX_DIR` (the wheel's `mlx/` folder, holding
//! `include/` and `lib/`) or, by default, `<workspace>/.deps/mlx-cpu/mlx`, where
//! `make setup` installs it (`.deps/mlx-cuda-13/mlx` with the `cuda` feature,
//! from `make setup-cuda`).

use std::path::PathBuf;

/// The CPU kernels (cpp/kernels/, MLX-free: `make isa-check` builds them
/// without MLX): one file per ISA, each compiled with its own `#pragma GCC
/// target`, so no global -march flag is needed or used.
const KERNEL_SOURCES: [&str; 9] = [
    "cpp/kernels/pool.cc",
    "cpp/kernels/dispatch.cc",
    "cpp/kernels/mlx_math.cc",
    "cpp/kernels/isa_scalar.cc",
    "cpp/kernels/isa_avx2.cc",
    "cpp/kernels/isa_avx2i16.cc",
    "cpp/kernels/isa_avx512.cc",
    "cpp/kernels/isa_avx512vnni.cc",
    "cpp/kernels/isa_neon.cc",
];

/// The kernels as MLX graph nodes (cpp/nodes/): launching, the node kinds,
/// the fusion rules, inline evaluation, the operations the bridge calls and
/// the GPU side of the nodes (gpu.cc) and recorded step graphs
/// (gpu_graph.cc), both real with the `cuda` feature only.
const NODE_SOURCES: [&str; 9] = [
    "cpp/nodes/launch.cc",
    "cpp/nodes/products.cc",
    "cpp/nodes/norm_rope.cc",
    "cpp/nodes/attention.cc",
    "cpp/nodes/fusion.cc",
    "cpp/nodes/inline_eval.cc",
    "cpp/nodes/ops.cc",
    "cpp/nodes/gpu.cc",
    "cpp/nodes/gpu_graph.cc",
];

fn main() {
    println!("cargo::rerun-if-env-changed=MLX_DIR");
    println!("cargo::rerun-if-changed=cpp");
    println!("cargo::rerun-if-changed=src/ffi.rs");
    println!("cargo::rerun-if-changed=cuda");
    println!("cargo::rerun-if-env-changed=MLXCEL_CUDA_INCLUDE");

    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let cuda = std::env::var_os("CARGO_FEATURE_CUDA").is_some();
    let (default_dir, setup) =
        if cuda { ("../.deps/mlx-cuda-13/mlx", "make setup-cuda") } else { ("../.deps/mlx-cpu/mlx", "make setup") };
    let mlx_dir = match std::env::var_os("MLX_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => manifest_dir.join(default_dir),
    };
    let header = mlx_dir.join("include/mlx/mlx.h");
    if !header.is_file() {
        println!(
            "cargo::error=MLX not found at {} (no include/mlx/mlx.h): run `{setup}`, or set MLX_DIR to an MLX install",
            mlx_dir.display()
        );
        return;
    }
    let mlx_dir = mlx_dir.canonicalize().unwrap_or(mlx_dir);
    let include = mlx_dir.join("include");
    let lib = mlx_dir.join("lib");

    let mut build = cxx_build::bridge("src/ffi.rs");
    if cuda {
        // gpu.cc includes MLX's CUDA headers, which include the CUDA
        // runtime's (and fmt, from Debian's libfmt-dev).
        let cuda_include = match std::env::var_os("MLXCEL_CUDA_INCLUDE") {
            Some(dir) => PathBuf::from(dir),
            None => manifest_dir.join("../.deps/nvrtc-13/nvidia/cu13/include"),
        };
        if !cuda_include.join("crt/host_config.h").is_file() {
            println!(
                "cargo::error=the CUDA runtime headers are not at {} (no crt/host_config.h): run `make setup-cuda`, \
                 or set MLXCEL_CUDA_INCLUDE",
                cuda_include.display()
            );
            return;
        }
        build.include(cuda_include).define("MLXCEL_CUDA", None);
    }
    build
        .file("cpp/bridge.cc")
        .files(KERNEL_SOURCES)
        .files(NODE_SOURCES)
        .std("c++20")
        .include(&include)
        .flag_if_supported("-Wno-unused-parameter")
        // Kernels round exactly where they say (no silent a*b+c -> fma), to
        // match MLX's reference ops; explicit FMA intrinsics stay FMAs.
        .flag("-ffp-contract=off")
        .opt_level(2)
        .compile("mlxcel_mlx_bridge");

    println!("cargo::rustc-link-search=native={}", lib.display());
    println!("cargo::rustc-link-lib=dylib=mlx");
    // Binaries find libmlx through a RUNPATH (LD_LIBRARY_PATH still wins, which
    // is how a GPU host swaps in its own libmlx). The CUDA libmlx needs cuBLAS,
    // cuDNN and NVRTC, which exist only on the GPU host: leave them unresolved
    // at link time.
    let mut link_args = format!("-Wl,--enable-new-dtags,-rpath,{}", lib.display());
    if cuda {
        link_args.push_str(" -Wl,--allow-shlib-undefined");
    }
    // Link args do not propagate to dependents: this crate's own tests get them
    // here, dependents' build scripts read DEP_MLX_LINK_ARGS.
    for arg in link_args.split(' ') {
        println!("cargo::rustc-link-arg={arg}");
    }
    println!("cargo::metadata=link_args={link_args}");
}
