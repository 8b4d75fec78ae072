// The GPU side of our product and cached attention nodes (gpu.h). Built
// with the `cuda` feature (MLXCEL_CUDA, MLX's CUDA headers); without it the
// module never loads and the GPU runs MLX's ops only.
#include "mlxcel-mlx/cpp/nodes/gpu.h"

#include <stdexcept>

#ifdef MLXCEL_CUDA
#include <cuda.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <vector>

#include "mlx/backend/cuda/allocator.h"
#include "mlx/backend/cuda/device.h"
#include "mlx/backend/cuda/utils.h"
#include "mlxcel-mlx/cpp/nodes/gpu_driver.h"
#include "mlxcel-mlx/cpp/nodes/gpu_graph.h"
#include "mlxcel-mlx/cpp/nodes/launch.h"
#include "mlxcel-mlx/cuda/gpu_args.h"
#endif

namespace mlxcel::fast::gpu {

#ifdef MLXCEL_CUDA

const Driver& driver() {
  static const Driver d = [] {
    Driver d;
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!lib) lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) throw std::runtime_error(std::string("mlxcel GPU kernels: cannot load libcuda.so.1: ") + dlerror());
    std::string missing;
    auto find = [&](auto& f, const char* name) {
      f = reinterpret_cast<std::remove_reference_t<decltype(f)>>(dlsym(lib, name));
      if (!f) missing += (missing.empty() ? "" : ", ") + std::string(name);
    };
    find(d.load, "cuModuleLoadData");
    find(d.function, "cuModuleGetFunction");
    find(d.error, "cuGetErrorString");
    find(d.alloc_async, "cuMemAllocAsync");
    find(d.free_async, "cuMemFreeAsync");
    find(d.free, "cuMemFree_v2");
    find(d.alloc_host, "cuMemAllocHost_v2");
    find(d.free_host, "cuMemFreeHost");
    find(d.to_host, "cuMemcpyDtoH_v2");
    // The names cuda.h maps these calls to (the kernel node parameters are
    // its CUDA_KERNEL_NODE_PARAMS, version 2).
    find(d.graph_create, "cuGraphCreate");
    find(d.graph_add_kernel, "cuGraphAddKernelNode_v2");
    find(d.graph_instantiate, "cuGraphInstantiateWithFlags");
    find(d.graph_launch, "cuGraphLaunch");
    find(d.graph_exec_destroy, "cuGraphExecDestroy");
    find(d.graph_destroy, "cuGraphDestroy");
    find(d.to_device_async, "cuMemcpyHtoDAsync_v2");
    find(d.to_host_async, "cuMemcpyDtoHAsync_v2");
    find(d.synchronize, "cuStreamSynchronize");
    if (!missing.empty())
      throw std::runtime_error("mlxcel GPU kernels: libcuda.so.1 lacks " + missing +
                               " (a driver older than CUDA 12)");
    return d;
  }();
  return d;
}

void check(CUresult r, const std::string& what) {
  if (r == CUDA_SUCCESS) return;
  const char* s = nullptr;
  driver().error(r, &s);
  throw std::runtime_error("mlxcel GPU kernels: " + what + ": " + (s ? s : "CUDA error " + std::to_string(r)));
}

namespace {

using mx::array;

// Device memory for our nodes' outputs, kept by size for reuse.
//
// Why not mx::allocator::malloc: in MLX's CUDA allocator that is managed
// memory, and when its cache offers a device buffer that one of MLX's own
// ops freed, it first moves that buffer to managed memory with a
// synchronous copy (CudaAllocator::malloc → move_to_unified_memory without
// a stream): a host stall for each of our nodes. It showed as a prompt's
// prefill dropping from ~34k to 23-27k tok/s on the H200 once the prompt's
// norms ran our kernel. MLX's own ops take stream-ordered device memory
// (cu::malloc_async), which libmlx does not export; so this takes it from
// the same place, the device's default memory pool on MLX's stream
// (cuMemAllocAsync), and keeps freed buffers by size as MLX's cache does.
// Reuse is ordered as MLX's own is: the command encoder keeps every input
// alive until its kernels have run and orders the kernels touching one
// pointer.
//
// A buffer the host reads (logits) is moved to managed memory by MLX
// itself (Buffer::raw_ptr frees our pointer with cudaFreeAsync, as it frees
// its own); the deleter then frees that managed copy as MLX would.
class OutputMemory {
 public:
  static OutputMemory& get() {
    static auto* memory = new OutputMemory();  // leaked: freeing at exit races the driver's teardown
    return *memory;
  }

