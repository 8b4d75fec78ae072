// The persistent thread pool the kernels run on, and per-thread scratch.
//
// A kernel is dispatched by MLX onto its CPU stream thread; that thread posts
// a job here and works on it together with `threads - 1` pool workers. Jobs
// are split into tasks claimed from one 64-bit atomic (job sequence number in
// the high half, next task index in the low half), so a worker that wakes up
// late can never run a task of a job that has already finished. Workers spin
// for a while after each job (kernels of one decode step follow each other
// within microseconds), then sleep on a futex (C++20 atomic wait).
#include <sched.h>
#include <unistd.h>

#if defined(__APPLE__)
#include <sys/sysctl.h>
#include <sys/types.h>
#endif

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>

#include <climits>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define MLXCEL_PAUSE() _mm_pause()
#elif defined(__aarch64__)
#define MLXCEL_PAUSE() asm volatile("yield")
#else
#define MLXCEL_PAUSE() \
  do {                 \
  } while (0)
#endif

#include "mlxcel-mlx/cpp/kernels/kernels.h"

namespace mlxcel::kern {
namespace {

thread_local bool t_in_pool = false;

// Parking on a 32-bit word. libstdc++'s std::atomic::wait keeps its own
// waiter bookkeeping and was seen to leave workers asleep after notify_all;
// on Linux the futex is used directly.
void park(std::atomic<uint32_t>& word, uint32_t expected) {
#if defined(__linux__)
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT_PRIVATE, expected, nullptr, nullptr, 0);
#else
  word.wait(expected);
#endif
}

void unpark_all(std::atomic<uint32_t>& word) {
#if defined(__linux__)
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
#else
  word.notify_all();
#endif
}

// The settings (kernels.h): 0 threads means the physical cores.
std::atomic<int> g_default_threads{0};
std::atomic<int> g_spin_us{3000};
std::atomic<bool> g_spin_yield{true};

// Physical cores among the CPUs this process may run on (SMT siblings count once).
int physical_cores() {
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) {
    unsigned n = std::thread::hardware_concurrency();
    return n > 0 ? static_cast<int>(n) : 1;
  }
  std::set<std::pair<std::string, std::string>> cores;
  int cpus = 0;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (!CPU_ISSET(c, &set)) continue;
    ++cpus;
    std::string base = "/sys/devices/system/cpu/cpu" + std::to_string(c) + "/topology/";
    std::ifstream core(base + "core_id"), pkg(base + "physical_package_id");
    std::string core_id, pkg_id;
    if (!(core >> core_id) || !(pkg >> pkg_id)) return CPU_COUNT(&set);
    cores.insert({pkg_id, core_id});
  }
  return cores.empty() ? std::max(cpus, 1) : static_cast<int>(cores.size());
#elif defined(__APPLE__)
  int n = 0;
  size_t len = sizeof(n);
  if (sysctlbyname("hw.physicalcpu", &n, &len, nullptr, 0) == 0 && n > 0) return n;
  unsigned h = std::thread::hardware_concurrency();
  return h > 0 ? static_cast<int>(h) : 1;
#else
  unsigned n = std::thread::hardware_concurrency();
  return n > 0 ? static_cast<int>(n) : 1;
#endif
}

struct Job {
  void (*fn)(void*, int) = nullptr;
  void* ctx = nullptr;
  int n = 0;
};

class Pool;
// The pool once it runs (settings resize it then, and never start it).
std::atomic<Pool*> g_pool{nullptr};

class Pool {
 public:
  static Pool& get() {
    // Leaked on purpose: workers may still be parked in a futex at exit.
    static Pool* pool = [] {
      auto* p = new Pool(default_threads());
      g_pool.store(p, std::memory_order_release);
      return p;
    }();
    return *pool;
  }

  int threads() const { return n_threads_.load(std::memory_order_relaxed); }

  void resize(int n) {
    if (n < 1) n = 1;
    std::lock_guard<std::mutex> lk(run_mu_);
    if (n == threads()) return;
    stop_workers();
    start_workers(n);
  }

  void run(int n, void (*fn)(void*, int), void* ctx) {
    if (n <= 0) return;
    if (t_in_pool || n == 1 || threads() == 1) {
      for (int t = 0; t < n; ++t) fn(ctx, t);
      return;
    }
    std::unique_lock<std::mutex> lk(run_mu_, std::try_to_lock);
    if (!lk.owns_lock() || workers_.empty()) {
      // Another thread is using the pool: run this job alone.
      for (int t = 0; t < n; ++t) fn(ctx, t);
      return;
    }
    uint32_t seq = ++seq_;
    jobs_[seq & 1] = Job{fn, ctx, n};
    done_.store(0, std::memory_order_relaxed);
    state_.store(static_cast<uint64_t>(seq) << 32, std::memory_order_seq_cst);
    wake_.fetch_add(1, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) unpark_all(wake_);
    t_in_pool = true;
    run_tasks(seq);
    t_in_pool = false;
    // Wait for tasks other threads claimed.
    unsigned spins = 0;
    while (done_.load(std::memory_order_acquire) < n) {
      MLXCEL_PAUSE();
      if (++spins > (1u << 16)) std::this_thread::yield();
    }
  }

