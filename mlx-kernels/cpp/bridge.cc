// Thin wrappers from the cxx bridge to MLX's C++ API. Each wrapper converts the
// bridge's plain types (slices, the shared enums of src/ffi.rs) to MLX's and
// back; validation that MLX does not do itself (and that would otherwise read
// out of bounds) is done here and reported as an exception, which cxx turns
// into a Rust `Err`.
#include "mlxcel-mlx/cpp/bridge.h"
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "mlx/backend/gpu/device_info.h"
#include "mlx/memory.h"
#include "mlx/version.h"
#include "mlxcel-mlx/cpp/kernels/kernels.h"
#include "mlxcel-mlx/cpp/nodes/gpu.h"
#include "mlxcel-mlx/cpp/nodes/ops.h"
#include "mlxcel-mlx/src/ffi.rs.h"

namespace mx = mlx::core;

namespace mlxcel {
namespace {

// The bridge's element types (src/ffi.rs `Dtype`) and MLX's, both ways.
constexpr std::pair<Dtype, mx::Dtype> kDtypes[] = {
    {Dtype::Bool, mx::bool_},   {Dtype::U8, mx::uint8},       {Dtype::U16, mx::uint16},
    {Dtype::U32, mx::uint32},   {Dtype::U64, mx::uint64},     {Dtype::I8, mx::int8},
    {Dtype::I16, mx::int16},    {Dtype::I32, mx::int32},      {Dtype::I64, mx::int64},
    {Dtype::F16, mx::float16},  {Dtype::F32, mx::float32},    {Dtype::F64, mx::float64},
    {Dtype::BF16, mx::bfloat16}, {Dtype::Complex64, mx::complex64},
};

mx::Dtype to_dtype(Dtype d) {
  for (const auto& [ours, theirs] : kDtypes)
    if (ours == d) return theirs;
  throw std::invalid_argument("unknown dtype " + std::to_string(static_cast<int>(d)));
}

Dtype from_dtype(mx::Dtype d) {
  for (const auto& [ours, theirs] : kDtypes)
    if (theirs == d) return ours;
  throw std::invalid_argument("an MLX dtype the bridge does not know");
}

mx::Shape to_shape(rust::Slice<const int32_t> s) { return mx::Shape(s.begin(), s.end()); }

std::vector<int> to_ints(rust::Slice<const int32_t> s) { return std::vector<int>(s.begin(), s.end()); }

ArrayPtr wrap(mx::array a) { return std::make_unique<Array>(std::move(a)); }

std::unique_ptr<ArrayList> wrap_list(std::vector<mx::array> v) {
  auto list = std::make_unique<ArrayList>();
  list->items = std::move(v);
  return list;
}

std::optional<mx::array> opt(const std::unique_ptr<Array>& a) {
  if (a) return a->inner;
  return std::nullopt;
}

mx::Device to_device(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::Cpu: return mx::Device::cpu;
    case DeviceKind::Gpu: return mx::Device::gpu;
  }
  throw std::invalid_argument("unknown device kind " + std::to_string(static_cast<int>(kind)));
}

// MLX's name of a quantization mode.
std::string mode_name(QuantMode mode) {
  switch (mode) {
    case QuantMode::Affine: return "affine";
    case QuantMode::Mxfp4: return "mxfp4";
    case QuantMode::Mxfp8: return "mxfp8";
    case QuantMode::Nvfp4: return "nvfp4";
  }
  throw std::invalid_argument("unknown quantization mode " + std::to_string(static_cast<int>(mode)));
}

// The bytes `shape` elements of `dt` take; throws on a negative dimension or overflow.
size_t byte_size(const mx::Shape& shape, mx::Dtype dt) {
  size_t nbytes = dt.size();
  for (auto d : shape) {
    if (d < 0) throw std::invalid_argument("negative dimension in shape");
    if (__builtin_mul_overflow(nbytes, static_cast<size_t>(d), &nbytes)) {
      throw std::invalid_argument("shape too large");
    }
  }
  return nbytes;
}

}  // namespace

ArrayPtr array_from_bytes(rust::Slice<const uint8_t> data, rust::Slice<const int32_t> shape, Dtype dtype) {
  auto dt = to_dtype(dtype);
  auto sh = to_shape(shape);
  size_t nbytes = byte_size(sh, dt);
  if (nbytes != data.size()) {
    throw std::invalid_argument("data has " + std::to_string(data.size()) + " bytes, shape and dtype need " +
                                std::to_string(nbytes));
  }
  auto buffer = mx::allocator::malloc(nbytes);
  if (nbytes > 0) std::memcpy(buffer.buffer().raw_ptr(), data.data(), nbytes);
  return wrap(mx::array(std::move(buffer), std::move(sh), dt));
}

