// The avx2 build of the generic kernels (impl.h) with the avx2 SIMD layer
// (float activations throughout; isa_avx2i16.cc is the same build with the
// rows16 products on int16 activations).
// Only the functions inside the pragma region may use these instructions;
// dispatch.cc calls them only when cpuid says the CPU has them.
#include <cstddef>
#include <cstdint>

#include "mlxcel-mlx/cpp/kernels/kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>

// GCC 12 warns about the deliberately undefined lanes inside its own AVX-512 headers.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,bmi2,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,bmi2,f16c")
#endif

namespace mlxcel::kern::avx2 {
constexpr Isa kIsa = Isa::Avx2;
constexpr const char* kIsaName = "avx2";
#include "mlxcel-mlx/cpp/kernels/simd_avx2.h"
#include "mlxcel-mlx/cpp/kernels/impl.h"
#include "mlxcel-mlx/cpp/kernels/float_impl.h"
#include "mlxcel-mlx/cpp/kernels/rows16_impl.h"
}  // namespace mlxcel::kern::avx2

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

namespace mlxcel::kern {
const Table& table_avx2() { return avx2::kTable; }
}  // namespace mlxcel::kern

#else  // not x86-64: never selected (isa_supported is false), falls back to scalar.

namespace mlxcel::kern {
const Table& table_avx2() { return table_scalar(); }
}  // namespace mlxcel::kern

#endif
