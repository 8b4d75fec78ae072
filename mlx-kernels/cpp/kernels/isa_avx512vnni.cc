// The avx512vnni build: the avx512 kernels plus the quantized matvec on int16
// activations (vpdpwssd; impl.h, MLXCEL_DOT_I16), and the rows16 products on
// AMX tiles (rows16_amx_impl.h: functions with their own target attribute,
// called only when amx_active()).
// Only the functions inside the pragma region may use these instructions;
// dispatch.cc calls them only when cpuid says the CPU has them.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "mlxcel-mlx/cpp/kernels/kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>

// GCC 12 warns about the deliberately undefined lanes inside its own AVX-512 headers.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,bmi2,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,bmi2,f16c")
#endif

namespace mlxcel::kern::avx512vnni {
constexpr Isa kIsa = Isa::Avx512Vnni;
constexpr const char* kIsaName = "avx512vnni";
#define MLXCEL_DOT_I16 1
#include "mlxcel-mlx/cpp/kernels/simd_avx512.h"
#include "mlxcel-mlx/cpp/kernels/impl.h"
#include "mlxcel-mlx/cpp/kernels/float_impl.h"
#include "mlxcel-mlx/cpp/kernels/rows16_impl.h"
#undef MLXCEL_DOT_I16
}  // namespace mlxcel::kern::avx512vnni

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

namespace mlxcel::kern {
const Table& table_avx512vnni() { return avx512vnni::kTable; }
}  // namespace mlxcel::kern

#else  // not x86-64: never selected (isa_supported is false), falls back to scalar.

namespace mlxcel::kern {
const Table& table_avx512vnni() { return table_scalar(); }
}  // namespace mlxcel::kern

#endif
