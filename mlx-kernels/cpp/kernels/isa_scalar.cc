// The portable build of the generic kernels (impl.h): one lane, no target
// options. Every CPU can run it; it is the reference the NEON build is
// checked against (cpp/tests/isa_check.cc).
#include <cstddef>
#include <cstdint>

#include "mlxcel-mlx/cpp/kernels/kernels.h"

namespace mlxcel::kern::scalar {
constexpr Isa kIsa = Isa::Scalar;
constexpr const char* kIsaName = "scalar";
#include "mlxcel-mlx/cpp/kernels/simd_scalar.h"
#include "mlxcel-mlx/cpp/kernels/impl.h"
#include "mlxcel-mlx/cpp/kernels/float_impl.h"
#include "mlxcel-mlx/cpp/kernels/rows16_impl.h"
}  // namespace mlxcel::kern::scalar

namespace mlxcel::kern {
const Table& table_scalar() { return scalar::kTable; }
}  // namespace mlxcel::kern