  mx::allocator::Data allocate(size_t bytes, mx::cu::CommandEncoder& enc) {
    const size_t size = rounded(bytes);
    void* data = nullptr;
    {
      std::lock_guard lock(mutex_);
      if (!free_stream_) free_stream_ = static_cast<cudaStream_t>(enc.stream());
      auto& list = free_[size];
      if (!list.empty()) {
        data = list.back();
        list.pop_back();
        cached_ -= size;
      }
    }
    if (!data) {
      CUdeviceptr p = 0;
      check(driver().alloc_async(&p, size, reinterpret_cast<CUstream>(static_cast<cudaStream_t>(enc.stream()))),
            "allocating " + std::to_string(size) + " bytes of device memory");
      data = reinterpret_cast<void*>(p);
    }
    auto* buf = new mx::cu::CudaBuffer{data, size, enc.device().cuda_device()};
    return mx::allocator::Data(mx::allocator::Buffer(buf), [this](mx::allocator::Buffer b) { recycle(b); });
  }

 private:
  // Freed buffers kept beyond this go back to the pool.
  static constexpr size_t kCacheLimit = size_t{1} << 30;

  // Sizes as MLX's allocator rounds them: powers of two below a 16 KiB page, whole pages above.
  static size_t rounded(size_t bytes) {
    constexpr size_t page = 16384;
    if (bytes >= page) return (bytes + page - 1) / page * page;
    size_t size = 256;
    while (size < bytes) size *= 2;
    return size;
  }

  void recycle(mx::allocator::Buffer b) {
    auto* buf = static_cast<mx::cu::CudaBuffer*>(b.ptr());
    if (buf->device < 0) {
      // Moved to unified memory by MLX for the host: free it as MLX's
      // unified_free does (managed memory, or pinned host memory on GPUs
      // without concurrent managed access).
      if (mx::cu::device(mx::Device::gpu).concurrent_managed_access()) {
        driver().free(reinterpret_cast<CUdeviceptr>(buf->data));
      } else {
        driver().free_host(buf->data);
      }
    } else {
      std::lock_guard lock(mutex_);
      if (cached_ + buf->size <= kCacheLimit) {
        free_[buf->size].push_back(buf->data);
        cached_ += buf->size;
      } else {
        driver().free_async(reinterpret_cast<CUdeviceptr>(buf->data), reinterpret_cast<CUstream>(free_stream_));
      }
    }
    delete buf;
  }

