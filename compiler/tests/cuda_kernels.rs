//! `mlxcel-compile --target cuda-sm90`: MLX's run-time-compiled CUDA
//! kernels for the real SmolLM2, compiled with NVRTC on this machine (no
//! GPU) and stored as `kernels` sections (docs/bundle-format.md §4.2.2).
//! Needs `make setup-cuda` (MLX's CUDA wheel and NVRTC under .deps/), which
//! `make test` runs; fails, never skips, without them.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::{SMOLLM2, TempDir, model};
use mlxcel_bundle::{Bundle, kinds};
use mlxcel_compiler::cuda::{CudaKernelOptions, CudaTarget, KernelToolchain, MlxDtype, plan::gather_module};

fn deps() -> PathBuf {
    std::env::var_os("MLXCEL_DEPS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| mlxcel_tests::workspace_root().join(".deps"))
}

fn mlxcel_compile(args: &[&str], deps: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mlxcel-compile"))
        .args(args)
        .env("MLXCEL_DEPS_DIR", deps)
        .env_remove("MLXCEL_MLX_CUDA")
        .env_remove("MLXCEL_NVRTC")
        .output()
        .unwrap()
}

/// The H200's `NAME.txt` for `module`, where the fixtures have it.
fn h200_names(module: &str) -> Option<String> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/mlx-ptx-cache").join(format!("{module}.txt"));
    std::fs::read_to_string(p).ok()
}

/// ELF's `e_machine` for NVIDIA CUDA.
const EM_CUDA: u16 = 190;

#[test]
fn smollm2_with_cuda_sm90_kernels() {
    let deps = deps();
    for (dir, what) in [
        (deps.join("mlx-cuda-13/mlx/lib/libmlx.so"), "MLX's CUDA wheel"),
        (deps.join("nvrtc-13/nvidia/cu13/lib/libnvrtc.so.13"), "NVRTC"),
    ] {
        assert!(dir.is_file(), "{} is missing: run `make setup-cuda` to install {what}", dir.display());
    }
    let tmp = TempDir::new("cuda-kernels");
    let out = tmp.path().join("smol.mlxb");
    let gguf = model(SMOLLM2);
    let run = mlxcel_compile(&[gguf.to_str().unwrap(), "--target", "cuda-sm90", "-o", out.to_str().unwrap()], &deps);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    assert!(stderr.contains("CUDA kernels: 9 modules"), "{stderr}");

    let bundle = Bundle::open(&out).unwrap();
    bundle.verify(|_| {}).unwrap();
    // SmolLM2's matrices are Q4_1 (4-bit, groups of 32, K = 576 or 1536,
    // multiples of 64) but for the tied embedding, Q8_0 (8-bit, K = 576):
    // the embedding's gathers and three row tiles of each width. The H200
    // compiled the 4-bit ones for one stream's prompts (docs/cuda.md); the
    // 8-bit ones serve the output projection of eight or more streams
    // decoded together (a prompt projects its last row only).
    let expected = [
        "gather_float32_uint32_1",
        "gather_uint32_uint32_1",
        "qmm_naive_tn_aligned_float32_m16_b4_g32_affine",
        "qmm_naive_tn_aligned_float32_m16_b8_g32_affine",
        "qmm_naive_tn_aligned_float32_m32_b4_g32_affine",
        "qmm_naive_tn_aligned_float32_m32_b8_g32_affine",
        "qmm_naive_tn_aligned_float32_m64_b4_g32_affine",
        "qmm_naive_tn_aligned_float32_m64_b8_g32_affine",
    ];
    for module in expected.iter().chain(&["mlxcel_kernels"]) {
        assert!(stderr.contains(&format!("kernel {module} for cuda-sm90: ")), "{stderr}");
    }
    let sections: Vec<_> = bundle.sections_of_kind(kinds::KERNELS).collect();
    assert_eq!(sections.len(), 2 * (expected.len() + 1));
    for s in &sections {
        assert_eq!(s.target(), "cuda:sm_90a");
        assert_eq!(s.property(kinds::KERNEL_SET_KEY), Some(kinds::KERNEL_SET_MLX_PTX_CACHE));
        assert_eq!(s.property("mlx_version"), Some("0.32.4"));
        assert_eq!(s.property("cuda_major"), Some("13"));
    }
    for module in expected {
        let ptx = bundle.section(kinds::KERNELS, &format!("{module}.ptx"), "cuda:sm_90a").expect(module).data();
        assert_eq!(&ptx[..4], b"\x7fELF", "{module}.ptx is no cubin");
        assert_eq!(u16::from_le_bytes([ptx[18], ptx[19]]), EM_CUDA, "{module}.ptx is not for CUDA");
        let txt = bundle.section(kinds::KERNELS, &format!("{module}.txt"), "cuda:sm_90a").expect(module).data();
        let txt = std::str::from_utf8(txt).unwrap();
        assert!(txt.ends_with('\n'));
        let lines: Vec<(&str, &str)> = txt.lines().map(|l| l.split_once('\t').expect("expression TAB name")).collect();
        assert_eq!(lines.len(), if module.starts_with("gather") { 22 } else { 1 }, "{module}");
        for (expression, lowered) in &lines {
            assert!(expression.starts_with("mlx::core::cu::"), "{expression}");
            assert!(lowered.starts_with("_Z"), "{module}: {expression} lowered to {lowered:?}");
        }
        // Where the H200's cache has the module, the names are the same,
        // lowered names included.
        if let Some(h200) = h200_names(module) {
            assert_eq!(txt, h200, "{module}");
        }
    }
    // mlxcel's own module: a cubin and every kernel the runtime looks up,
    // in the same set (mlx-kernels/cuda/kernels.cu).
    let own = bundle.section(kinds::KERNELS, "mlxcel_kernels.ptx", "cuda:sm_90a").expect("own module");
    // Marked with the interface version the runtime loads (and only that).
    let abi = mlxcel_mlx::cuda_kernels::ABI.to_string();
    assert_eq!(own.property(kinds::MLXCEL_KERNELS_ABI_KEY), Some(abi.as_str()));
    let ptx = own.data();
    assert_eq!(u16::from_le_bytes([ptx[18], ptx[19]]), EM_CUDA);
    let txt = bundle.section(kinds::KERNELS, "mlxcel_kernels.txt", "cuda:sm_90a").expect("own module").data();
    let expressions: Vec<&str> =
        std::str::from_utf8(txt).unwrap().lines().map(|l| l.split_once('\t').unwrap().0).collect();
    assert_eq!(expressions, mlxcel_mlx::cuda_kernels::name_expressions());
}

