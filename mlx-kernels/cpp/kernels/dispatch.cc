// Run-time ISA selection: cpuid (through GCC's __builtin_cpu_supports, which
// also checks that the OS saves the vector registers) picks the best table on
// x86-64, NEON is always there on AArch64; set_isa() chooses another supported
// one (the binaries' MLXCEL_ISA setting, and tests running every ISA the
// machine has). Nothing here reads the environment.
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <utility>

#if defined(__x86_64__) && defined(__linux__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "mlxcel-mlx/cpp/kernels/kernels.h"

namespace mlxcel::kern {
namespace {

const Table& table_for(Isa isa) {
  switch (isa) {
    case Isa::Avx512Vnni: return table_avx512vnni();
    case Isa::Avx512: return table_avx512();
    case Isa::Avx2I16: return table_avx2i16();
    case Isa::Avx2: return table_avx2();
    case Isa::Neon: return table_neon();
    default: return table_scalar();
  }
}

std::atomic<const Table*>& current() {
  static std::atomic<const Table*> t{&table_for(best_isa())};
  return t;
}

}  // namespace

bool isa_from_name(const char* name, Isa& isa) {
  static constexpr std::pair<const char*, Isa> kNames[] = {{"scalar", Isa::Scalar},
                                                           {"avx2", Isa::Avx2},
                                                           {"avx2i16", Isa::Avx2I16},
                                                           {"avx512", Isa::Avx512},
                                                           {"avx512vnni", Isa::Avx512Vnni},
                                                           {"neon", Isa::Neon}};
  for (const auto& [n, i] : kNames) {
    if (std::strcmp(name, n) == 0) {
      isa = i;
      return true;
    }
  }
  return false;
}

bool isa_supported(Isa isa) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  switch (isa) {
    case Isa::Scalar: return true;
    case Isa::Avx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case Isa::Avx2I16: return isa_supported(Isa::Avx2);
    case Isa::Avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("fma");
    case Isa::Avx512Vnni: return isa_supported(Isa::Avx512) && __builtin_cpu_supports("avx512vnni");
    case Isa::Neon: return false;
  }
  return false;
#elif defined(__aarch64__)
  return isa == Isa::Scalar || isa == Isa::Neon;
#else
  return isa == Isa::Scalar;
#endif
}

Isa best_isa() {
  if (isa_supported(Isa::Neon)) return Isa::Neon;
  if (isa_supported(Isa::Avx512Vnni)) return Isa::Avx512Vnni;
  if (isa_supported(Isa::Avx512)) return Isa::Avx512;
  if (isa_supported(Isa::Avx2I16)) return Isa::Avx2I16;
  return Isa::Scalar;
}

const Table& table() { return *current().load(std::memory_order_acquire); }

namespace {
std::atomic<bool> g_amx_on{true};
}  // namespace

bool amx_supported() {
  static const bool ok = [] {
#if defined(__x86_64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    const bool tile = (d >> 24) & 1, int8 = (d >> 25) & 1, vbmi = (c >> 1) & 1;
    if (!(tile && int8 && vbmi && isa_supported(Isa::Avx512Vnni))) return false;
    // Linux hands out the 8 KB tile state only on request (ARCH_REQ_XCOMP_PERM
    // for XFEATURE_XTILEDATA); without it the first tile instruction faults.
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
    return false;
#endif
  }();
  return ok;
}

void set_amx(bool on) { g_amx_on.store(on, std::memory_order_relaxed); }

bool amx_active() { return g_amx_on.load(std::memory_order_relaxed) && amx_supported(); }

bool set_isa(Isa isa) {
  if (!isa_supported(isa)) return false;
  current().store(&table_for(isa), std::memory_order_release);
  return true;
}

}  // namespace mlxcel::kern

// ---- Read bandwidth probe (for the decode roofline in docs/benchmarks.md) ----

#include <chrono>
#include <vector>

namespace mlxcel::kern {

double read_bandwidth_gbs(size_t bytes, int reps) {
  const int threads = pool_threads();
  const int64_t n = static_cast<int64_t>(bytes / sizeof(float)) / (64 * threads) * (64 * threads);
  if (n <= 0 || reps <= 0) return 0.0;
  float* buf = static_cast<float*>(std::aligned_alloc(64, static_cast<size_t>(n) * sizeof(float)));
  if (!buf) return 0.0;
  const int64_t chunk = n / threads;
  // First touch by the threads that read (pages land near them).
  parallel_for(threads, [&](int t) {
    for (int64_t i = t * chunk; i < (t + 1) * chunk; ++i) buf[i] = 1.0f;
  });
  std::vector<float> sums(threads);
  double best = 0.0;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    parallel_for(threads, [&](int t) { sums[t] = table().read_sum(buf + t * chunk, chunk); });
    auto dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double gbs = static_cast<double>(n) * sizeof(float) / dt / 1e9;
    if (gbs > best) best = gbs;
  }
  volatile float sink = 0.0f;
  for (float s : sums) sink = sink + s;
  std::free(buf);
  return best;
}

}  // namespace mlxcel::kern