  std::mutex mutex_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  size_t cached_ = 0;
  // Frees of buffers beyond the cache go on the first stream seen (their
  // kernels have all run by then: the encoder held them until they had).
  cudaStream_t free_stream_ = nullptr;
};

// Device memory for `a`'s data (OutputMemory).
void allocate(array& a, mx::cu::CommandEncoder& enc) { a.set_data(OutputMemory::get().allocate(a.nbytes(), enc)); }

// The loaded kernels by name expression (`mlxcel::product<4, __half>`,
// `mlxcel::cached_attention`).
struct Registry {
  std::mutex mutex;
  std::unordered_map<std::string, CUfunction> kernels;
  // Read on every graph-building call of ops.cc: no lock for these.
  std::atomic<bool> loaded{false};
  // Bit b set: the module has `mlxcel::product<b, float>` (resp. gather),
  // derived once from the kernel names at load, so the per-node checks of
  // ops.cc cost a load and a test.
  std::atomic<uint32_t> product_widths{0};
  std::atomic<uint32_t> gather_widths{0};
};

Registry& registry() {
  static Registry r;
  return r;
}

const char* scale_type(mx::Dtype d) {
  if (d == mx::float16) return "__half";
  if (d == mx::bfloat16) return "__nv_bfloat16";
  return "float";
}

CUfunction kernel(const std::string& expression) {
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  auto it = r.kernels.find(expression);
  if (it == r.kernels.end())
    throw std::runtime_error("mlxcel GPU kernels: the loaded module has no kernel " + expression);
  return it->second;
}

// Inputs must be what the kernels index: rows of x with one stride,
// everything else row-major.
void require_row_major(const array& a, const char* what) {
  if (!a.flags().row_contiguous)
    throw std::runtime_error(std::string("mlxcel GPU product: the ") + what + " is not row-major");
}

// The one row stride the kernels index x by.
int64_t x_row_stride(const array& x, const char* node) {
  auto ld = row_stride(x);
  if (!ld) throw std::runtime_error(std::string("mlxcel GPU ") + node + ": x has no single row stride");
  return *ld;
}

// Registers a node's inputs and outputs with the encoder, each output with
// fresh device memory.
void bind(mx::cu::CommandEncoder& enc, const std::vector<array>& in, std::vector<array>& out) {
  for (const auto& a : in) enc.set_input_array(a);
  for (auto& o : out) {
    allocate(o, enc);
    enc.set_output_array(o);
  }
  note_buffers(in);
  note_buffers(out);
}

// Fills the part of the arguments every product shares and registers the
// inputs and outputs with the encoder.
ProductArgs common_args(mx::cu::CommandEncoder& enc, const std::vector<array>& in, std::vector<array>& out,
                        QuantSpec quant, const std::optional<RmsNormParams>& prologue, int count) {
  const int first = first_weight_input(prologue);
  const array& x = in[0];
  const int64_t ld = x_row_stride(x, "product");
  bind(enc, in, out);
  ProductArgs a{};
  a.x = mx::gpu_ptr<float>(x);
  a.ldx = ld;
  a.k = x.shape(-1);
  a.rows = static_cast<int>(x.size() / a.k);
  a.seq = x.ndim() == 3 ? x.shape(1) : 1;
  a.group = quant.group_size;
  if (prologue) {
    a.norm = 1;
    a.norm_eps = prologue->eps;
    if (prologue->weight) {
      require_row_major(in[1], "norm weight");
      a.norm_weight = mx::gpu_ptr<float>(in[1]);
    }
  }
  a.count = count;
  for (int i = 0; i < count; ++i) {
    const int wi = first + 3 * i;
    require_row_major(in[wi], "codes");
    require_row_major(in[wi + 1], "scales");
    require_row_major(in[wi + 2], "biases");
    auto& w = a.w[i];
    w.codes = mx::gpu_ptr<unsigned>(in[wi]);
    w.scales = mx::gpu_ptr<void>(in[wi + 1]);
    w.biases = mx::gpu_ptr<void>(in[wi + 2]);
    w.n = in[wi].shape(0);
    a.first_row[i + 1] = a.first_row[i] + w.n;
  }
  a.total = a.first_row[count];
  return a;
}

// A decode step's rows of x (at most kMaxRows) take the decode kernels
// (products.cuh), shaped by gpu_args.h's `set_product_shape`:
// `mlxcel::product<BITS, SCALE, WIDE>` or `mlxcel::gated<BITS, SCALE, ACT,
// CHUNK>`. A prompt's take the tiled kernels (prompt.cuh), shaped by
// `set_prompt_shape`: `mlxcel::prompt_product<BITS, SCALE, TILE>` or
// `mlxcel::prompt_gated<BITS, SCALE, ACT, TILE>`. `kernel_args` names the
// parameters before the shape's ("4, __half" or "4, __half, 1").
void add_node(mx::cu::CommandEncoder& enc, const std::string& kernel_args, ProductLaunch launch, ProductArgs& a) {
  if (a.k % 32 != 0 || a.group % 32 != 0)
    throw std::runtime_error("mlxcel GPU product: inputs (" + std::to_string(a.k) + ") and group size (" +
                             std::to_string(a.group) + ") must be multiples of 32");
  const bool prompt = a.rows > kMaxRows;
  const ProductGrid g = prompt ? set_prompt_shape(a, launch) : set_product_shape(a, launch);
  const std::string family = std::string(prompt ? "mlxcel::prompt_" : "mlxcel::") +
                             (launch == ProductLaunch::Plain ? "product<" : "gated<");
  const int shape = launch == ProductLaunch::Plain && !prompt ? a.wide : a.chunk;
  add_launch(enc, kernel(family + kernel_args + ", " + std::to_string(shape) + ">"), dim3(g.blocks_x, g.blocks_y),
             dim3(g.threads), a);
}

// The code widths `family` has kernels for among `kernels` (bit b: the
// module has `mlxcel::family<b, float` then `rest`): the module's kernel
// names (cuda_kernels.rs BITS) are the one list of the widths it takes.
uint32_t code_widths(const std::unordered_map<std::string, CUfunction>& kernels, const char* family,
                     const char* rest) {
  uint32_t widths = 0;
  for (int bits = 1; bits < 32; ++bits)
    if (kernels.count(std::string("mlxcel::") + family + "<" + std::to_string(bits) + ", float" + rest) != 0)
      widths |= 1u << bits;
  return widths;
}

}  // namespace