// Zero-copy arrays over memory MLX did not allocate (Rust's `Bytes`, e.g. a
// bundle's read-only memory map).
//
// MLX 0.32's CPU-only build cannot wrap external memory: `make_buffer` returns
// nullptr there, so `mx::array(void*, shape, dtype, deleter)` copies. Its
// CommonAllocator (mlx/backend/no_gpu/allocator.cpp) lays every allocation out
// as one `size_t` (the size) followed by the data: `Buffer{ptr}` and
// `Buffer::raw_ptr() == (size_t*)ptr + 1`. So an array over data at `p` is
// `mx::array(Data(Buffer(p - sizeof(size_t)), deleter), shape, dtype)`. Why
// that is safe with MLX 0.32.4 (read in its shipped headers and in MLX's
// source at 0.32.2, the newest we have; the probe below re-checks the parts
// that differ between them at run time):
//  - `Data(Buffer, Deleter)` is MLX's public constructor for memory it does
//    not own (`is_owned() == false`): when the last array sharing it goes,
//    `~Data` calls our deleter, never `allocator().free`, so the buffer never
//    reaches MLX's free list or buffer cache.
//  - Data reads go through `raw_ptr()` (+ the array's offset): only our bytes.
//  - The header word at `p - 8` is read only by `allocator().size(buffer)`,
//    i.e. `array::buffer_size()`. MLX's CPU code calls it in two places: the
//    donation check `is_donatable(in, out)` (backend/common/utils.h), after
//    `in.is_donatable()`, which is false for non-owned data; and
//    `Contiguous::eval_cpu`, which uses it only to choose between sharing the
//    input buffer and copying it, both correct for any value. The Rust side
//    passes those 8 bytes as the start of `region`, inside the borrowed
//    `Bytes`, so the read stays in bounds; the value is whatever the bytes hold
//    (a bundle's alignment padding or the end of the previous tensor).
//  - MLX never writes into it: outputs go to `allocator::malloc`ed buffers
//    unless an input is donated (`is_donatable()`: one reference to the array
//    and to its data, and owned data: the last condition is in 0.32.4, not
//    yet in 0.32.2), and our kernels never write into their inputs. Bundles
//    are mapped read-only (PROT_READ, MAP_PRIVATE): a write would fault,
//    never change the file.
//  - Lifetime: `owner` (a clone of the Rust `Bytes`) lives in the deleter, so
//    the memory stays mapped until MLX releases the last array using the
//    buffer: clones, views that share it (reshape, slice, contiguous), and
//    pending graph nodes (their inputs hold the array; the CPU encoder holds
//    input buffers until a task has run).
// `borrowing_supported()` checks the layout and the donation rule at run time
// (once), so a build with another allocator (CUDA, Metal) or an MLX that
// changed them falls back to copying.
bool borrowing_supported() {
  static const bool supported = [] {
    auto probe = mx::allocator::malloc(4 * sizeof(float));
    auto buffer = probe.buffer();
    auto* base = static_cast<char*>(buffer.ptr());
    // The CPU allocator's layout: the data one size_t past the buffer pointer.
    if (base == nullptr || static_cast<char*>(buffer.raw_ptr()) != base + sizeof(size_t)) return false;
    // ... whose size() is that header word.
    if (mx::allocator::allocator().size(buffer) != *reinterpret_cast<const size_t*>(base)) return false;
    // Arrays over non-owned data are never donated (never written into).
    mx::array borrowed(mx::allocator::Data(buffer, [](mx::allocator::Buffer) {}), mx::Shape{4}, mx::float32);
    return !borrowed.is_donatable();
  }();
  return supported;
}

ArrayPtr array_from_shared(rust::Slice<const uint8_t> region, rust::Box<SharedBytes> owner,
                           rust::Slice<const int32_t> shape, Dtype dtype) {
  if (!borrowing_supported()) throw std::logic_error("this MLX allocator cannot borrow memory");
  auto dt = to_dtype(dtype);
  auto sh = to_shape(shape);
  size_t nbytes = byte_size(sh, dt);
  if (nbytes == 0 || region.size() != sizeof(size_t) + nbytes) {
    throw std::invalid_argument("borrowed region has " + std::to_string(region.size()) + " bytes, expected " +
                                std::to_string(sizeof(size_t)) + " + " + std::to_string(nbytes));
  }
  // MLX takes a mutable pointer but never writes through it (see above).
  auto* header = const_cast<uint8_t*>(region.data());
  if (reinterpret_cast<uintptr_t>(header + sizeof(size_t)) % dt.size() != 0) {
    throw std::invalid_argument("borrowed data is not aligned to its dtype");
  }
  // std::function needs a copyable callable: share the (move-only) Box.
  auto keep = std::make_shared<rust::Box<SharedBytes>>(std::move(owner));
  mx::allocator::Data data(mx::allocator::Buffer(header), [keep](mx::allocator::Buffer) mutable { keep.reset(); });
  return wrap(mx::array(std::move(data), std::move(sh), dt));
}

bool is_borrowed(const Array& a) {
  const auto& data = a.inner.data_shared_ptr();
  return data != nullptr && !data->is_owned();
}

size_t data_address(const Array& a) {
  auto c = a.inner;
  c.eval();
  return reinterpret_cast<uintptr_t>(c.data<uint8_t>());
}

