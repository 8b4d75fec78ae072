//! Compiling the planned modules with NVRTC, as MLX's `jit_module.cpp`
//! would on the GPU host (the same source, in-memory device headers,
//! include folders and options; mlxcel's own module with its own), two
//! modules at a time.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Instant;

use mlxcel_mlx::nvrtc::{Header, Nvrtc, Program};

use super::plan::{KernelModule, ModuleSource};
use super::wheel::{DEVICE_HEADERS, MlxCuda, include_name};
use super::{CudaKernelOptions, CudaTarget, KernelError};

/// Appended to each of MLX's module sources so that the cubin is the same
/// on every compile. NVRTC's front end names internal-linkage entities
/// (`static` and `constexpr` variables of CCCL's and cooperative groups'
/// headers, anonymous namespaces) `_INTERNAL_..._NAME_cu_<module id>`, and
/// when the translation unit defines no function with external linkage, as
/// MLX's template-only sources do not, that id comes from the clock and the
/// process id (`_cu_d5f3a69c_16662`): two compiles of the same module
/// differed in those names. A defined external function makes the id a
/// hash of its name, as mlxcel's own module already was. The kernels' code
/// and their lowered names (which the `NAME.txt` files carry and MLX looks
/// up) do not change; the function is never called.
const MODULE_ID_ANCHOR: &str =
    "\n// mlxcel: fixes NVRTC's module id (compiler/src/cuda/build.rs)\n__device__ void mlxcel_module_id_anchor() {}\n";

/// Modules compiled at once. NVRTC uses one core per compilation; two
/// keep a small machine busy without starving the rest of the compile.
const WORKERS: usize = 2;

/// NVRTC and MLX's CUDA wheel, loaded and checked (before the bundle's
/// output file exists).
#[derive(Debug)]
pub struct KernelToolchain {
    mlx: MlxCuda,
    nvrtc: Nvrtc,
    cuda_include: PathBuf,
    headers: Vec<Header>,
    cuda_major: i32,
}

/// One module compiled for one target.
#[derive(Clone, Debug)]
pub struct BuiltModule {
    /// MLX's module name.
    pub name: String,
    /// The architecture.
    pub target: CudaTarget,
    /// The cubin (MLX's `NAME.ptx`).
    pub cubin: Vec<u8>,
    /// MLX's `NAME.txt`: per kernel, its name expression, a tab, its
    /// lowered name and a newline.
    pub names_txt: String,
    /// Seconds NVRTC took.
    pub seconds: f64,
}

/// Progress of [`KernelToolchain::build`].
#[derive(Clone, Copy, Debug)]
pub enum KernelEvent<'a> {
    /// Compilation starts: `jobs` module-target pairs, `workers` at a time.
    Started {
        /// Module-target pairs.
        jobs: usize,
        /// Compiled at once.
        workers: usize,
    },
    /// One module is compiled.
    Finished {
        /// Its name.
        module: &'a str,
        /// Its target.
        target: CudaTarget,
        /// Seconds NVRTC took.
        seconds: f64,
        /// Bytes of cubin.
        bytes: usize,
        /// Jobs finished so far (this one included).
        done: usize,
        /// All jobs.
        jobs: usize,
    },
}

impl KernelToolchain {
    /// Loads NVRTC from `options.nvrtc` and reads MLX's CUDA wheel at
    /// `options.mlx_cuda` (refusing any MLX but [`super::MLX_VERSION`]).
    pub fn open(options: &CudaKernelOptions) -> Result<KernelToolchain, KernelError> {
        let mlx = MlxCuda::open(&options.mlx_cuda)?;
        let cu13 = options.nvrtc.join("nvidia/cu13");
        let library = cu13.join("lib/libnvrtc.so.13");
        let cuda_include = cu13.join("include");
        if !library.is_file() || !cuda_include.join("cuda_runtime.h").is_file() {
            return Err(KernelError::NoNvrtc { dir: options.nvrtc.clone() });
        }
        let nvrtc = Nvrtc::open(&library)?;
        let (cuda_major, _) = nvrtc.version()?;
        let headers = DEVICE_HEADERS
            .iter()
            .map(|h| Header {
                include_name: include_name(h),
                source: mlx.source(h).expect("MlxCuda::open checked every header").to_string(),
            })
            .collect();
        Ok(KernelToolchain { mlx, nvrtc, cuda_include, headers, cuda_major })
    }