size_t load_module(const uint8_t* cubin, size_t size, const std::string& names) {
  if (size < 4 || cubin[0] != 0x7f || cubin[1] != 'E' || cubin[2] != 'L' || cubin[3] != 'F')
    throw std::runtime_error("mlxcel GPU kernels: the module is not a cubin (no ELF header)");
  auto& d = driver();
  mx::cu::device(mx::Device::gpu).make_current();
  CUmodule module = nullptr;
  check(d.load(&module, cubin), "loading the module mlxcel_kernels");
  std::unordered_map<std::string, CUfunction> found;
  std::istringstream lines(names);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    auto tab = line.find('\t');
    if (tab == std::string::npos) throw std::runtime_error("mlxcel GPU kernels: a names line has no tab: " + line);
    CUfunction f = nullptr;
    const std::string lowered = line.substr(tab + 1);
    check(d.function(&f, module, lowered.c_str()), "finding kernel " + line.substr(0, tab));
    found.emplace(line.substr(0, tab), f);
  }
  auto& r = registry();
  std::lock_guard lock(r.mutex);
  r.product_widths.store(code_widths(found, "product", ", 1>"), std::memory_order_relaxed);
  r.gather_widths.store(code_widths(found, "gather", ">"), std::memory_order_relaxed);
  r.kernels = std::move(found);
  r.loaded.store(true, std::memory_order_release);
  return r.kernels.size();
}

bool loaded() { return registry().loaded.load(std::memory_order_acquire); }

namespace {

// Why `bits`-wide codes have no kernel in the loaded module ("" when they
// have one), given the family's width bitmask (Registry). (A module loads
// only at this runtime's interface version, so every kernel family of that
// version is there: no check for families older modules lacked.)
std::string width_unsupported(const std::atomic<uint32_t>& widths, int bits, const char* what) {
  if (bits > 0 && bits < 32 && (widths.load(std::memory_order_relaxed) >> bits & 1u) != 0) return "";
  return std::string("the GPU ") + what + " take 2- to 6- or 8-bit codes, not " + std::to_string(bits);
}

}  // namespace

std::string product_unsupported(int bits, kern::WeightLayout layout) {
  if (!loaded()) return "mlxcel's GPU kernels are not loaded";
  if (auto why = width_unsupported(registry().product_widths, bits, "kernels"); !why.empty()) return why;
  if (layout != kern::WeightLayout::RowMajor) return "the rows16 layout is the CPU's";
  return "";
}