ArrayPtr full(rust::Slice<const int32_t> shape, double value, Dtype dtype) {
  auto dt = to_dtype(dtype);
  // Integers go through int64 so that large values stay exact.
  auto v = mx::issubdtype(dt, mx::integer) ? mx::array(static_cast<int64_t>(value), mx::int64)
                                             : mx::array(static_cast<float>(value), mx::float32);
  return wrap(mx::full(to_shape(shape), v, dt));
}

ArrayPtr arange(double start, double stop, double step, Dtype dtype) {
  return wrap(mx::arange(start, stop, step, to_dtype(dtype)));
}

ArrayPtr clone_array(const Array& a) { return wrap(a.inner); }

rust::Vec<int32_t> shape(const Array& a) {
  rust::Vec<int32_t> out;
  for (auto d : a.inner.shape()) out.push_back(d);
  return out;
}

Dtype dtype(const Array& a) { return from_dtype(a.inner.dtype()); }

void eval(const Array& a) { mx::eval(a.inner); }

void eval_list(const ArrayList& list) { mx::eval(list.items); }

size_t nbytes(const Array& a) { return a.inner.nbytes(); }

void copy_data(const Array& a, rust::Slice<uint8_t> out) {
  auto c = a.inner;
  c.eval();
  if (!c.flags().row_contiguous) {
    // Strided views are copied row-contiguous on the CPU stream: it reads any
    // dtype (the GPU has no float64) and the memory is unified.
    c = mx::contiguous(c, false, mx::Device::cpu);
    c.eval();
  }
  if (c.nbytes() != out.size()) {
    throw std::invalid_argument("destination has " + std::to_string(out.size()) + " bytes, array has " +
                                std::to_string(c.nbytes()));
  }
  // Device memory (a GPU node's output) is copied from the device directly.
  if (c.nbytes() > 0 && !fast::gpu::copy_to_host(c, out.data())) std::memcpy(out.data(), c.data<uint8_t>(), c.nbytes());
}

std::unique_ptr<ArrayList> new_list() { return std::make_unique<ArrayList>(); }
void list_push(ArrayList& list, const Array& a) { list.items.push_back(a.inner); }
size_t list_len(const ArrayList& list) { return list.items.size(); }
ArrayPtr list_get(const ArrayList& list, size_t index) {
  if (index >= list.items.size()) throw std::out_of_range("array list index out of range");
  return wrap(list.items[index]);
}

ArrayPtr unary(UnaryOp op, const Array& a) {
  const auto& x = a.inner;
  switch (op) {
    case UnaryOp::Negative: return wrap(mx::negative(x));
    case UnaryOp::Exp: return wrap(mx::exp(x));
    case UnaryOp::Log: return wrap(mx::log(x));
    case UnaryOp::Sqrt: return wrap(mx::sqrt(x));
    case UnaryOp::Rsqrt: return wrap(mx::rsqrt(x));
    case UnaryOp::Square: return wrap(mx::square(x));
    case UnaryOp::Abs: return wrap(mx::abs(x));
    case UnaryOp::Tanh: return wrap(mx::tanh(x));
    case UnaryOp::Sigmoid: return wrap(mx::sigmoid(x));
    case UnaryOp::Erf: return wrap(mx::erf(x));
    case UnaryOp::Sin: return wrap(mx::sin(x));
    case UnaryOp::Cos: return wrap(mx::cos(x));
    case UnaryOp::Floor: return wrap(mx::floor(x));
    case UnaryOp::Ceil: return wrap(mx::ceil(x));
    case UnaryOp::LogicalNot: return wrap(mx::logical_not(x));
    case UnaryOp::Log1p: return wrap(mx::log1p(x));
    case UnaryOp::Reciprocal: return wrap(mx::reciprocal(x));
    case UnaryOp::IsNan: return wrap(mx::isnan(x));
    case UnaryOp::IsInf: return wrap(mx::isinf(x));
  }
  throw std::invalid_argument("unknown UnaryOp " + std::to_string(static_cast<int>(op)));
}

ArrayPtr binary(BinaryOp op, const Array& a, const Array& b) {
  const auto& x = a.inner;
  const auto& y = b.inner;
  switch (op) {
    case BinaryOp::Add: return wrap(mx::add(x, y));
    case BinaryOp::Subtract: return wrap(mx::subtract(x, y));
    case BinaryOp::Multiply: return wrap(mx::multiply(x, y));
    case BinaryOp::Divide: return wrap(mx::divide(x, y));
    case BinaryOp::Maximum: return wrap(mx::maximum(x, y));
    case BinaryOp::Minimum: return wrap(mx::minimum(x, y));
    case BinaryOp::Power: return wrap(mx::power(x, y));
    case BinaryOp::Equal: return wrap(mx::equal(x, y));
    case BinaryOp::NotEqual: return wrap(mx::not_equal(x, y));
    case BinaryOp::Less: return wrap(mx::less(x, y));
    case BinaryOp::LessEqual: return wrap(mx::less_equal(x, y));
    case BinaryOp::Greater: return wrap(mx::greater(x, y));
    case BinaryOp::GreaterEqual: return wrap(mx::greater_equal(x, y));
    case BinaryOp::LogicalAnd: return wrap(mx::logical_and(x, y));
    case BinaryOp::LogicalOr: return wrap(mx::logical_or(x, y));
    case BinaryOp::Remainder: return wrap(mx::remainder(x, y));
    case BinaryOp::FloorDivide: return wrap(mx::floor_divide(x, y));
  }
  throw std::invalid_argument("unknown BinaryOp " + std::to_string(static_cast<int>(op)));
}

