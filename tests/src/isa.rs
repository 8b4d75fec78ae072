//! Running a check once per CPU kernel build the machine has.

use std::sync::{Mutex, MutexGuard};

use mlxcel_mlx::fast::{self, Isa, Path};

/// The kernel build is process-wide: checks that set it run one at a time.
static KERNEL_BUILD: Mutex<()> = Mutex::new(());

/// Runs `body(build name, logit bound)` with each kernel build worth
/// checking, then restores the best build: the best float build (neon,
/// avx512, avx2 or scalar) with bound 1e-4, and, where the CPU has it, the
/// avx512vnni build (int16 activations in the 4- and 8-bit matvecs,
/// docs/kernels.md "Integer dot products") with bound 5e-3, or on CPUs
/// without AVX-512 the avx2i16 build (int16 activations in the rows16
/// products), with the same bound. The bounds are
/// for logits of magnitude ~10 against mlx-lm (tests/tests/tiny_parity.rs
/// says why); checks that compare bits ignore them.
pub fn each_kernel_build(mut body: impl FnMut(&str, f32)) {
    let _guard: MutexGuard<'_, ()> = KERNEL_BUILD.lock().unwrap_or_else(|e| e.into_inner());
    let float = [Isa::Neon, Isa::Avx512, Isa::Avx2, Isa::Scalar].into_iter().find(|i| i.is_supported()).unwrap();
    let mut builds = vec![(float, 1e-4)];
    if Isa::Avx512Vnni.is_supported() {
        builds.push((Isa::Avx512Vnni, 5e-3));
    } else if Isa::Avx2I16.is_supported() {
        builds.push((Isa::Avx2I16, 5e-3));
    }
    for (isa, bound) in builds {
        fast::set_isa(isa).unwrap();
        body(isa.name(), bound);
    }
    fast::set_isa(Isa::ALL.into_iter().rev().find(|i| i.is_supported()).unwrap()).unwrap();
}

/// Runs `body` with mlxcel's kernels off (`fast`'s functions take MLX's own
/// ops: the path every non-CPU device takes), then turns them back on.
pub fn with_mlx_ops(body: impl FnOnce()) {
    let _guard: MutexGuard<'_, ()> = KERNEL_BUILD.lock().unwrap_or_else(|e| e.into_inner());
    fast::set_default_path(Path::Mlx);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body));
    fast::set_default_path(Path::Auto);
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}