void eval_product(mx::Stream s, const ProductSpec& spec, const std::vector<array>& inputs,
                  std::vector<array>& outputs) {
  auto& enc = mx::cu::get_command_encoder(s);
  const int n = static_cast<int>(spec.heads.size());
  ProductArgs a = common_args(enc, inputs, outputs, spec.quant, spec.prologue, n);
  for (int i = 0; i < n; ++i) {
    a.w[i].out = mx::gpu_ptr<float>(outputs[i]);
    a.w[i].heads = spec.heads[i];
  }
  if (spec.epilogue == Epilogue::AddResidual) {
    require_row_major(inputs.back(), "residual");
    a.residual = mx::gpu_ptr<float>(inputs.back());
  }
  if (a.rows == 0 || a.total == 0) return;
  const auto dtype = inputs[spec.weight_input(0) + 1].dtype();
  add_node(enc, std::to_string(spec.quant.bits) + ", " + scale_type(dtype), ProductLaunch::Plain, a);
}

void eval_gated(mx::Stream s, const GatedSpec& spec, const std::vector<array>& inputs, array& out) {
  auto& enc = mx::cu::get_command_encoder(s);
  std::vector<array> outs{out};
  // `outs[0]` shares `out`'s array: setting its data sets out's.
  ProductArgs a = common_args(enc, inputs, outs, spec.quant, spec.prologue, 2);
  a.w[0].out = mx::gpu_ptr<float>(out);
  if (a.rows == 0 || a.w[0].n == 0) return;
  const int act = spec.act == kern::Activation::Silu ? kActSilu : kActGeluTanh;
  const auto dtype = inputs[spec.weight_input(0) + 1].dtype();
  add_node(enc, std::to_string(spec.quant.bits) + ", " + scale_type(dtype) + ", " + std::to_string(act),
           ProductLaunch::Gated, a);
}

void allocate_output(mx::Stream s, array& a) { allocate(a, mx::cu::get_command_encoder(s)); }

bool copy_to_host(const array& a, void* dst) {
  const auto* buf = static_cast<const mx::cu::CudaBuffer*>(a.buffer().ptr());
  if (!buf || buf->device < 0 || a.nbytes() == 0) return false;
  check(driver().to_host(dst, reinterpret_cast<CUdeviceptr>(mx::gpu_ptr<uint8_t>(a)), a.nbytes()),
        "copying " + std::to_string(a.nbytes()) + " bytes to the host");
  return true;
}

std::string norm_unsupported() { return loaded() ? "" : "mlxcel's GPU kernels are not loaded"; }

void eval_rms_norm(mx::Stream s, const NormSpec& spec, const std::vector<array>& inputs, array& out) {
  const array& x = inputs[0];
  const int64_t ld = x_row_stride(x, "norm");
  auto& enc = mx::cu::get_command_encoder(s);
  std::vector<array> outs{out};
  // `outs[0]` shares `out`'s array: setting its data sets out's.
  bind(enc, inputs, outs);
  NormArgs a{};
  a.x = mx::gpu_ptr<float>(x);
  a.ldx = ld;
  a.dim = x.shape(-1);
  a.rows = a.dim == 0 ? 0 : static_cast<int>(x.size() / a.dim);
  a.eps = spec.norm.eps;
  a.out = mx::gpu_ptr<float>(out);
  if (spec.norm.weight) {
    require_row_major(inputs[1], "norm weight");
    a.weight = mx::gpu_ptr<float>(inputs[1]);
  }
  if (spec.epilogue == Epilogue::AddResidual) {
    require_row_major(inputs.back(), "residual");
    a.residual = mx::gpu_ptr<float>(inputs.back());
  }
  if (a.rows == 0 || a.dim == 0) return;
  add_launch(enc, kernel("mlxcel::rms_norm"), dim3(a.rows), dim3(kNormThreads), a);
}

static_assert(kMaxRows <= kMaxAttentionPositions, "a step's positions must fit the attention's shared memory");