#[test]
fn missing_or_wrong_cuda_tools_fail_before_the_output_exists() {
    let tmp = TempDir::new("cuda-tools");
    let out = tmp.path().join("x.mlxb");
    let gguf = model(SMOLLM2);
    let args = |mlx: &Path| {
        vec![
            gguf.to_str().unwrap().to_string(),
            "--target".into(),
            "cuda-sm90".into(),
            "--mlx-cuda".into(),
            mlx.to_str().unwrap().to_string(),
            "-o".into(),
            out.to_str().unwrap().to_string(),
        ]
    };
    let run = |args: Vec<String>| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = mlxcel_compile(&args, &tmp.path().join("no-deps"));
        assert!(!o.status.success());
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let err = run(args(&tmp.path().join("nothing")));
    assert!(err.contains("no MLX CUDA wheel here") && err.contains("make setup-cuda"), "{err}");
    // Another MLX: its kernel names may differ.
    let other = tmp.path().join("mlx-0.33");
    std::fs::create_dir_all(other.join("include/mlx")).unwrap();
    std::fs::create_dir_all(other.join("lib")).unwrap();
    std::fs::write(
        other.join("include/mlx/version.h"),
        "#define MLX_VERSION_MAJOR 0\n#define MLX_VERSION_MINOR 33\n#define MLX_VERSION_PATCH 0\n",
    )
    .unwrap();
    std::fs::write(other.join("lib/libmlx.so"), b"").unwrap();
    let err = run(args(&other));
    assert!(err.contains("MLX 0.33.0, but the kernel names are written for MLX 0.32.4 only"), "{err}");
    let err = run(vec![gguf.to_str().unwrap().into(), "--target".into(), "cuda-sm75".into()]);
    assert!(err.contains("unknown target \"cuda-sm75\""), "{err}");
    assert!(!out.exists());
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.iter().all(|n| !n.to_string_lossy().starts_with("x.mlxb")), "left behind: {left:?}");
}

/// Where a child of [`mlx_module_is_byte_identical_across_processes`]
/// writes its cubin (set only for the children).
const CHILD_OUT: &str = "MLXCEL_TEST_CUBIN_OUT";

/// Compiles MLX's `gather_uint32_uint32_1` for sm_90a in this process and
/// writes the cubin and its names to `out`.
fn compile_gather(out: &Path) {
    let deps = deps();
    let options = CudaKernelOptions {
        targets: vec![CudaTarget { major: 9, minor: 0 }],
        mlx_cuda: deps.join("mlx-cuda-13/mlx"),
        nvrtc: deps.join("nvrtc-13"),
    };
    let toolchain = KernelToolchain::open(&options).unwrap();
    let built = toolchain.build(&[gather_module(MlxDtype::Uint32)], &options.targets, &mut |_| {}).unwrap();
    let [module] = built.as_slice() else { panic!("{} modules built", built.len()) };
    let mut bytes = module.cubin.clone();
    bytes.extend_from_slice(module.names_txt.as_bytes());
    std::fs::write(out, bytes).unwrap();
}

/// A bundle must be byte-reproducible (docs/bundle-format.md), and NVRTC
/// names internal symbols after the clock and the process id unless the
/// source pins its module id (compiler/src/cuda/build.rs,
/// `MODULE_ID_ANCHOR`): two processes compile the same MLX module (the
/// gather, whose CCCL and cooperative-groups headers have such symbols;
/// about 5 s) and must write the same bytes.
#[test]
fn mlx_module_is_byte_identical_across_processes() {
    if let Some(out) = std::env::var_os(CHILD_OUT) {
        compile_gather(Path::new(&out));
        return;
    }
    let tmp = TempDir::new("cuda-repro");
    let children: Vec<_> = ["a", "b"]
        .iter()
        .map(|name| {
            let out = tmp.path().join(name);
            let child = Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "mlx_module_is_byte_identical_across_processes", "--test-threads=1"])
                .env(CHILD_OUT, &out)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            (out, child)
        })
        .collect();
    let children: Vec<_> = children.into_iter().map(|(out, child)| (out, child.wait_with_output().unwrap())).collect();
    for (out, child) in &children {
        assert!(child.status.success(), "{}", String::from_utf8_lossy(&child.stderr));
        assert!(out.is_file(), "{} was not written", out.display());
    }
    let (a, b) = (std::fs::read(&children[0].0).unwrap(), std::fs::read(&children[1].0).unwrap());
    assert!(a.windows(10).any(|w| w == b"_INTERNAL_"), "no internal symbols left to check");
    assert!(a == b, "two compiles of gather_uint32_uint32_1 differ");
}