ArrayPtr where_(const Array& cond, const Array& a, const Array& b) {
  return wrap(mx::where(cond.inner, a.inner, b.inner));
}

ArrayPtr reduce(ReduceOp op, const Array& a, rust::Slice<const int32_t> axes, bool keepdims) {
  auto ax = to_ints(axes);
  const auto& x = a.inner;
  switch (op) {
    case ReduceOp::Sum: return wrap(mx::sum(x, ax, keepdims));
    case ReduceOp::Mean: return wrap(mx::mean(x, ax, keepdims));
    case ReduceOp::Max: return wrap(mx::max(x, ax, keepdims));
    case ReduceOp::Min: return wrap(mx::min(x, ax, keepdims));
    case ReduceOp::Prod: return wrap(mx::prod(x, ax, keepdims));
    case ReduceOp::LogSumExp: return wrap(mx::logsumexp(x, ax, keepdims));
  }
  throw std::invalid_argument("unknown ReduceOp " + std::to_string(static_cast<int>(op)));
}

ArrayPtr arg_reduce(ArgReduceOp op, const Array& a, int32_t axis, bool keepdims) {
  switch (op) {
    case ArgReduceOp::ArgMax: return wrap(mx::argmax(a.inner, axis, keepdims));
    case ArgReduceOp::ArgMin: return wrap(mx::argmin(a.inner, axis, keepdims));
  }
  throw std::invalid_argument("unknown ArgReduceOp " + std::to_string(static_cast<int>(op)));
}

ArrayPtr softmax(const Array& a, rust::Slice<const int32_t> axes, bool precise) {
  return wrap(mx::softmax(a.inner, to_ints(axes), precise));
}

ArrayPtr cumsum(const Array& a, int32_t axis, bool reverse, bool inclusive) {
  return wrap(mx::cumsum(a.inner, axis, reverse, inclusive));
}

ArrayPtr matmul(const Array& a, const Array& b) { return wrap(mx::matmul(a.inner, b.inner)); }

ArrayPtr addmm(const Array& c, const Array& a, const Array& b, float alpha, float beta) {
  return wrap(mx::addmm(c.inner, a.inner, b.inner, alpha, beta));
}

ArrayPtr gather_mm(const Array& a, const Array& b, std::unique_ptr<Array> lhs_indices,
                   std::unique_ptr<Array> rhs_indices, bool sorted_indices) {
  return wrap(mx::gather_mm(a.inner, b.inner, opt(lhs_indices), opt(rhs_indices), sorted_indices));
}

ArrayPtr reshape(const Array& a, rust::Slice<const int32_t> shape) { return wrap(mx::reshape(a.inner, to_shape(shape))); }

ArrayPtr transpose(const Array& a, rust::Slice<const int32_t> axes) {
  if (axes.empty()) return wrap(mx::transpose(a.inner));
  return wrap(mx::transpose(a.inner, to_ints(axes)));
}

ArrayPtr swapaxes(const Array& a, int32_t axis1, int32_t axis2) { return wrap(mx::swapaxes(a.inner, axis1, axis2)); }

ArrayPtr expand_dims(const Array& a, rust::Slice<const int32_t> axes) {
  return wrap(mx::expand_dims(a.inner, to_ints(axes)));
}

ArrayPtr squeeze(const Array& a, rust::Slice<const int32_t> axes) { return wrap(mx::squeeze(a.inner, to_ints(axes))); }

ArrayPtr broadcast_to(const Array& a, rust::Slice<const int32_t> shape) {
  return wrap(mx::broadcast_to(a.inner, to_shape(shape)));
}

ArrayPtr astype(const Array& a, Dtype dtype) { return wrap(mx::astype(a.inner, to_dtype(dtype))); }

ArrayPtr contiguous(const Array& a) { return wrap(mx::contiguous(a.inner)); }

ArrayPtr slice(const Array& a, rust::Slice<const int32_t> start, rust::Slice<const int32_t> stop,
               rust::Slice<const int32_t> strides) {
  return wrap(mx::slice(a.inner, to_shape(start), to_shape(stop), to_shape(strides)));
}

ArrayPtr slice_dynamic(const Array& a, const Array& start, rust::Slice<const int32_t> axes,
                       rust::Slice<const int32_t> size) {
  return wrap(mx::slice(a.inner, start.inner, to_ints(axes), to_shape(size)));
}

ArrayPtr slice_update(const Array& src, const Array& update, rust::Slice<const int32_t> start,
                      rust::Slice<const int32_t> stop, rust::Slice<const int32_t> strides) {
  return wrap(mx::slice_update(src.inner, update.inner, to_shape(start), to_shape(stop), to_shape(strides)));
}

ArrayPtr slice_update_dynamic(const Array& src, const Array& update, const Array& start,
                              rust::Slice<const int32_t> axes) {
  return wrap(mx::slice_update(src.inner, update.inner, start.inner, to_ints(axes)));
}