std::string attention_unsupported(int batch, int seq, int dim, int vdim) {
  if (!loaded()) return "mlxcel's GPU kernels are not loaded";
  if (batch > kMaxAttentionRows) return std::to_string(batch) + " sequences: at most 32 in one GPU attention step";
  if (seq > kMaxRows) return std::to_string(seq) + " positions is a prompt: MLX's attention";
  if (dim > kMaxHeadDim || vdim > kMaxHeadDim) return "head dimensions above 256";
  return "";
}

void eval_cached_attention(mx::Stream s, const CachedAttentionSpec& spec, const std::vector<array>& inputs,
                           std::vector<array>& outputs, const std::vector<bool>& donated) {
  const int B = static_cast<int>(spec.rows.size());
  const array &q = inputs[0], &k = inputs[1], &v = inputs[2];
  require_row_major(q, "queries");
  require_row_major(k, "keys");
  require_row_major(v, "values");
  auto& enc = mx::cu::get_command_encoder(s);
  // Buffers not written in place are copied first (a flat copy: the
  // kernels index every buffer row-major).
  for (int i = 0; i < 2 * B; ++i) {
    if (donated[i]) continue;
    const array& src = inputs[3 + i];
    require_row_major(src, "cache buffer");
    array& dst = outputs[1 + i];
    enc.set_input_array(src);
    enc.set_output_array(dst);
    long long n = static_cast<long long>(dst.size());
    const float* from = mx::gpu_ptr<float>(src);
    float* to = mx::gpu_ptr<float>(dst);
    void* params[] = {&from, &to, &n};
    const unsigned blocks = static_cast<unsigned>(std::min<long long>((n + 255) / 256, 4096));
    const CUfunction copy = kernel("mlxcel::copy_floats");
    enc.add_kernel_node_raw(copy, dim3(std::max(blocks, 1u)), dim3(256), dim3(), 0, params);
    note_launch(enc, copy, dim3(std::max(blocks, 1u)), dim3(256), nullptr, 0, LaunchKind::Copy);
  }
  AttentionArgs a{};
  a.q = mx::gpu_ptr<float>(q);
  a.k = mx::gpu_ptr<float>(k);
  a.v = mx::gpu_ptr<float>(v);
  a.out = mx::gpu_ptr<float>(outputs[0]);
  a.freqs = spec.rope.has_freqs ? mx::gpu_ptr<float>(inputs[3 + 2 * B]) : nullptr;
  a.batch = B;
  a.heads = q.shape(1);
  a.kv_heads = k.shape(1);
  a.seq = q.shape(2);
  a.dim = q.shape(3);
  a.vdim = v.shape(3);
  a.rope_dims = spec.rope.dims;
  a.rope_traditional = spec.rope.traditional ? 1 : 0;
  a.rope_base = spec.rope.base;
  a.rope_scale = spec.rope.scale;
  a.scale = spec.scale;
  for (int b = 0; b < B; ++b) {
    const auto& step = spec.rows[b];
    auto& r = a.rows[b];
    r.keys = mx::gpu_ptr<float>(outputs[1 + 2 * b]);
    r.values = mx::gpu_ptr<float>(outputs[2 + 2 * b]);
    r.capacity = outputs[1 + 2 * b].shape(2);
    r.offset = step.offset;
    r.slot = step.slot;
    r.visible = step.visible;
    r.causal = step.causal ? 1 : 0;
  }
  // One launch rotates the step's keys, writes them and the values into
  // the buffers, and attends (attention.cuh).
  for (const auto& in : inputs) enc.set_input_array(in);
  for (int i = 0; i < 2 * B; ++i) enc.set_output_array(outputs[1 + i]);
  enc.set_output_array(outputs[0]);
  note_buffers(inputs);
  note_buffers(outputs);
  if (a.seq > 0 && a.heads > 0)
    add_launch(enc, kernel("mlxcel::cached_attention"), dim3(a.heads, a.seq, B), dim3(kAttentionThreads), a,
               LaunchKind::Attention);
}

