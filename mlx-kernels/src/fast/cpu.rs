//! The CPU kernels' machine settings: threads, idle spinning, the
//! instruction set, and measurements of the machine (read bandwidth, one
//! product kernel alone).

use crate::array::{Array, to_list};
use crate::error::{Error, Result};
use crate::ffi::bridge;
use crate::ops::Quantized;

/// Threads the kernels use (the stream thread included).
pub fn threads() -> usize {
    bridge::kernels_threads().max(1) as usize
}

/// The default thread count (what [`set_threads`]`(0)` restores):
/// [`set_default_threads`]'s, else the physical cores this process may run on.
pub fn default_threads() -> usize {
    bridge::kernels_default_threads().max(1) as usize
}

/// Sets the default thread count, process-wide (0: the physical cores this
/// process may run on); a pool that runs already takes it at once.
pub fn set_default_threads(n: usize) {
    bridge::kernels_set_default_threads(i32::try_from(n).unwrap_or(i32::MAX));
}

/// How long an idle kernel worker spins, polling for the next job, before it
/// parks on a futex (default 3000 µs), and whether it yields its core
/// between polls (default true); docs/kernels.md "Threading". Applies from
/// the next idle loop.
pub fn set_spin(spin_us: u32, spin_yield: bool) {
    bridge::kernels_set_spin(i32::try_from(spin_us).unwrap_or(i32::MAX), spin_yield);
}

/// Makes the C allocator keep freed memory for reuse instead of returning it
/// to the kernel: blocks up to 32 MiB come from the heap, and up to 256 MiB
/// of free heap stays mapped. MLX's CPU buffers come from `malloc`, and
/// without this every decode step faulted its freshly mapped activation
/// buffers in again (16-sequence SmolLM2 decode: 3-6% faster, page faults
/// down 10x; docs/kernels.md "Memory"). Process-wide; glibc only: returns whether
/// it applied (false elsewhere, where nothing changes).
pub fn retain_freed_memory() -> bool {
    bridge::retain_freed_memory()
}

/// Sets the kernels' thread count, process-wide (0 restores the default).
/// Takes effect for the next kernel that runs.
pub fn set_threads(n: usize) {
    bridge::kernels_set_threads(i32::try_from(n).unwrap_or(i32::MAX));
}

/// The instruction sets the kernels are built for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Portable C++ (every CPU).
    Scalar,
    /// x86-64 AVX2 with FMA (8 lanes).
    Avx2,
    /// AVX2 with the `rows16` products on int16 activations (`vpmaddwd`;
    /// docs/kernels.md "rows16 on int16 activations"): the best on CPUs
    /// without AVX-512.
    Avx2I16,
    /// x86-64 AVX-512 F/BW/DQ/VL (16 lanes).
    Avx512,
    /// AVX-512 with VNNI: the 4- and 8-bit matvecs run on int16 activations
    /// (`vpdpwssd`; docs/kernels.md "Integer dot products").
    Avx512Vnni,
    /// AArch64 NEON (4 lanes; every AArch64 CPU has it).
    Neon,
}

impl Isa {
    /// Every ISA, each architecture's lowest first (the last one supported is
    /// the best this CPU has).
    pub const ALL: [Isa; 6] = [Isa::Scalar, Isa::Avx2, Isa::Avx2I16, Isa::Avx512, Isa::Avx512Vnni, Isa::Neon];

    fn ffi(self) -> bridge::Isa {
        match self {
            Isa::Scalar => bridge::Isa::Scalar,
            Isa::Avx2 => bridge::Isa::Avx2,
            Isa::Avx2I16 => bridge::Isa::Avx2I16,
            Isa::Avx512 => bridge::Isa::Avx512,
            Isa::Avx512Vnni => bridge::Isa::Avx512Vnni,
            Isa::Neon => bridge::Isa::Neon,
        }
    }