ArrayPtr concatenate(const ArrayList& list, int32_t axis) { return wrap(mx::concatenate(list.items, axis)); }

ArrayPtr stack(const ArrayList& list, int32_t axis) { return wrap(mx::stack(list.items, axis)); }

std::unique_ptr<ArrayList> split_sections(const Array& a, int32_t sections, int32_t axis) {
  return wrap_list(mx::split(a.inner, sections, axis));
}

std::unique_ptr<ArrayList> split_at(const Array& a, rust::Slice<const int32_t> indices, int32_t axis) {
  return wrap_list(mx::split(a.inner, to_shape(indices), axis));
}

ArrayPtr tril(const Array& a, int32_t k) { return wrap(mx::tril(a.inner, k)); }
ArrayPtr triu(const Array& a, int32_t k) { return wrap(mx::triu(a.inner, k)); }

ArrayPtr take(const Array& a, const Array& indices, int32_t axis) {
  return wrap(mx::take(a.inner, indices.inner, axis));
}

ArrayPtr take_along_axis(const Array& a, const Array& indices, int32_t axis) {
  return wrap(mx::take_along_axis(a.inner, indices.inner, axis));
}

ArrayPtr put_along_axis(const Array& a, const Array& indices, const Array& values, int32_t axis) {
  return wrap(mx::put_along_axis(a.inner, indices.inner, values.inner, axis));
}

ArrayPtr argsort(const Array& a, int32_t axis) { return wrap(mx::argsort(a.inner, axis)); }
ArrayPtr sort(const Array& a, int32_t axis) { return wrap(mx::sort(a.inner, axis)); }
ArrayPtr argpartition(const Array& a, int32_t kth, int32_t axis) {
  return wrap(mx::argpartition(a.inner, kth, axis));
}
ArrayPtr topk(const Array& a, int32_t k, int32_t axis) { return wrap(mx::topk(a.inner, k, axis)); }

ArrayPtr rms_norm(const Array& x, std::unique_ptr<Array> weight, float eps) {
  return wrap(mx::fast::rms_norm(x.inner, opt(weight), eps));
}

ArrayPtr layer_norm(const Array& x, std::unique_ptr<Array> weight, std::unique_ptr<Array> bias, float eps) {
  return wrap(mx::fast::layer_norm(x.inner, opt(weight), opt(bias), eps));
}

ArrayPtr rope(const Array& x, int32_t dims, bool traditional, float base, float scale, int32_t offset,
              std::unique_ptr<Array> freqs) {
  // MLX takes either a base or explicit frequencies, never both.
  std::optional<float> b = freqs ? std::nullopt : std::optional<float>(base);
  return wrap(mx::fast::rope(x.inner, dims, traditional, b, scale, offset, opt(freqs)));
}

ArrayPtr rope_dynamic(const Array& x, int32_t dims, bool traditional, float base, float scale, const Array& offset,
                      std::unique_ptr<Array> freqs) {
  std::optional<float> b = freqs ? std::nullopt : std::optional<float>(base);
  return wrap(mx::fast::rope(x.inner, dims, traditional, b, scale, offset.inner, opt(freqs)));
}

ArrayPtr scaled_dot_product_attention(const Array& q, const Array& k, const Array& v, float scale,
                                      fast::MaskMode mask_mode, std::unique_ptr<Array> mask,
                                      std::unique_ptr<Array> sinks) {
  return wrap(mx::fast::scaled_dot_product_attention(q.inner, k.inner, v.inner, scale, fast::mlx_mask_mode(mask_mode),
                                                     opt(mask), opt(sinks)));
}

std::unique_ptr<ArrayList> quantize(const Array& w, int32_t group_size, int32_t bits, QuantMode mode) {
  return wrap_list(mx::quantize(w.inner, group_size, bits, mode_name(mode)));
}

ArrayPtr dequantize(const Array& w, const Array& scales, std::unique_ptr<Array> biases, int32_t group_size,
                    int32_t bits, QuantMode mode, Dtype dtype, bool scales_dtype) {
  std::optional<mx::Dtype> dt;
  if (!scales_dtype) dt = to_dtype(dtype);
  return wrap(mx::dequantize(w.inner, scales.inner, opt(biases), group_size, bits, mode_name(mode), std::nullopt,
                             dt));
}

ArrayPtr quantized_matmul(const Array& x, const Array& w, const Array& scales, std::unique_ptr<Array> biases,
                          bool transpose, int32_t group_size, int32_t bits, QuantMode mode) {
  return wrap(mx::quantized_matmul(x.inner, w.inner, scales.inner, opt(biases), transpose, group_size, bits,
                                   mode_name(mode)));
}

ArrayPtr gather_qmm(const Array& x, const Array& w, const Array& scales, std::unique_ptr<Array> biases,
                    std::unique_ptr<Array> lhs_indices, std::unique_ptr<Array> rhs_indices, bool transpose,
                    int32_t group_size, int32_t bits, QuantMode mode, bool sorted_indices) {
  return wrap(mx::gather_qmm(x.inner, w.inner, scales.inner, opt(biases), opt(lhs_indices), opt(rhs_indices),
                             transpose, group_size, bits, mode_name(mode), std::nullopt, sorted_indices));
}


