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

    #[cfg(feature = "iree")]
    iree::build(&manifest_dir);
}

/// The `iree` feature: iree/session.c and the parts of IREE's runtime it
/// needs that eerie-sys's library leaves out (the parameter index, its
/// provider and the io_parameters VM module), compiled from eerie-sys's own
/// copy of IREE's sources so that they match the library they link with.
#[cfg(feature = "iree")]
mod iree {
    use std::path::{Path, PathBuf};
    use std::process::Command;

    /// IREE runtime sources (relative to `iree/runtime/src/iree` of
    /// eerie-sys) missing from its library.
    const MISSING_SOURCES: [&str; 6] = [
        "io/parameter_index.c",
        "io/parameter_index_provider.c",
        "io/parameter_provider.c",
        "io/scope_map.c",
        "modules/io/parameters/module.c",
        "hal/utils/file_cache.c",
    ];

    pub fn build(manifest_dir: &Path) {
        println!("cargo::rerun-if-changed=iree");
        let Some(eerie) = eerie_sys_dir(manifest_dir) else { return };
        let src = eerie.join("iree/runtime/src");
        cc::Build::new()
            .file("iree/session.c")
            .files(MISSING_SOURCES.iter().map(|f| src.join("iree").join(f)))
            .include(&src)
            .include(eerie.join("iree/third_party/flatcc/include"))
            // What IREE's own CMake build compiles its runtime with.
            .std("gnu11")
            .define("IREE_ALLOCATOR_SYSTEM_CTL", "iree_allocator_libc_ctl")
            .define("IREE_THREADING_ENABLE", "1")
            .define("NDEBUG", None)
            .flag("-fvisibility=hidden")
            // IREE's headers are not -Wextra clean; session.c is checked by -Wall.
            .warnings(false)
            .flag("-Wall")
            .flag("-Wno-sign-compare")
            .flag("-Wno-unused-function")
            .opt_level(2)
            .compile("mlxcel_iree_session");
    }

    /// The folder of the eerie-sys package this build resolved (its
    /// vendored IREE), found through `cargo metadata`: a build script has no
    /// other way to a dependency's sources, and eerie-sys exports no `links`
    /// metadata.
    fn eerie_sys_dir(manifest_dir: &Path) -> Option<PathBuf> {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        // Offline, this platform's packages only (all are downloaded by now),
        // with the feature that pulls eerie-sys in.
        let target = std::env::var("TARGET").unwrap_or_default();
        let out = Command::new(cargo)
            .args(["metadata", "--format-version", "1", "--offline", "--features", "mlxcel-mlx/iree"])
            .args(["--filter-platform", &target, "--manifest-path"])
            .arg(manifest_dir.join("Cargo.toml"))
            .output();
        let fail = |why: String| {
            println!("cargo::error=the iree feature: finding eerie-sys's IREE sources with `cargo metadata`: {why}");
            None
        };
        let out = match out {
            Ok(o) if o.status.success() => o.stdout,
            // Offline, it needs every package of the workspace's resolve on
            // disk, dev-dependencies included, which a build of a few
            // packages has not downloaded. One line: `cargo::error` keeps
            // only the first.
            Ok(o) => {
                let why = String::from_utf8_lossy(&o.stderr).split_whitespace().collect::<Vec<_>>().join(" ");
                return fail(format!("{why} (it runs offline: `cargo fetch` downloads what it lacks)"));
            }
            Err(e) => return fail(e.to_string()),
        };
        let meta: serde_json::Value = match serde_json::from_slice(&out) {
            Ok(v) => v,
            Err(e) => return fail(e.to_string()),
        };
        let manifest =
            meta["packages"].as_array().into_iter().flatten().find_map(|p| {
                (p["name"] == "eerie-sys").then(|| p["manifest_path"].as_str().map(PathBuf::from)).flatten()
            });
        match manifest.as_deref().and_then(Path::parent) {
            Some(dir) if dir.join("iree/runtime/src/iree/io/parameter_index.c").is_file() => Some(dir.to_path_buf()),
            Some(dir) => fail(format!("{} holds no IREE runtime sources", dir.display())),
            None => fail("no eerie-sys package in the metadata".into()),
        }
    }
}