    /// NVRTC's major version (13 for the CUDA 13 wheel).
    pub fn cuda_major(&self) -> i32 {
        self.cuda_major
    }

    /// The NVRTC library loaded.
    pub fn nvrtc_path(&self) -> &Path {
        self.nvrtc.path()
    }

    /// MLX's options for `target` (`jit_module.cpp`'s `compile`).
    fn options(&self, target: CudaTarget) -> Vec<String> {
        let include = self.mlx.dir.join("include");
        vec![
            "--device-as-default-execution-space".into(),
            format!("--gpu-architecture={}", target.nvrtc_arch()),
            format!("--include-path={}", include.display()),
            format!("--include-path={}", include.join("cccl").display()),
            format!("--include-path={}", self.cuda_include.display()),
        ]
    }

    /// Compiles one module for one target.
    fn build_one(&self, module: &KernelModule, target: CudaTarget) -> Result<BuiltModule, KernelError> {
        let program = match module.source {
            ModuleSource::Mlx(symbol) => {
                let source = self.mlx.source(symbol).ok_or_else(|| KernelError::Library {
                    path: self.mlx.dir.join("lib/libmlx.so"),
                    message: format!("no jit_source_{symbol}"),
                })?;
                Program {
                    name: format!("{}.cu", module.name),
                    source: format!("{source}{MODULE_ID_ANCHOR}"),
                    headers: self.headers.clone(),
                    name_expressions: module.name_expressions.clone(),
                    options: self.options(target),
                }
            }
            ModuleSource::Mlxcel => mlxcel_mlx::cuda_kernels::program(&target.nvrtc_arch(), &self.cuda_include),
        };
        let start = Instant::now();
        let compiled = self.nvrtc.compile(&program)?;
        let names_txt = compiled.lowered_names.iter().map(|(e, lowered)| format!("{e}\t{lowered}\n")).collect();
        Ok(BuiltModule {
            name: module.name.clone(),
            target,
            cubin: compiled.cubin,
            names_txt,
            seconds: start.elapsed().as_secs_f64(),
        })
    }

    /// Compiles every module for every target, [`WORKERS`] at a time;
    /// returns them in `modules` order, target by target within a module.
    /// The first failure stops the rest (those under way finish).
    pub fn build(
        &self,
        modules: &[KernelModule],
        targets: &[CudaTarget],
        progress: &mut dyn FnMut(KernelEvent<'_>),
    ) -> Result<Vec<BuiltModule>, KernelError> {
        let jobs: Vec<(&KernelModule, CudaTarget)> =
            modules.iter().flat_map(|m| targets.iter().map(move |&t| (m, t))).collect();
        let workers = WORKERS.min(jobs.len());
        progress(KernelEvent::Started { jobs: jobs.len(), workers });
        let next = AtomicUsize::new(0);
        let stop = AtomicBool::new(false);
        let mut built: Vec<Option<BuiltModule>> = vec![None; jobs.len()];
        let mut failure = None;
        std::thread::scope(|scope| {
            let (sender, receiver) = mpsc::channel();
            for _ in 0..workers {
                let sender = sender.clone();
                let (jobs, next, stop) = (&jobs, &next, &stop);
                scope.spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(&(module, target)) = jobs.get(i) else { break };
                        let result = self.build_one(module, target);
                        if result.is_err() {
                            stop.store(true, Ordering::Relaxed);
                        }
                        if sender.send((i, result)).is_err() {
                            break;
                        }
                    }
                });
            }
            drop(sender);
            let mut done = 0;
            for (i, result) in receiver {
                match result {
                    Ok(m) => {
                        done += 1;
                        progress(KernelEvent::Finished {
                            module: &m.name,
                            target: m.target,
                            seconds: m.seconds,
                            bytes: m.cubin.len(),
                            done,
                            jobs: jobs.len(),
                        });
                        built[i] = Some(m);
                    }
                    Err(e) => {
                        failure.get_or_insert(e);
                    }
                }
            }
        });
        if let Some(e) = failure {
            return Err(e);
        }
        Ok(built.into_iter().flatten().collect())
    }
}