ArrayPtr fast_quantized_linear(const Array& x, const Array& w, const Array& scales, std::unique_ptr<Array> biases,
                               int32_t group_size, int32_t bits, kern::WeightLayout layout, fast::Path path) {
  return wrap(
      fast::quantized_linear(x.inner, {w.inner, scales.inner, opt(biases), layout}, group_size, bits, path));
}

ArrayPtr fast_quantized_gather(const Array& ids, const Array& w, const Array& scales, std::unique_ptr<Array> biases,
                               int32_t group_size, int32_t bits, kern::WeightLayout layout, float scale,
                               fast::Path path) {
  return wrap(fast::quantized_gather(ids.inner, {w.inner, scales.inner, opt(biases), layout}, group_size, bits,
                                     scale, path));
}

namespace {
std::vector<fast::QuantizedWeight> weight_triples(const ArrayList& weights, kern::WeightLayout layout) {
  if (weights.items.size() % 3 != 0) throw std::invalid_argument("weights come as (codes, scales, biases) triples");
  std::vector<fast::QuantizedWeight> ws;
  for (size_t i = 0; i < weights.items.size(); i += 3)
    ws.push_back({weights.items[i], weights.items[i + 1], weights.items[i + 2], layout});
  return ws;
}
}  // namespace

std::unique_ptr<ArrayList> fast_quantized_linear_multi(const Array& x, const ArrayList& weights,
                                                       rust::Slice<const int32_t> heads, int32_t group_size,
                                                       int32_t bits, kern::WeightLayout layout, fast::Path path) {
  return wrap_list(fast::quantized_linear_multi(x.inner, weight_triples(weights, layout), to_ints(heads), group_size,
                                                bits, path));
}

ArrayPtr fast_quantized_gated_linear(kern::Activation act, const Array& x, const ArrayList& weights,
                                     int32_t group_size, int32_t bits, kern::WeightLayout layout, fast::Path path) {
  auto ws = weight_triples(weights, layout);
  if (ws.size() != 2) throw std::invalid_argument("a gated linear takes a gate and an up projection");
  return wrap(
      fast::quantized_gated_linear(act, x.inner, ws[0], ws[1], group_size, bits, path));
}

std::unique_ptr<ArrayList> fast_linear_multi(const Array& x, const ArrayList& weights,
                                             rust::Slice<const int32_t> heads, fast::Path path) {
  return wrap_list(fast::linear_multi(x.inner, weights.items, to_ints(heads), path));
}

ArrayPtr fast_gated_linear(kern::Activation act, const Array& x, const ArrayList& weights, fast::Path path) {
  if (weights.items.size() != 2) throw std::invalid_argument("a gated linear takes a gate and an up projection");
  return wrap(fast::gated_linear(act, x.inner, weights.items[0], weights.items[1], path));
}

ArrayPtr fast_gather_rows(const Array& ids, const Array& table, float scale, fast::Path path) {
  return wrap(fast::gather_rows(ids.inner, table.inner, scale, path));
}

ArrayPtr fast_rms_norm(const Array& x, std::unique_ptr<Array> weight, float eps, fast::Path path) {
  return wrap(fast::rms_norm(x.inner, opt(weight), eps, path));
}

ArrayPtr fast_add(const Array& a, const Array& b, fast::Path path) {
  return wrap(fast::add(a.inner, b.inner, path));
}

namespace {
fast::RopeSpec rope_spec(const RopeParams& rope, const std::unique_ptr<Array>& freqs) {
  return {rope.dims, rope.traditional, rope.base, rope.scale, opt(freqs)};
}
}  // namespace

ArrayPtr fast_rope(const Array& x, const RopeParams& rope, std::unique_ptr<Array> freqs, int32_t offset,
                   fast::Path path) {
  return wrap(fast::rope(x.inner, rope_spec(rope, freqs), offset, path));
}

ArrayPtr fast_sdpa(const Array& q, const Array& k, const Array& v, float scale, fast::MaskMode mask_mode,
                   std::unique_ptr<Array> mask, fast::Path path) {
  return wrap(fast::sdpa(q.inner, k.inner, v.inner, scale, mask_mode, opt(mask), path));
}

std::unique_ptr<ArrayList> fast_cached_attention(const ArrayList& arrays, const RopeParams& rope,
                                                 std::unique_ptr<Array> freqs, rust::Slice<const CacheStep> rows,
                                                 float scale, fast::Path path) {
  const auto& a = arrays.items;
  if (a.size() != 3 + 2 * rows.size())
    throw std::invalid_argument("cached_attention takes q, k, v and two cache buffers per row");
  std::vector<fast::CacheRow> cache;
  for (size_t b = 0; b < rows.size(); ++b) {
    const auto& r = rows[b];
    cache.push_back({a[3 + 2 * b], a[4 + 2 * b], r.offset, r.slot, r.visible, r.causal});
  }
  return wrap_list(fast::cached_attention(a[0], a[1], a[2], rope_spec(rope, freqs), cache, scale, path));
}