std::string gather_unsupported(int bits, kern::WeightLayout layout, mx::Dtype ids, size_t count) {
  if (!loaded()) return "mlxcel's GPU kernels are not loaded";
  if (auto why = width_unsupported(registry().gather_widths, bits, "row gathers"); !why.empty()) return why;
  if (layout != kern::WeightLayout::RowMajor) return "the rows16 layout is the CPU's";
  if (ids != mx::int32 && ids != mx::uint32) return "the GPU row gather takes 32-bit ids";
  if (count > 65535) return std::to_string(count) + " ids are more than one GPU gather launch takes";
  return "";
}

void eval_gather(mx::Stream s, QuantSpec quant, float scale, const std::vector<array>& inputs, array& out) {
  const array &ids = inputs[0], &codes = inputs[1], &scales = inputs[2], &biases = inputs[3];
  require_row_major(ids, "ids");
  require_row_major(codes, "codes");
  require_row_major(scales, "scales");
  require_row_major(biases, "biases");
  auto& enc = mx::cu::get_command_encoder(s);
  std::vector<array> outs{out};
  // `outs[0]` shares `out`'s array: setting its data sets out's.
  bind(enc, inputs, outs);
  GatherRowsArgs a{};
  a.ids = mx::gpu_ptr<int>(ids);
  a.ids_signed = ids.dtype() == mx::int32 ? 1 : 0;
  a.count = static_cast<int>(ids.size());
  a.n = codes.shape(0);
  a.k = out.shape(-1);
  a.group = quant.group_size;
  a.codes = mx::gpu_ptr<unsigned>(codes);
  a.scales = mx::gpu_ptr<void>(scales);
  a.biases = mx::gpu_ptr<void>(biases);
  a.scale = scale;
  a.out = mx::gpu_ptr<float>(out);
  if (a.count == 0 || a.k == 0 || a.n == 0) return;
  const std::string expression =
      "mlxcel::gather<" + std::to_string(quant.bits) + ", " + scale_type(scales.dtype()) + ">";
  add_launch(enc, kernel(expression), dim3((a.k + kGatherThreads - 1) / kGatherThreads, a.count),
             dim3(kGatherThreads), a, LaunchKind::Gather);
}

#else  // without the cuda feature

size_t load_module(const uint8_t*, size_t, const std::string&) {
  throw std::runtime_error("mlxcel GPU kernels: this build has no CUDA support (build with --features cuda)");
}

bool loaded() { return false; }

std::string product_unsupported(int, kern::WeightLayout) {
  return "this build has no CUDA kernels";
}

void eval_product(mx::Stream, const ProductSpec&, const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::runtime_error("mlxcel GPU product: this build has no CUDA support");
}

void eval_gated(mx::Stream, const GatedSpec&, const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error("mlxcel GPU product: this build has no CUDA support");
}

void allocate_output(mx::Stream, mx::array&) {
  throw std::runtime_error("mlxcel GPU kernels: this build has no CUDA support");
}

bool copy_to_host(const mx::array&, void*) { return false; }

std::string norm_unsupported() { return "this build has no CUDA kernels"; }

void eval_rms_norm(mx::Stream, const NormSpec&, const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error("mlxcel GPU norm: this build has no CUDA support");
}

std::string attention_unsupported(int, int, int, int) { return "this build has no CUDA kernels"; }

std::string gather_unsupported(int, kern::WeightLayout, mx::Dtype, size_t) { return "this build has no CUDA kernels"; }

void eval_gather(mx::Stream, QuantSpec, float, const std::vector<mx::array>&, mx::array&) {
  throw std::runtime_error("mlxcel GPU gather: this build has no CUDA support");
}

void eval_cached_attention(mx::Stream, const CachedAttentionSpec&, const std::vector<mx::array>&,
                           std::vector<mx::array>&, const std::vector<bool>&) {
  throw std::runtime_error("mlxcel GPU attention: this build has no CUDA support");
}

#endif

}  // namespace mlxcel::fast::gpu
