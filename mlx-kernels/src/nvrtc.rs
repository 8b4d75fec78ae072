//! NVRTC, NVIDIA's run-time CUDA compiler, loaded with `dlopen`.
//!
//! MLX's CUDA backend compiles some kernel modules with NVRTC the first
//! time a process needs them (minutes on a fresh GPU host; docs/cuda.md
//! "Kernels compiled at run time"). `mlxcel-compile --target cuda-smXY`
//! makes the same modules ahead of time, on a machine without a GPU, and
//! stores them in the bundle. NVRTC needs no GPU and no driver, only its
//! shared library (the `nvidia-cuda-nvrtc` wheel), so this wrapper loads it
//! at run time: nothing links against CUDA, and the wrapper is built and
//! tested on every machine.
//!
//! [`Nvrtc::compile`] runs one [`Program`] (source, in-memory headers, name
//! expressions, options) and returns the cubin with each name expression's
//! lowered (mangled) name, which is what MLX's kernel cache stores.

use std::ffi::{CStr, CString, c_char, c_int};
use std::path::{Path, PathBuf};

type Status = c_int;
type ProgramHandle = *mut std::ffi::c_void;

/// What can go wrong loading NVRTC or compiling with it.
#[derive(Debug, thiserror::Error)]
pub enum NvrtcError {
    /// The shared library could not be loaded, or lacks a function.
    #[error("loading NVRTC from {}: {cause}", path.display())]
    Load {
        /// The library file.
        path: PathBuf,
        /// What the dynamic loader said (in the message, not `source()`).
        cause: String,
    },
    /// A string handed to NVRTC holds a NUL byte (C strings cannot).
    #[error("NVRTC program {program}: the {what} holds a NUL byte")]
    Nul {
        /// The program's name.
        program: String,
        /// Which string: the source, a header, an option, a name expression.
        what: String,
    },
    /// An NVRTC call other than the compilation failed.
    #[error("NVRTC program {program}: {call} failed: {status}")]
    Call {
        /// The program's name.
        program: String,
        /// The NVRTC function.
        call: &'static str,
        /// NVRTC's status string (`nvrtcGetErrorString`).
        status: String,
    },
    /// The compilation failed; the log says why.
    #[error("NVRTC program {program}: compilation failed ({status}):\n{log}")]
    Compile {
        /// The program's name.
        program: String,
        /// NVRTC's status string.
        status: String,
        /// The compiler's log.
        log: String,
    },
}

/// One in-memory header: what `#include "NAME"` in the source resolves to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// The name the source includes it by.
    pub include_name: String,
    /// Its text.
    pub source: String,
}

/// One NVRTC compilation's inputs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Program {
    /// The program's name (NVRTC's file name in messages).
    pub name: String,
    /// The CUDA source.
    pub source: String,
    /// Headers handed to NVRTC in memory.
    pub headers: Vec<Header>,
    /// Name expressions (`ns::kernel<T, 4>`) whose lowered names are wanted;
    /// each is instantiated by NVRTC.
    pub name_expressions: Vec<String>,
    /// Compiler options (`--gpu-architecture=sm_90a`, `--include-path=...`).
    pub options: Vec<String>,
}

/// One compilation's outputs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Compiled {
    /// The cubin (an ELF file of machine code for the one architecture).
    pub cubin: Vec<u8>,
    /// Each name expression with its lowered (mangled) name, in the
    /// program's order.
    pub lowered_names: Vec<(String, String)>,
    /// The compiler's log (warnings; often empty).
    pub log: String,
}

/// The NVRTC functions used, copied out of the loaded library.
#[derive(Clone, Copy)]
struct Functions {
    version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> Status,
    error_string: unsafe extern "C" fn(Status) -> *const c_char,
    create: unsafe extern "C" fn(
        *mut ProgramHandle,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> Status,
    destroy: unsafe extern "C" fn(*mut ProgramHandle) -> Status,
    add_name_expression: unsafe extern "C" fn(ProgramHandle, *const c_char) -> Status,
    compile: unsafe extern "C" fn(ProgramHandle, c_int, *const *const c_char) -> Status,
    log_size: unsafe extern "C" fn(ProgramHandle, *mut usize) -> Status,
    log: unsafe extern "C" fn(ProgramHandle, *mut c_char) -> Status,
    cubin_size: unsafe extern "C" fn(ProgramHandle, *mut usize) -> Status,
    cubin: unsafe extern "C" fn(ProgramHandle, *mut c_char) -> Status,
    lowered_name: unsafe extern "C" fn(ProgramHandle, *const c_char, *mut *const c_char) -> Status,
}

/// A loaded NVRTC library.
pub struct Nvrtc {
    functions: Functions,
    path: PathBuf,
    // The function pointers point into these: they live as long as `self`.
    _library: libloading::Library,
    _builtins: Option<libloading::Library>,
}

impl std::fmt::Debug for Nvrtc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nvrtc").field("path", &self.path).finish_non_exhaustive()
    }
}

