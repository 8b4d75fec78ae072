// The AArch64 NEON build of the generic kernels (impl.h) with the NEON SIMD
// layer. Every AArch64 CPU has NEON, so no target options are needed; on any
// other CPU this file only forwards to the scalar build (never selected:
// isa_supported is false there).
#include <cstddef>
#include <cstdint>

#include "mlxcel-mlx/cpp/kernels/kernels.h"

#if defined(__aarch64__)
#include <arm_neon.h>

namespace mlxcel::kern::neon {
constexpr Isa kIsa = Isa::Neon;
constexpr const char* kIsaName = "neon";
#include "mlxcel-mlx/cpp/kernels/simd_neon.h"
#include "mlxcel-mlx/cpp/kernels/impl.h"
#include "mlxcel-mlx/cpp/kernels/float_impl.h"
#include "mlxcel-mlx/cpp/kernels/rows16_impl.h"
}  // namespace mlxcel::kern::neon

namespace mlxcel::kern {
const Table& table_neon() { return neon::kTable; }
}  // namespace mlxcel::kern

#else

namespace mlxcel::kern {
const Table& table_neon() { return table_scalar(); }
}  // namespace mlxcel::kern

#endif