    /// `scalar`, `avx2`, `avx2i16`, `avx512`, `avx512vnni` or `neon`.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx2I16 => "avx2i16",
            Isa::Avx512 => "avx512",
            Isa::Avx512Vnni => "avx512vnni",
            Isa::Neon => "neon",
        }
    }

    /// Whether its `rows16` products round x to int16 steps per group
    /// (avx2i16, avx512vnni) rather than keeping it f32 (every other build):
    /// their results are within those steps of the float builds', not the
    /// same bits.
    pub fn rounds_rows16_activations(self) -> bool {
        matches!(self, Isa::Avx2I16 | Isa::Avx512Vnni)
    }

    /// Whether this CPU (and OS) can run it.
    pub fn is_supported(self) -> bool {
        bridge::kernels_isa_supported(self.ffi())
    }

    /// The best ISA this CPU supports (what the kernels start with).
    pub fn best() -> Isa {
        Isa::ALL.into_iter().rev().find(|i| i.is_supported()).unwrap_or(Isa::Scalar)
    }
}

impl std::str::FromStr for Isa {
    type Err = Error;

    /// One of the [`Isa::name`]s.
    fn from_str(s: &str) -> Result<Isa> {
        Isa::ALL.into_iter().find(|i| i.name() == s).ok_or_else(|| {
            let names: Vec<&str> = Isa::ALL.iter().map(|i| i.name()).collect();
            Error::invalid("isa", format!("{s:?} is not one of {}", names.join(", ")))
        })
    }
}

impl std::fmt::Display for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The ISA the kernels run with now.
pub fn isa() -> Isa {
    let now = bridge::kernels_isa();
    Isa::ALL.into_iter().find(|i| i.ffi() == now).unwrap_or(Isa::Scalar)
}

/// Makes the kernels use `isa`, process-wide (tests run each ISA this way).
pub fn set_isa(isa: Isa) -> Result<()> {
    if bridge::kernels_set_isa(isa.ffi()) {
        Ok(())
    } else {
        Err(Error::Device(format!("this CPU cannot run the {isa} kernels")))
    }
}

/// Whether this CPU has AMX tiles with 8-bit products (and AVX-512 VBMI) and
/// the kernel granted this process their state (Linux asks once; a
/// hypervisor may hide them). The avx512vnni kernels then take the `rows16`
/// products of 16 rows of x and more (a batched decode step, a prefill) on
/// tiles, with the same bits as without (docs/kernels.md "AMX tiles").
pub fn amx_supported() -> bool {
    bridge::kernels_amx_supported()
}

/// Lets the avx512vnni kernels use AMX tiles where supported (the default),
/// or not; process-wide. The outputs are the same bits either way (tests
/// compare the two); only speed changes.
pub fn set_amx(on: bool) {
    bridge::kernels_set_amx(on);
}

/// Whether the kernels use AMX tiles now: supported and not turned off.
pub fn amx_active() -> bool {
    bridge::kernels_amx_active()
}

/// The best read bandwidth (GB/s) of `reps` passes summing a buffer of
/// `bytes` on the kernels' threads: the ceiling of a bandwidth-bound decode.
pub fn read_bandwidth_gbs(bytes: usize, reps: u32) -> f64 {
    bridge::kernels_read_bandwidth(bytes, i32::try_from(reps).unwrap_or(i32::MAX))
}

/// Seconds per pass of the quantized-matmul kernel alone (no MLX graph or
/// dispatch) over `ws` in sequence, best of `reps` passes; for
/// micro-benchmarks. One weight measures a matrix in cache; distinct copies
/// larger than the caches measure one streamed from memory. All weights must
/// share x's width, bit width and group size.
pub fn bench_quantized_linear(x: &Array, ws: &[&Quantized], reps: u32) -> Result<f64> {
    let first = ws.first().ok_or_else(|| Error::invalid("bench_quantized_linear", "no weights"))?;
    let mut list = Vec::with_capacity(ws.len() * 3);
    for w in ws {
        let b =
            w.biases.as_ref().ok_or_else(|| Error::invalid("bench_quantized_linear", "affine weights need biases"))?;
        list.extend([&w.weight, &w.scales, b]);
    }
    bridge::kernels_bench_qmm(
        &x.inner,
        &to_list(&list),
        first.group_size,
        first.bits,
        i32::try_from(reps).unwrap_or(i32::MAX),
    )
    .map_err(|e| Error::mlx("bench_quantized_linear", e))
}