ArrayPtr fast_merge_heads(const Array& x, fast::Path path) { return wrap(fast::merge_heads(x.inner, path)); }

ArrayPtr fast_gated_activation(kern::Activation act, const Array& a, const Array& b, fast::Path path) {
  return wrap(fast::gated_activation(act, a.inner, b.inner, path));
}

int32_t kernels_threads() { return kern::pool_threads(); }
int32_t kernels_default_threads() { return kern::default_threads(); }
void kernels_set_threads(int32_t n) { kern::set_pool_threads(n); }
void kernels_set_default_threads(int32_t n) { kern::set_default_threads(n); }
void kernels_set_spin(int32_t spin_us, bool spin_yield) { kern::set_spin(spin_us, spin_yield); }

// MLX's CPU allocator is plain malloc, without the buffer cache its GPU
// allocators have, and a decode step frees and reallocates the same few MB of
// activations, logits and scores. glibc's defaults serve buffers over its
// (adaptive) mmap threshold from fresh mappings and give freed memory at the
// top of the heap back above a trim threshold of twice that, so every step
// faulted its buffers' pages in again (~1,900 page faults a step decoding 16
// SmolLM2 sequences). Serving everything up to 32 MiB from the heap and
// keeping up to 256 MiB of it free removes that.
bool retain_freed_memory() {
#if defined(__GLIBC__)
  const bool mmap_ok = mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1;
  const bool trim_ok = mallopt(M_TRIM_THRESHOLD, 256 << 20) == 1;
  return mmap_ok && trim_ok;
#else
  return false;
#endif
}
kern::Isa kernels_isa() { return kern::table().isa; }
bool kernels_isa_supported(kern::Isa isa) { return kern::isa_supported(isa); }
bool kernels_amx_supported() { return kern::amx_supported(); }
void kernels_set_amx(bool on) { kern::set_amx(on); }
bool kernels_amx_active() { return kern::amx_active(); }
bool kernels_set_isa(kern::Isa isa) { return kern::set_isa(isa); }
double kernels_read_bandwidth(size_t bytes, int32_t reps) { return kern::read_bandwidth_gbs(bytes, reps); }

bool eval_inline(const ArrayList& list) { return fast::eval_inline(list.items); }

rust::Vec<rust::String> pending_ops(const ArrayList& list) {
  rust::Vec<rust::String> out;
  for (auto& name : fast::pending_ops(list.items)) out.push_back(rust::String(name));
  return out;
}

// Seconds per pass of the quantized-matmul kernel alone (no graph, no MLX
// dispatch) over the weights of `weights` ((codes, scales, biases) triples)
// in sequence, best of `reps` passes. One weight measures a matrix that stays
// in cache; many distinct copies measure one streamed from memory.
double kernels_bench_qmm(const Array& x, const ArrayList& weights, int32_t group_size, int32_t bits, int32_t reps) {
  if (weights.items.empty() || weights.items.size() % 3 != 0)
    throw std::invalid_argument("kernels_bench_qmm: weights come as (codes, scales, biases) triples");
  std::vector<mx::array> all{x.inner};
  all.insert(all.end(), weights.items.begin(), weights.items.end());
  mx::eval(all);
  for (const auto& a : all) {
    if (!a.flags().row_contiguous) throw std::invalid_argument("kernels_bench_qmm: inputs must be row-contiguous");
  }
  const int K = x.inner.shape(-1);
  if (x.inner.dtype() != mx::float32 || (bits != 4 && bits != 8) || K % group_size != 0)
    throw std::invalid_argument("kernels_bench_qmm: f32 x, 4 or 8 bits");
  std::vector<kern::QmmArgs> args;
  size_t max_n = 0;
  for (size_t i = 0; i < weights.items.size(); i += 3) {
    const auto& w = weights.items[i];
    const auto& sc = weights.items[i + 1];
    const auto& bi = weights.items[i + 2];
    const auto sd = sc.dtype();
    if (w.dtype() != mx::uint32 || w.shape(1) * 32 / bits != K || bi.dtype() != sd ||
        (sd != mx::float32 && sd != mx::float16 && sd != mx::bfloat16))
      throw std::invalid_argument("kernels_bench_qmm: u32 codes of K columns, f32/f16/bf16 scales and biases");
    kern::QmmArgs a{};
    a.x = x.inner.data<float>();
    a.ldx = K;
    a.w = w.data<uint32_t>();
    a.scales = sc.data<void>();
    a.biases = bi.data<void>();
    a.scale_type = sd == mx::float32 ? kern::kScaleF32 : (sd == mx::float16 ? kern::kScaleF16 : kern::kScaleBF16);
    a.M = static_cast<int>(x.inner.size() / K);
    a.N = w.shape(0);
    a.ldo = a.N;
    a.K = K;
    a.group_size = group_size;
    a.bits = bits;
    max_n = std::max(max_n, static_cast<size_t>(a.N));
    args.push_back(a);
  }
  std::vector<float> out(static_cast<size_t>(args[0].M) * max_n);
  for (auto& a : args) a.out = out.data();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (const auto& a : args) kern::table().qmm(a);
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = dt < best ? dt : best;
  }
  return best;
}

