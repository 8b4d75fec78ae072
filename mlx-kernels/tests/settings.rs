//! The settings binaries parse from the environment (`mlxcel_mlx::settings`):
//! every variable's values and errors, what `apply` changes, and that the
//! README documents every variable. Its own test binary: `apply` changes
//! process-wide state that the kernel tests hold still.

use std::collections::HashMap;

use mlxcel_mlx::fast::{self, Isa, Path};
use mlxcel_mlx::settings::{self, Settings, SettingsError};
use mlxcel_mlx::{Device, DeviceRequest};

fn parse(vars: &[(&str, &str)]) -> Result<Settings, SettingsError> {
    let env: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    Settings::from_env(|k| env.get(k).cloned())
}

#[test]
fn unset_and_empty_variables_give_the_defaults() {
    assert_eq!(parse(&[]).unwrap(), Settings::default());
    let empty: Vec<(&str, &str)> = settings::VARIABLES.iter().map(|v| (v.name, " ")).collect();
    assert_eq!(parse(&empty).unwrap(), Settings::default());
    let d = Settings::default();
    assert_eq!((d.device, d.isa, d.threads), (DeviceRequest::Auto, None, None));
    assert_eq!((d.spin_us, d.spin_yield, d.kernels, d.inline_eval), (3000, true, Path::Auto, true));
}

#[test]
fn every_variable_parses_its_values() {
    let s = parse(&[
        ("MLXCEL_DEVICE", "CPU"),
        ("MLXCEL_ISA", "avx2"),
        ("MLXCEL_THREADS", " 3 "),
        ("MLXCEL_SPIN_US", "0"),
        ("MLXCEL_SPIN_YIELD", "off"),
        ("MLXCEL_KERNELS", "mlx"),
        ("MLXCEL_INLINE_EVAL", "0"),
        ("MLXCEL_AMX", "no"),
        ("MLXCEL_STEP_GRAPHS", "off"),
    ])
    .unwrap();
    assert_eq!(s.device, DeviceRequest::Exactly(Device::Cpu));
    assert_eq!(s.isa, Some(Isa::Avx2));
    assert_eq!(s.threads, Some(3));
    assert_eq!((s.spin_us, s.spin_yield, s.kernels, s.inline_eval), (0, false, Path::Mlx, false));
    assert!(!s.amx);
    assert!(!s.step_graphs);
    for (value, path) in [("auto", Path::Auto), ("1", Path::Auto), ("kernel", Path::Kernel), ("off", Path::Mlx)] {
        assert_eq!(parse(&[("MLXCEL_KERNELS", value)]).unwrap().kernels, path, "{value}");
    }
    for isa in Isa::ALL {
        assert_eq!(parse(&[("MLXCEL_ISA", isa.name())]).unwrap().isa, Some(isa));
    }
    assert_eq!(parse(&[("MLXCEL_DEVICE", "cuda")]).unwrap().device, DeviceRequest::Exactly(Device::Gpu));
    assert_eq!(parse(&[("MLXCEL_THREADS", "4096")]).unwrap().threads, Some(4096));
}

#[test]
fn invalid_values_are_errors_naming_the_variable_and_value() {
    let cases = [
        ("MLXCEL_THREADS", "abc", "MLXCEL_THREADS=abc: expected a positive integer up to 4096"),
        ("MLXCEL_THREADS", "0", "MLXCEL_THREADS=0: expected a positive integer up to 4096"),
        ("MLXCEL_THREADS", "4097", "MLXCEL_THREADS=4097: expected"),
        ("MLXCEL_ISA", "foo", "MLXCEL_ISA=foo: expected scalar, avx2, avx2i16, avx512, avx512vnni or neon"),
        ("MLXCEL_DEVICE", "tpu", "MLXCEL_DEVICE=tpu: expected cpu, gpu or auto"),
        ("MLXCEL_SPIN_US", "-1", "MLXCEL_SPIN_US=-1: expected microseconds"),
        ("MLXCEL_SPIN_US", "2000000", "MLXCEL_SPIN_US=2000000: expected"),
        ("MLXCEL_SPIN_YIELD", "maybe", "MLXCEL_SPIN_YIELD=maybe: expected 1 or 0"),
        ("MLXCEL_KERNELS", "fast", "MLXCEL_KERNELS=fast: expected auto, kernel or mlx"),
        ("MLXCEL_INLINE_EVAL", "2", "MLXCEL_INLINE_EVAL=2: expected 1 or 0"),
        ("MLXCEL_AMX", "tiles", "MLXCEL_AMX=tiles: expected 1 or 0"),
        ("MLXCEL_STEP_GRAPHS", "graph", "MLXCEL_STEP_GRAPHS=graph: expected 1 or 0"),
    ];
    for (var, value, message) in cases {
        let err = parse(&[(var, value)]).unwrap_err();
        assert!(err.to_string().starts_with(message), "{var}={value}: {err}");
        assert!(matches!(err, SettingsError::Invalid { var: v, .. } if v == var));
    }
}

#[test]
fn apply_sets_the_process_state_and_defaults_restore_it() {
    let worst = Isa::ALL.into_iter().find(|i| i.is_supported()).unwrap();
    let s = Settings {
        device: DeviceRequest::Exactly(Device::Cpu),
        isa: Some(worst),
        threads: Some(3),
        spin_us: 10,
        spin_yield: false,
        kernels: Path::Mlx,
        inline_eval: false,
        amx: false,
        step_graphs: false,
    };
    assert_eq!(s.apply().unwrap(), Device::Cpu);
    assert_eq!(fast::isa(), worst);
    assert_eq!(fast::default_threads(), 3);
    fast::set_threads(1);
    fast::set_threads(0);
    assert_eq!(fast::threads(), 3, "set_threads(0) restores the applied count");
    assert_eq!(fast::default_path(), Path::Mlx);
    assert!(!fast::inline_eval());
    assert!(!fast::amx_active());
    assert!(!fast::step_graphs());
    let d = Settings { device: DeviceRequest::Exactly(Device::Cpu), ..Settings::default() };
    d.apply().unwrap();
    assert_eq!(fast::isa(), Isa::best());
    assert_eq!(fast::default_path(), Path::Auto);
    assert!(fast::inline_eval());
    assert!(fast::step_graphs(), "on by default");
    assert_eq!(fast::amx_active(), fast::amx_supported());
    assert!(fast::default_threads() >= 1);
    assert_eq!(fast::threads(), fast::default_threads());
    // What this machine cannot run is an error naming the variable.
    if let Some(unsupported) = Isa::ALL.into_iter().find(|i| !i.is_supported()) {
        let err = Settings { isa: Some(unsupported), ..d }.apply().unwrap_err().to_string();
        assert!(err.starts_with(&format!("MLXCEL_ISA={unsupported}: ")), "{err}");
    }
    if !Device::Gpu.is_available() {
        let err = Settings { device: DeviceRequest::Exactly(Device::Gpu), ..d }.apply().unwrap_err().to_string();
        assert!(err.starts_with("MLXCEL_DEVICE=gpu: "), "{err}");
    }
}

/// README.md has one table of every variable, docs/kernels.md names each.
#[test]
fn every_variable_is_documented() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let kernels = std::fs::read_to_string(root.join("docs/kernels.md")).unwrap();
    for v in settings::VARIABLES {
        assert!(readme.contains(&format!("| `{}` |", v.name)), "README.md's table lacks {}", v.name);
        assert!(kernels.contains(v.name), "docs/kernels.md does not mention {}", v.name);
    }
}
