#![allow(dead_code)] // Each test binary uses part of these helpers.

//! Running emitted modules with IREE's own tools (`make setup` installs them
//! into `.deps/iree`): `iree-compile`, then `iree-run-module` with the
//! weights as a safetensors parameter file and the inputs and outputs as
//! `.npy` files.

use std::path::{Path, PathBuf};
use std::process::Command;

use mlxcel_stablehlo::{IreeCompiler, PARAMETER_SCOPE, Target};

/// The deps folder `make setup` fills.
pub fn deps() -> PathBuf {
    std::env::var_os("MLXCEL_DEPS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.deps"))
}

/// `iree-compile`, which must be installed (`make setup`).
pub fn compiler() -> IreeCompiler {
    let program = IreeCompiler::in_deps(&deps());
    assert!(program.is_file(), "{} is missing: run `make setup` (it installs deps/iree.txt)", program.display());
    IreeCompiler::new(program)
}

fn run_module_program() -> PathBuf {
    let program = deps().join("iree/iree/_runtime_libs/iree-run-module");
    assert!(program.is_file(), "{} is missing: run `make setup` (it installs deps/iree.txt)", program.display());
    program
}

/// A typed host array for a function's inputs and the parameter file.
pub enum Data {
    F32(Vec<f32>),
    I32(Vec<i32>),
    U32(Vec<u32>),
    /// Little-endian bytes of the safetensors dtype named (parameters only).
    Raw(Vec<u8>, &'static str),
}

impl Data {
    fn bytes(&self) -> Vec<u8> {
        match self {
            Data::F32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Data::I32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Data::U32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Data::Raw(b, _) => b.clone(),
        }
    }

    fn npy_descr(&self) -> &'static str {
        match self {
            Data::F32(_) => "<f4",
            Data::I32(_) => "<i4",
            Data::U32(_) => "<u4",
            Data::Raw(..) => panic!("raw bytes are for parameter files, not inputs"),
        }
    }

    fn safetensors_dtype(&self) -> &'static str {
        match self {
            Data::F32(_) => "F32",
            Data::I32(_) => "I32",
            // The words of packed codes: IREE's parameters are signless.
            Data::U32(_) => "I32",
            Data::Raw(_, dtype) => dtype,
        }
    }
}

/// A temporary folder removed when dropped.
pub struct Scratch(PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("mlxcel-stablehlo-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn write_npy(path: &Path, data: &Data, shape: &[i64]) {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let tuple = match dims.len() {
        0 => "()".to_string(),
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let mut header = format!("{{'descr': '{}', 'fortran_order': False, 'shape': {tuple}, }}", data.npy_descr());
    // Magic, version, length, header: a multiple of 64 bytes ending in '\n'.
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend((header.len() as u16).to_le_bytes());
    out.extend(header.as_bytes());
    out.extend(data.bytes());
    std::fs::write(path, out).unwrap();
}

fn read_npy_f32(path: &Path) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(&bytes[..6], b"\x93NUMPY", "{} is not .npy", path.display());
    let (len, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        _ => (u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize, 12),
    };
    let header = std::str::from_utf8(&bytes[start..start + len]).unwrap();
    assert!(header.contains("'<f4'"), "{}: {header}", path.display());
    bytes[start + len..].chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// A safetensors file of `tensors` (name, data, shape).
fn write_safetensors(path: &Path, tensors: &[(&str, &Data, &[i64])]) {
    let mut header = String::from("{");
    let mut body = Vec::new();
    for (i, (name, data, shape)) in tensors.iter().enumerate() {
        let bytes = data.bytes();
        let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
        if i > 0 {
            header.push(',');
        }
        header.push_str(&format!(
            "\"{name}\":{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
            data.safetensors_dtype(),
            dims.join(","),
            body.len(),
            body.len() + bytes.len()
        ));
        body.extend(bytes);
    }
    header.push('}');
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend(header.as_bytes());
    out.extend(body);
    std::fs::write(path, out).unwrap();
}

/// An input of a function: an array, or an i32 scalar.
pub enum Input<'a> {
    Array(&'a Data, &'a [i64]),
    ScalarI32(i32),
}

/// A compiled module, ready to run its functions.
pub struct Compiled {
    scratch: Scratch,
    params: Option<PathBuf>,
}

impl Compiled {
    /// Compiles `mlir` for this machine's CPU with the weights in `params`.
    pub fn new(tag: &str, mlir: &str, params: &[(&str, &Data, &[i64])]) -> Compiled {
        let vmfb = compiler().compile(mlir, &Target::host_cpu()).unwrap_or_else(|e| panic!("{e}\n{mlir}"));
        Compiled::from_vmfb(tag, &vmfb, params)
    }

    /// A module compiled already (`vmfb`), with the weights in `params`.
    pub fn from_vmfb(tag: &str, vmfb: &[u8], params: &[(&str, &Data, &[i64])]) -> Compiled {
        let scratch = Scratch::new(tag);
        std::fs::write(scratch.path("module.vmfb"), vmfb).unwrap();
        let params = (!params.is_empty()).then(|| {
            let p = scratch.path("params.safetensors");
            write_safetensors(&p, params);
            p
        });
        Compiled { scratch, params }
    }

    /// Runs `function` on `inputs`; its `outputs` f32 results, flattened.
    pub fn run(&self, function: &str, inputs: &[Input<'_>], outputs: usize) -> Vec<Vec<f32>> {
        let mut cmd = Command::new(run_module_program());
        cmd.arg("--device=local-task")
            .arg(format!("--module={}", self.scratch.path("module.vmfb").display()))
            .arg(format!("--function={function}"));
        if let Some(p) = &self.params {
            cmd.arg(format!("--parameters={PARAMETER_SCOPE}={}", p.display()));
        }
        for (i, input) in inputs.iter().enumerate() {
            match input {
                Input::Array(data, shape) => {
                    let p = self.scratch.path(&format!("{function}.in{i}.npy"));
                    write_npy(&p, data, shape);
                    cmd.arg(format!("--input=@{}", p.display()));
                }
                Input::ScalarI32(v) => {
                    cmd.arg(format!("--input=i32={v}"));
                }
            }
        }
        let outs: Vec<PathBuf> = (0..outputs).map(|i| self.scratch.path(&format!("{function}.out{i}.npy"))).collect();
        for p in &outs {
            cmd.arg(format!("--output=@{}", p.display()));
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "iree-run-module {function}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        outs.iter().map(|p| read_npy_f32(p)).collect()
    }
}