ArrayPtr random_key(uint64_t seed) { return wrap(mx::random::key(seed)); }

ArrayPtr random_split(const Array& key, int32_t num) { return wrap(mx::random::split(key.inner, num)); }

ArrayPtr random_uniform(float low, float high, rust::Slice<const int32_t> shape, Dtype dtype, const Array& key) {
  return wrap(mx::random::uniform(low, high, to_shape(shape), to_dtype(dtype), key.inner));
}

ArrayPtr random_normal(rust::Slice<const int32_t> shape, Dtype dtype, float loc, float scale, const Array& key) {
  return wrap(mx::random::normal(to_shape(shape), to_dtype(dtype), loc, scale, key.inner));
}

ArrayPtr random_categorical(const Array& logits, int32_t axis, const Array& key) {
  return wrap(mx::random::categorical(logits.inner, axis, key.inner));
}

rust::String mlx_version() { return rust::String(mx::version()); }

bool gpu_available() { return mx::is_available(mx::Device::gpu); }

DeviceKind default_device() {
  return mx::default_device().type == mx::Device::gpu ? DeviceKind::Gpu : DeviceKind::Cpu;
}

void set_default_device(DeviceKind device) {
  auto d = to_device(device);
  if (!mx::is_available(d)) throw std::runtime_error("device is not available in the linked MLX library");
  mx::set_default_device(d);
}

rust::String device_name(DeviceKind device) {
  auto d = to_device(device);
  if (!mx::is_available(d)) return rust::String("unavailable");
  const auto& info = mx::device_info(d);
  std::string name;
  auto it = info.find("device_name");
  if (it != info.end() && std::holds_alternative<std::string>(it->second)) name = std::get<std::string>(it->second);
  auto arch = info.find("architecture");
  if (arch != info.end() && std::holds_alternative<std::string>(arch->second)) {
    const auto& a = std::get<std::string>(arch->second);
    if (!a.empty()) name += (name.empty() ? "" : " (") + a + (name.empty() ? "" : ")");
  }
  return rust::String(name);
}

// The NVRTC architecture MLX compiles its run-time kernels for on GPU 0,
// `sm_{major}{minor}` with MLX's `a` suffix from compute capability 9
// (jit_module.cpp), or "" without a CUDA GPU.
rust::String cuda_arch() {
  if (!mx::is_available(mx::Device::gpu)) return rust::String("");
  const auto& info = mx::device_info(mx::Device::gpu);
  auto major = info.find("compute_capability_major");
  auto minor = info.find("compute_capability_minor");
  if (major == info.end() || minor == info.end() || !std::holds_alternative<size_t>(major->second) ||
      !std::holds_alternative<size_t>(minor->second)) {
    return rust::String("");
  }
  size_t ma = std::get<size_t>(major->second);
  size_t mi = std::get<size_t>(minor->second);
  return rust::String("sm_" + std::to_string(ma) + std::to_string(mi) + (ma >= 9 ? "a" : ""));
}

// MLX reads MLX_PTX_CACHE_DIR once, when it first needs a run-time kernel;
// setting it before that points MLX at the kernels a bundle carries.
void set_jit_cache_dir(rust::Str dir) {
  std::string value(dir);
  if (setenv("MLX_PTX_CACHE_DIR", value.c_str(), 1) != 0) throw std::runtime_error("setenv MLX_PTX_CACHE_DIR failed");
}

size_t load_gpu_kernels(rust::Slice<const uint8_t> cubin, rust::Str names) {
  return fast::gpu::load_module(cubin.data(), cubin.size(), std::string(names));
}

bool gpu_kernels_loaded() { return fast::gpu::loaded(); }

std::unique_ptr<StepGraph> record_step(const ArrayList& outputs, const Array& tokens, const Array& logits,
                                       rust::String& refusal) {
  std::string why;
  auto graph = fast::gpu::record_step(outputs.items, tokens.inner, logits.inner, why);
  refusal = rust::String(why);
  return graph;
}

bool replay_step(StepGraph& graph, rust::Slice<const uint32_t> tokens, const ArrayList& caches,
                 rust::Slice<const CacheStep> rows, rust::Slice<float> logits) {
  if (caches.items.size() != 2 * rows.size())
    throw std::invalid_argument("replay_step takes a key and a value buffer per row");
  std::vector<fast::gpu::ReplayRow> replay;
  replay.reserve(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    replay.push_back({&caches.items[2 * i], &caches.items[2 * i + 1], r.offset, r.slot, r.visible, r.causal});
  }
  return graph.replay(tokens.data(), tokens.size(), replay, logits.data(), logits.size());
}

void synchronize() { mx::synchronize(); }
size_t active_memory() { return mx::get_active_memory(); }
size_t peak_memory() { return mx::get_peak_memory(); }
void reset_peak_memory() { mx::reset_peak_memory(); }
size_t cache_memory() { return mx::get_cache_memory(); }
void clear_cache() { mx::clear_cache(); }

}  // namespace mlxcel
