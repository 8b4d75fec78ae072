//! Installing a bundle's precompiled MLX CUDA kernels (`kernels` sections of
//! the `mlx-ptx-cache` set) into the folder MLX loads them from, without a
//! GPU: the GPU is described by hand, as `GpuTarget::detect` would on an
//! H200. What is checked: the right sections land byte for byte under their
//! keys and MLX is pointed there; a second process writes nothing; a stale
//! file is replaced; a bundle for another GPU, MLX version or CUDA major is
//! refused with both sides named, or left to MLX's JIT / the CPU when asked;
//! a key that is not a plain cache file name writes nothing.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use mlxcel_bundle::{Bundle, BundleWriter, ModelInfo, SectionSpec, kinds};
use mlxcel_mlx::cuda_kernels;
use mlxcel_runtime::gpu_kernels::{
    GpuKernelOptions, GpuTarget, Installed, KERNEL_SET_MLX_PTX_CACHE, MissingGpuKernels, install,
};

/// `install` points MLX at its folder through the process-wide
/// `MLX_PTX_CACHE_DIR`; the tests that install run one at a time so that
/// one's check of the variable never sees another's folder.
fn one_installer_at_a_time() -> MutexGuard<'static, ()> {
    static INSTALLING: Mutex<()> = Mutex::new(());
    INSTALLING.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn temp_dir(tag: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("mlxcel-gpu-kernels-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    std::fs::create_dir_all(&p).unwrap();
    p
}

fn h200() -> GpuTarget {
    GpuTarget { target: "cuda:sm_90a".into(), mlx_version: "0.32.4".into(), cuda_major: 13 }
}

/// (key, target, mlx_version, bytes) of each section.
type Entry<'a> = (&'a str, &'a str, &'a str, &'a [u8]);

fn write_bundle(path: &Path, entries: &[Entry<'_>]) -> Bundle {
    write_bundle_with_abi(path, entries, Some(&cuda_kernels::ABI.to_string()))
}

/// `write_bundle` with mlxcel's own module's sections marked as built for
/// interface version `own_abi` (none: as bundles stored before the mark).
fn write_bundle_with_abi(path: &Path, entries: &[Entry<'_>], own_abi: Option<&str>) -> Bundle {
    let model = ModelInfo { architecture: "llama".into(), name: "kernels".into(), config_json: "{}".into() };
    let mut w = BundleWriter::create(path, model).unwrap();
    for (key, target, mlx, bytes) in entries {
        let spec = SectionSpec::new(kinds::KERNELS, *key)
            .with_target(*target)
            .with_property("kernel_set", KERNEL_SET_MLX_PTX_CACHE)
            .with_property("mlx_version", *mlx)
            .with_property("cuda_major", "13");
        let spec = match own_abi {
            Some(abi) if key.starts_with(cuda_kernels::MODULE) => {
                spec.with_property(kinds::MLXCEL_KERNELS_ABI_KEY, abi)
            }
            _ => spec,
        };
        w.add_section_bytes(spec, bytes).unwrap();
    }
    w.finish().unwrap();
    Bundle::open(path).unwrap()
}

const MODULES: &[Entry<'static>] = &[
    ("gather_float32_uint32_1.ptx", "cuda:sm_90a", "0.32.4", b"\x7fELF cubin of the gather"),
    ("gather_float32_uint32_1.txt", "cuda:sm_90a", "0.32.4", b"mlx::core::cu::gather<...>\t_ZN3mlx4core2cu6gather\n"),
    ("qmm_naive_tn_aligned_float32_m16_b4_g32_affine.ptx", "cuda:sm_90a", "0.32.4", b"\x7fELF cubin of the qmm"),
    ("qmm_naive_tn_aligned_float32_m16_b4_g32_affine.txt", "cuda:sm_90a", "0.32.4", b"qmm\tmangled\n"),
    // Another GPU's: never installed on this one.
    ("gather_float32_uint32_1.ptx", "cuda:sm_80", "0.32.4", b"\x7fELF sm_80"),
];

#[test]
fn installs_the_sections_of_this_gpu_and_points_mlx_at_them() {
    let _serial = one_installer_at_a_time();
    let dir = temp_dir("install");
    let bundle = write_bundle(&dir.join("m.mlxb"), MODULES);
    let options = GpuKernelOptions { cache_root: Some(dir.join("cache")), missing: MissingGpuKernels::Refuse };
    let Installed::Kernels { dir: installed, modules, written, own_kernels, own_stale } =
        install(&bundle, &h200(), &options).unwrap()
    else {
        panic!("expected kernels")
    };
    assert_eq!((modules, written, own_kernels, own_stale), (2, 4, 0, None));
    assert!(installed.starts_with(dir.join("cache")), "{}", installed.display());
    for (key, target, _, bytes) in MODULES.iter().filter(|e| e.1 == "cuda:sm_90a") {
        assert_eq!(std::fs::read(installed.join(key)).unwrap(), *bytes, "{key} for {target}");
    }
    // Only the files of this GPU, and no temporary file left behind.
    assert_eq!(std::fs::read_dir(&installed).unwrap().count(), 4);
    assert_eq!(std::env::var_os("MLX_PTX_CACHE_DIR").map(PathBuf::from), Some(installed.clone()));

    // A second process on the same bundle finds them in place.
    let again = install(&bundle, &h200(), &options).unwrap();
    assert_eq!(
        again,
        Installed::Kernels { dir: installed.clone(), modules: 2, written: 0, own_kernels: 0, own_stale: None }
    );

    // A damaged file is replaced.
    std::fs::write(installed.join(MODULES[0].0), b"truncated").unwrap();
    let repaired = install(&bundle, &h200(), &options).unwrap();
    assert_eq!(
        repaired,
        Installed::Kernels { dir: installed.clone(), modules: 2, written: 1, own_kernels: 0, own_stale: None }
    );
    assert_eq!(std::fs::read(installed.join(MODULES[0].0)).unwrap(), MODULES[0].3);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_own_module_that_does_not_load_is_an_error_naming_it() {
    let _serial = one_installer_at_a_time();
    // Without a GPU (or without the `cuda` feature) mlxcel's own module
    // cannot load; a bundle that carries one must say so, not run without it
    // silently.
    let dir = temp_dir("products");
    let mut entries = MODULES.to_vec();
    entries.push(("mlxcel_kernels.ptx", "cuda:sm_90a", "0.32.4", b"\x7fELF not really a cubin"));
    entries.push(("mlxcel_kernels.txt", "cuda:sm_90a", "0.32.4", b"mlxcel::product<4, float, 1>\t_Z1x\n"));
    let bundle = write_bundle(&dir.join("m.mlxb"), &entries);
    let options = GpuKernelOptions { cache_root: Some(dir.join("cache")), missing: MissingGpuKernels::Refuse };
    let message = install(&bundle, &h200(), &options).unwrap_err().to_string();
    assert!(message.contains("mlxcel GPU kernels"), "{message}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_own_module_of_another_interface_version_is_left_unloaded() {
    let _serial = one_installer_at_a_time();
    // Its kernels would be launched with this runtime's argument layout and
    // shapes: MLX's operations run instead, and the report says why. Before
    // the version mark a module is version 1.
    let dir = temp_dir("own-abi");
    let mut entries = MODULES.to_vec();
    entries.push(("mlxcel_kernels.ptx", "cuda:sm_90a", "0.32.4", b"\x7fELF an older module"));
    entries.push(("mlxcel_kernels.txt", "cuda:sm_90a", "0.32.4", b"mlxcel::product<4, float, 1>\t_Z1x\n"));
    let options = GpuKernelOptions { cache_root: Some(dir.join("cache")), missing: MissingGpuKernels::Refuse };
    for (abi, seen) in [(None, 1), (Some("1"), 1), (Some("999"), 999), (Some("two"), 0)] {
        let bundle = write_bundle_with_abi(&dir.join(format!("m{seen}.mlxb")), &entries, abi);
        let installed = install(&bundle, &h200(), &options).unwrap();
        let Installed::Kernels { own_kernels, own_stale, .. } = &installed else { panic!("expected kernels") };
        assert_eq!((*own_kernels, *own_stale), (0, Some(seen)), "{abi:?}");
        let report = installed.to_string();
        assert!(report.contains(&format!("version {seen} of their interface")), "{report}");
        assert!(report.contains("recompile the bundle with --target cuda-smXY"), "{report}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_bundle_for_another_gpu_is_refused_naming_both() {
    let _serial = one_installer_at_a_time();
    let dir = temp_dir("refuse");
    let bundle = write_bundle(&dir.join("m.mlxb"), MODULES);
    let options = GpuKernelOptions { cache_root: Some(dir.join("cache")), missing: MissingGpuKernels::Refuse };
    for gpu in [
        GpuTarget { target: "cuda:sm_100a".into(), ..h200() },
        GpuTarget { mlx_version: "0.33.0".into(), ..h200() },
        GpuTarget { cuda_major: 12, ..h200() },
    ] {
        let message = install(&bundle, &gpu, &options).unwrap_err().to_string();
        assert!(message.contains(&gpu.target), "{message}");
        assert!(message.contains(&format!("MLX {}", gpu.mlx_version)), "{message}");
        assert!(message.contains("cuda:sm_80 (MLX 0.32.4, CUDA 13), cuda:sm_90a (MLX 0.32.4, CUDA 13)"), "{message}");
        assert!(message.contains("--gpu-kernels jit"), "{message}");
    }
    let sm100 = GpuTarget { target: "cuda:sm_100a".into(), ..h200() };
    let message = install(&bundle, &sm100, &options).unwrap_err().to_string();
    assert!(message.contains("--target cuda-sm100"), "{message}");
    assert!(!dir.join("cache").exists(), "nothing is written for a refused bundle");

    let none = write_bundle(&dir.join("plain.mlxb"), &[]);
    let message = install(&none, &h200(), &options).unwrap_err().to_string();
    assert!(message.contains("it has: none"), "{message}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn without_kernels_mlx_compiles_or_the_cpu_runs_when_asked() {
    let _serial = one_installer_at_a_time();
    let dir = temp_dir("fallback");
    let bundle = write_bundle(&dir.join("m.mlxb"), &[]);
    let jit = GpuKernelOptions { cache_root: Some(dir.join("cache")), missing: MissingGpuKernels::Jit };
    assert_eq!(install(&bundle, &h200(), &jit).unwrap(), Installed::Jit);
    let cpu = GpuKernelOptions { missing: MissingGpuKernels::Cpu, ..jit };
    assert_eq!(install(&bundle, &h200(), &cpu).unwrap(), Installed::Cpu);
    assert_eq!(mlxcel_mlx::device::default_device(), mlxcel_mlx::Device::Cpu);
    assert!(!dir.join("cache").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_key_that_is_not_a_cache_file_name_writes_nothing() {
    let _serial = one_installer_at_a_time();
    let dir = temp_dir("keys");
    for key in ["../escape.ptx", "sub/dir.ptx", "module.cu"] {
        let bundle = write_bundle(
            &dir.join("m.mlxb"),
            &[("gather_float32_uint32_1.ptx", "cuda:sm_90a", "0.32.4", b"ok"), (key, "cuda:sm_90a", "0.32.4", b"x")],
        );
        let options = GpuKernelOptions { cache_root: Some(dir.join("cache")), missing: MissingGpuKernels::Refuse };
        let message = install(&bundle, &h200(), &options).unwrap_err().to_string();
        assert!(message.contains(key), "{message}");
        assert!(!dir.join("cache").exists(), "{key}");
        assert!(!dir.join("escape.ptx").exists());
    }
    let _ = std::fs::remove_dir_all(&dir);
}