// SAFETY: NVRTC's API is thread-safe for distinct programs (each
// compilation here owns its program from creation to destruction), and the
// libraries stay loaded for the lifetime of `Nvrtc`.
unsafe impl Send for Nvrtc {}
// SAFETY: as for `Send`: no state is shared between calls but the library.
unsafe impl Sync for Nvrtc {}

/// Destroys an NVRTC program when dropped.
struct ProgramGuard<'a> {
    nvrtc: &'a Nvrtc,
    handle: ProgramHandle,
}

impl Drop for ProgramGuard<'_> {
    fn drop(&mut self) {
        // SAFETY: `handle` came from nvrtcCreateProgram and is destroyed once.
        unsafe { (self.nvrtc.functions.destroy)(&mut self.handle) };
    }
}

fn c_string(program: &str, what: impl Into<String>, s: &str) -> Result<CString, NvrtcError> {
    CString::new(s).map_err(|_| NvrtcError::Nul { program: program.to_string(), what: what.into() })
}

impl Nvrtc {
    /// Loads NVRTC from `path` (e.g. `.../nvidia/cu13/lib/libnvrtc.so.13`).
    ///
    /// NVRTC loads `libnvrtc-builtins` itself when compiling; a copy beside
    /// `path` (as the wheel has it) is loaded first, so that no
    /// `LD_LIBRARY_PATH` is needed: the dynamic loader reuses a library
    /// already loaded under the same name.
    pub fn open(path: impl AsRef<Path>) -> Result<Nvrtc, NvrtcError> {
        let path = path.as_ref().to_path_buf();
        let load = |cause: libloading::Error| NvrtcError::Load { path: path.clone(), cause: cause.to_string() };
        let builtins = match path.parent().and_then(builtins_beside) {
            // SAFETY: loading NVIDIA's library runs its initialisers, which
            // have no preconditions.
            Some(b) => Some(
                unsafe { libloading::Library::new(&b) }
                    .map_err(|cause| NvrtcError::Load { path: b.clone(), cause: cause.to_string() })?,
            ),
            None => None,
        };
        // SAFETY: as above.
        let library = unsafe { libloading::Library::new(&path) }.map_err(load)?;
        // SAFETY: each symbol is looked up by its documented name and given
        // the signature of nvrtc.h.
        let functions = unsafe {
            Functions {
                version: *library.get(b"nvrtcVersion\0").map_err(load)?,
                error_string: *library.get(b"nvrtcGetErrorString\0").map_err(load)?,
                create: *library.get(b"nvrtcCreateProgram\0").map_err(load)?,
                destroy: *library.get(b"nvrtcDestroyProgram\0").map_err(load)?,
                add_name_expression: *library.get(b"nvrtcAddNameExpression\0").map_err(load)?,
                compile: *library.get(b"nvrtcCompileProgram\0").map_err(load)?,
                log_size: *library.get(b"nvrtcGetProgramLogSize\0").map_err(load)?,
                log: *library.get(b"nvrtcGetProgramLog\0").map_err(load)?,
                cubin_size: *library.get(b"nvrtcGetCUBINSize\0").map_err(load)?,
                cubin: *library.get(b"nvrtcGetCUBIN\0").map_err(load)?,
                lowered_name: *library.get(b"nvrtcGetLoweredName\0").map_err(load)?,
            }
        };
        Ok(Nvrtc { functions, path, _library: library, _builtins: builtins })
    }

    /// The library file this was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// NVRTC's version, `(major, minor)` (13.0 for the CUDA 13.0 wheel).
    pub fn version(&self) -> Result<(i32, i32), NvrtcError> {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: two valid out-pointers.
        let status = unsafe { (self.functions.version)(&mut major, &mut minor) };
        self.check("", "nvrtcVersion", status)?;
        Ok((major, minor))
    }