 private:
  explicit Pool(int n) { start_workers(n); }

  // Claims and runs tasks of job `seq` until none are left.
  void run_tasks(uint32_t seq) {
    for (;;) {
      uint64_t st = state_.load(std::memory_order_acquire);
      if (static_cast<uint32_t>(st >> 32) != seq) return;
      uint32_t idx = static_cast<uint32_t>(st);
      // Before a successful claim the slot may belong to a later job; the
      // claim then fails because the sequence number moved on.
      int n = jobs_[seq & 1].n;
      if (static_cast<int>(idx) >= n) return;
      if (!state_.compare_exchange_weak(st, st + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
      // Claimed: the job cannot finish before this task does, so the slot is ours.
      const Job& job = jobs_[seq & 1];
      job.fn(job.ctx, static_cast<int>(idx));
      done_.fetch_add(1, std::memory_order_release);
    }
  }

  void worker(uint32_t seen) {
    t_in_pool = true;
    for (;;) {
      uint64_t st = 0;
      auto start = std::chrono::steady_clock::now();
      unsigned spins = 0;
      for (;;) {
        if (stop_.load(std::memory_order_acquire)) return;
        st = state_.load(std::memory_order_acquire);
        if (static_cast<uint32_t>(st >> 32) != seen) break;
        MLXCEL_PAUSE();
        if ((++spins & 31) != 0) continue;
        // Idle: let any other runnable thread of this core (MLX's own threads
        // building and dispatching the graph) go first. A worker only ever
        // yields while it holds no task, so this never delays a job.
        if (g_spin_yield.load(std::memory_order_relaxed)) sched_yield();
        auto waited = std::chrono::steady_clock::now() - start;
        if (waited < std::chrono::microseconds(g_spin_us.load(std::memory_order_relaxed))) continue;
        // Park until the next job (see `run` for the wake-up protocol).
        uint32_t w = wake_.load(std::memory_order_seq_cst);
        sleepers_.fetch_add(1, std::memory_order_seq_cst);
        st = state_.load(std::memory_order_seq_cst);
        if (static_cast<uint32_t>(st >> 32) == seen && !stop_.load(std::memory_order_seq_cst)) park(wake_, w);
        sleepers_.fetch_sub(1, std::memory_order_seq_cst);
        start = std::chrono::steady_clock::now();
      }
      seen = static_cast<uint32_t>(st >> 32);
      run_tasks(seen);
    }
  }

  void start_workers(int n) {
    stop_.store(false);
    uint32_t seen = static_cast<uint32_t>(state_.load() >> 32);
    for (int i = 1; i < n; ++i) workers_.emplace_back([this, seen] { worker(seen); });
    n_threads_.store(n);
  }

  void stop_workers() {
    stop_.store(true, std::memory_order_seq_cst);
    wake_.fetch_add(1, std::memory_order_seq_cst);
    unpark_all(wake_);
    for (auto& t : workers_) t.join();
    workers_.clear();
    n_threads_.store(1);
  }

  std::mutex run_mu_;
  std::vector<std::thread> workers_;
  std::atomic<uint64_t> state_{0};
  Job jobs_[2];
  std::atomic<int> done_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<uint32_t> wake_{0};
  std::atomic<bool> stop_{false};
  std::atomic<int> n_threads_{1};
  uint32_t seq_ = 0;
};

struct Scratch {
  static constexpr int kSlots = 8;
  float* ptr[kSlots] = {};
  size_t cap[kSlots] = {};
  ~Scratch() {
    for (auto* p : ptr) std::free(p);
  }
};

thread_local Scratch t_scratch;

}  // namespace

int default_threads() {
  static const int cores = physical_cores();
  const int n = g_default_threads.load(std::memory_order_relaxed);
  return n > 0 ? n : cores;
}

void set_default_threads(int n) {
  g_default_threads.store(n > 0 ? n : 0, std::memory_order_relaxed);
  if (Pool* pool = g_pool.load(std::memory_order_acquire)) pool->resize(default_threads());
}

void set_spin(int spin_us, bool yield) {
  g_spin_us.store(spin_us > 0 ? spin_us : 0, std::memory_order_relaxed);
  g_spin_yield.store(yield, std::memory_order_relaxed);
}

int pool_threads() { return Pool::get().threads(); }

void set_pool_threads(int n) { Pool::get().resize(n <= 0 ? default_threads() : n); }

void parallel_for_raw(int n_tasks, void (*fn)(void*, int), void* ctx) { Pool::get().run(n_tasks, fn, ctx); }

float* scratch(int slot, size_t n) {
  auto& s = t_scratch;
  if (slot < 0 || slot >= Scratch::kSlots) std::abort();
  if (n == 0) n = 1;
  if (s.cap[slot] < n) {
    std::free(s.ptr[slot]);
    size_t bytes = ((n * sizeof(float) + 63) / 64) * 64 + 64;
    s.ptr[slot] = static_cast<float*>(std::aligned_alloc(64, bytes));
    if (!s.ptr[slot]) std::abort();
    s.cap[slot] = n;
  }
  return s.ptr[slot];
}

}  // namespace mlxcel::kern