    /// NVRTC's name for a status code.
    fn status_string(&self, status: Status) -> String {
        // SAFETY: nvrtcGetErrorString returns a static string (or null).
        let s = unsafe { (self.functions.error_string)(status) };
        if s.is_null() {
            return format!("NVRTC status {status}");
        }
        // SAFETY: non-null, NUL-terminated, static.
        unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
    }

    fn check(&self, program: &str, call: &'static str, status: Status) -> Result<(), NvrtcError> {
        if status == 0 {
            return Ok(());
        }
        Err(NvrtcError::Call { program: program.to_string(), call, status: self.status_string(status) })
    }

    /// Compiles `program` to a cubin (the architecture is the option
    /// `--gpu-architecture=sm_XY`), with each name expression's lowered name.
    pub fn compile(&self, program: &Program) -> Result<Compiled, NvrtcError> {
        let name = program.name.as_str();
        let source = c_string(name, "source", &program.source)?;
        let program_name = c_string(name, "name", name)?;
        let headers = program
            .headers
            .iter()
            .map(|h| c_string(name, format!("header {}", h.include_name), &h.source))
            .collect::<Result<Vec<_>, _>>()?;
        let include_names = program
            .headers
            .iter()
            .map(|h| c_string(name, "include name", &h.include_name))
            .collect::<Result<Vec<_>, _>>()?;
        let expressions = program
            .name_expressions
            .iter()
            .map(|e| c_string(name, format!("name expression {e}"), e))
            .collect::<Result<Vec<_>, _>>()?;
        let options =
            program.options.iter().map(|o| c_string(name, format!("option {o}"), o)).collect::<Result<Vec<_>, _>>()?;
        let header_ptrs: Vec<*const c_char> = headers.iter().map(|h| h.as_ptr()).collect();
        let include_ptrs: Vec<*const c_char> = include_names.iter().map(|h| h.as_ptr()).collect();
        let option_ptrs: Vec<*const c_char> = options.iter().map(|o| o.as_ptr()).collect();
        let f = self.functions;

        let mut handle: ProgramHandle = std::ptr::null_mut();
        // SAFETY: every pointer is a live NUL-terminated string; the arrays
        // have `headers.len()` entries each.
        let status = unsafe {
            (f.create)(
                &mut handle,
                source.as_ptr(),
                program_name.as_ptr(),
                header_ptrs.len() as c_int,
                header_ptrs.as_ptr(),
                include_ptrs.as_ptr(),
            )
        };
        self.check(name, "nvrtcCreateProgram", status)?;
        let guard = ProgramGuard { nvrtc: self, handle };
        for e in &expressions {
            // SAFETY: a live program and string.
            let status = unsafe { (f.add_name_expression)(guard.handle, e.as_ptr()) };
            self.check(name, "nvrtcAddNameExpression", status)?;
        }
        // SAFETY: a live program; `option_ptrs` has that many live strings.
        let compiled = unsafe { (f.compile)(guard.handle, option_ptrs.len() as c_int, option_ptrs.as_ptr()) };
        let log = self.log(&guard)?;
        if compiled != 0 {
            return Err(NvrtcError::Compile { program: name.to_string(), status: self.status_string(compiled), log });
        }
        let mut lowered_names = Vec::with_capacity(expressions.len());
        for (expression, e) in program.name_expressions.iter().zip(&expressions) {
            let mut lowered: *const c_char = std::ptr::null();
            // SAFETY: a compiled program, a name expression added to it.
            let status = unsafe { (f.lowered_name)(guard.handle, e.as_ptr(), &mut lowered) };
            self.check(name, "nvrtcGetLoweredName", status)?;
            if lowered.is_null() {
                return Err(NvrtcError::Call {
                    program: name.to_string(),
                    call: "nvrtcGetLoweredName",
                    status: format!("no lowered name for {expression}"),
                });
            }
            // SAFETY: NUL-terminated, owned by the program, which is alive.
            let lowered = unsafe { CStr::from_ptr(lowered) }.to_string_lossy().into_owned();
            lowered_names.push((expression.clone(), lowered));
        }
        let mut size = 0usize;
        // SAFETY: a compiled program, a valid out-pointer.
        let status = unsafe { (f.cubin_size)(guard.handle, &mut size) };
        self.check(name, "nvrtcGetCUBINSize", status)?;
        let mut cubin = vec![0u8; size];
        // SAFETY: `cubin` has the `size` bytes NVRTC asked for.
        let status = unsafe { (f.cubin)(guard.handle, cubin.as_mut_ptr().cast()) };
        self.check(name, "nvrtcGetCUBIN", status)?;
        Ok(Compiled { cubin, lowered_names, log })
    }

    /// The program's log, without its terminating NUL.
    fn log(&self, guard: &ProgramGuard<'_>) -> Result<String, NvrtcError> {
        let name = "";
        let mut size = 0usize;
        // SAFETY: a live program, a valid out-pointer.
        let status = unsafe { (self.functions.log_size)(guard.handle, &mut size) };
        self.check(name, "nvrtcGetProgramLogSize", status)?;
        let mut log = vec![0u8; size.max(1)];
        // SAFETY: `log` has the bytes NVRTC asked for.
        let status = unsafe { (self.functions.log)(guard.handle, log.as_mut_ptr().cast()) };
        self.check(name, "nvrtcGetProgramLog", status)?;
        let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
        Ok(String::from_utf8_lossy(&log[..end]).into_owned())
    }
}

/// `libnvrtc-builtins.so.*` in `dir` (the first in name order), if any;
/// not the `.alt` build, which belongs to `libnvrtc.alt`.
fn builtins_beside(dir: &Path) -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("libnvrtc-builtins.so.")))
        .collect();
    found.sort();
    found.into_iter().next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_names_its_path() {
        let err = Nvrtc::open("/nonexistent/libnvrtc.so.13").unwrap_err();
        let message = err.to_string();
        assert!(message.starts_with("loading NVRTC from /nonexistent/libnvrtc.so.13: "), "{message}");
    }

    /// NVRTC as `make setup-cuda` installs it (fails, never skips, when missing).
    fn nvrtc() -> Nvrtc {
        let deps = std::env::var_os("MLXCEL_DEPS_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.deps"));
        let lib = deps.join("nvrtc-13/nvidia/cu13/lib/libnvrtc.so.13");
        assert!(lib.is_file(), "{} is missing: run `make setup-cuda`", lib.display());
        Nvrtc::open(lib).unwrap()
    }

    fn program(source: &str) -> Program {
        Program {
            name: "t.cu".into(),
            source: source.into(),
            headers: vec![Header { include_name: "inc/one.h".into(), source: "#define ONE 1\n".into() }],
            name_expressions: vec!["add<float>".into(), "add<int>".into()],
            options: vec!["--gpu-architecture=sm_90a".into()],
        }
    }

    #[test]
    fn compiles_a_template_kernel_to_a_cubin_with_lowered_names() {
        let nvrtc = nvrtc();
        assert_eq!(nvrtc.version().unwrap().0, 13);
        let source = "#include \"inc/one.h\"\ntemplate <typename T> __global__ void add(T* x) { x[0] += ONE; }\n";
        let out = nvrtc.compile(&program(source)).unwrap();
        assert_eq!(&out.cubin[..4], b"\x7fELF");
        // e_machine: EM_CUDA.
        assert_eq!(u16::from_le_bytes([out.cubin[18], out.cubin[19]]), 190);
        assert_eq!(
            out.lowered_names,
            [("add<float>".to_string(), "_Z3addIfEvPT_".to_string()), ("add<int>".into(), "_Z3addIiEvPT_".into())]
        );
    }

    #[test]
    fn a_failed_compile_carries_the_log() {
        let err =
            nvrtc().compile(&program("template <typename T> __global__ void add(T* x) { x[0] += TWO; }")).unwrap_err();
        let message = err.to_string();
        assert!(matches!(err, NvrtcError::Compile { .. }), "{message}");
        assert!(message.contains("NVRTC_ERROR_COMPILATION") && message.contains("TWO"), "{message}");
        let err = nvrtc().compile(&program("\0")).unwrap_err();
        assert_eq!(err.to_string(), "NVRTC program t.cu: the source holds a NUL byte");
    }

    #[test]
    fn a_library_without_nvrtc_names_the_missing_function() {
        // libm is on every Linux machine and has no NVRTC symbol.
        let err = Nvrtc::open("libm.so.6").unwrap_err();
        assert!(err.to_string().contains("nvrtcVersion"), "{err}");
    }
}
