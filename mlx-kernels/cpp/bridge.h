// The C++ side of the cxx bridge to MLX. Every function catches MLX's
// exceptions through cxx (functions declared `-> Result` in ffi.rs), so a bad
// shape or dtype becomes a Rust `Err`, never an abort.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "mlx/mlx.h"
#include "mlxcel-mlx/cpp/kernels/kernels.h"
#include "mlxcel-mlx/cpp/nodes/gpu.h"
#include "mlxcel-mlx/cpp/nodes/ops.h"
#include "rust/cxx.h"

namespace mlxcel {

// The enums and structs src/ffi.rs defines for both sides (cxx writes their
// definitions into the generated ffi.rs.h, after this header).
enum class Dtype : std::uint8_t;
enum class UnaryOp : std::uint8_t;
enum class BinaryOp : std::uint8_t;
enum class ReduceOp : std::uint8_t;
enum class ArgReduceOp : std::uint8_t;
enum class QuantMode : std::uint8_t;
enum class DeviceKind : std::uint8_t;
struct RopeParams;
struct CacheStep;

/// An owned handle to one MLX array (a node of MLX's lazy graph).
class Array {
 public:
  explicit Array(mlx::core::array a) : inner(std::move(a)) {}
  mlx::core::array inner;
};

/// A list of arrays, for operations that take or return several.
class ArrayList {
 public:
  std::vector<mlx::core::array> items;
};

using ArrayPtr = std::unique_ptr<Array>;

/// Rust's owner of borrowed bytes (src/ffi.rs); dropped with its rust::Box.
struct SharedBytes;

// Construction and inspection.
ArrayPtr array_from_bytes(rust::Slice<const uint8_t> data, rust::Slice<const int32_t> shape, Dtype dtype);
ArrayPtr array_from_shared(rust::Slice<const uint8_t> region, rust::Box<SharedBytes> owner, rust::Slice<const int32_t> shape, Dtype dtype);
bool borrowing_supported();
bool is_borrowed(const Array& a);
size_t data_address(const Array& a);
ArrayPtr full(rust::Slice<const int32_t> shape, double value, Dtype dtype);
ArrayPtr arange(double start, double stop, double step, Dtype dtype);
ArrayPtr clone_array(const Array& a);
rust::Vec<int32_t> shape(const Array& a);
Dtype dtype(const Array& a);
void eval(const Array& a);
void eval_list(const ArrayList& list);
size_t nbytes(const Array& a);
void copy_data(const Array& a, rust::Slice<uint8_t> out);

// Lists.
std::unique_ptr<ArrayList> new_list();
void list_push(ArrayList& list, const Array& a);
size_t list_len(const ArrayList& list);
ArrayPtr list_get(const ArrayList& list, size_t index);

// Elementwise and reductions.
ArrayPtr unary(UnaryOp op, const Array& a);
ArrayPtr binary(BinaryOp op, const Array& a, const Array& b);
ArrayPtr where_(const Array& cond, const Array& a, const Array& b);
ArrayPtr reduce(ReduceOp op, const Array& a, rust::Slice<const int32_t> axes, bool keepdims);
ArrayPtr arg_reduce(ArgReduceOp op, const Array& a, int32_t axis, bool keepdims);
ArrayPtr softmax(const Array& a, rust::Slice<const int32_t> axes, bool precise);
ArrayPtr cumsum(const Array& a, int32_t axis, bool reverse, bool inclusive);

// Linear algebra.
ArrayPtr matmul(const Array& a, const Array& b);
ArrayPtr gather_mm(const Array& a, const Array& b, std::unique_ptr<Array> lhs_indices, std::unique_ptr<Array> rhs_indices, bool sorted_indices);
ArrayPtr addmm(const Array& c, const Array& a, const Array& b, float alpha, float beta);

// Shape and layout.
ArrayPtr reshape(const Array& a, rust::Slice<const int32_t> shape);
ArrayPtr transpose(const Array& a, rust::Slice<const int32_t> axes);
ArrayPtr swapaxes(const Array& a, int32_t axis1, int32_t axis2);
ArrayPtr expand_dims(const Array& a, rust::Slice<const int32_t> axes);
ArrayPtr squeeze(const Array& a, rust::Slice<const int32_t> axes);
ArrayPtr broadcast_to(const Array& a, rust::Slice<const int32_t> shape);
ArrayPtr astype(const Array& a, Dtype dtype);
ArrayPtr contiguous(const Array& a);
ArrayPtr slice(const Array& a, rust::Slice<const int32_t> start, rust::Slice<const int32_t> stop, rust::Slice<const int32_t> strides);
ArrayPtr slice_dynamic(const Array& a, const Array& start, rust::Slice<const int32_t> axes, rust::Slice<const int32_t> size);
ArrayPtr slice_update(const Array& src, const Array& update, rust::Slice<const int32_t> start, rust::Slice<const int32_t> stop, rust::Slice<const int32_t> strides);
ArrayPtr slice_update_dynamic(const Array& src, const Array& update, const Array& start, rust::Slice<const int32_t> axes);
ArrayPtr concatenate(const ArrayList& list, int32_t axis);
ArrayPtr stack(const ArrayList& list, int32_t axis);
std::unique_ptr<ArrayList> split_sections(const Array& a, int32_t sections, int32_t axis);
std::unique_ptr<ArrayList> split_at(const Array& a, rust::Slice<const int32_t> indices, int32_t axis);
ArrayPtr tril(const Array& a, int32_t k);
ArrayPtr triu(const Array& a, int32_t k);

// Indexing and selection.
ArrayPtr take(const Array& a, const Array& indices, int32_t axis);
ArrayPtr take_along_axis(const Array& a, const Array& indices, int32_t axis);
ArrayPtr put_along_axis(const Array& a, const Array& indices, const Array& values, int32_t axis);
ArrayPtr argsort(const Array& a, int32_t axis);
ArrayPtr sort(const Array& a, int32_t axis);
ArrayPtr argpartition(const Array& a, int32_t kth, int32_t axis);
ArrayPtr topk(const Array& a, int32_t k, int32_t axis);

// Fast (fused where the backend has a kernel) transformer building blocks.
ArrayPtr rms_norm(const Array& x, std::unique_ptr<Array> weight, float eps);
ArrayPtr layer_norm(const Array& x, std::unique_ptr<Array> weight, std::unique_ptr<Array> bias, float eps);
ArrayPtr rope(const Array& x, int32_t dims, bool traditional, float base, float scale, int32_t offset, std::unique_ptr<Array> freqs);
ArrayPtr rope_dynamic(const Array& x, int32_t dims, bool traditional, float base, float scale, const Array& offset, std::unique_ptr<Array> freqs);
ArrayPtr scaled_dot_product_attention(const Array& q, const Array& k, const Array& v, float scale, fast::MaskMode mask_mode, std::unique_ptr<Array> mask, std::unique_ptr<Array> sinks);

// Quantization (affine and the other MLX modes).
std::unique_ptr<ArrayList> quantize(const Array& w, int32_t group_size, int32_t bits, QuantMode mode);
ArrayPtr dequantize(const Array& w, const Array& scales, std::unique_ptr<Array> biases, int32_t group_size, int32_t bits, QuantMode mode, Dtype dtype, bool scales_dtype);
ArrayPtr quantized_matmul(const Array& x, const Array& w, const Array& scales, std::unique_ptr<Array> biases, bool transpose, int32_t group_size, int32_t bits, QuantMode mode);
ArrayPtr gather_qmm(const Array& x, const Array& w, const Array& scales, std::unique_ptr<Array> biases, std::unique_ptr<Array> lhs_indices, std::unique_ptr<Array> rhs_indices, bool transpose, int32_t group_size, int32_t bits, QuantMode mode, bool sorted_indices);

// mlxcel's kernels (cpp/nodes/ops.h), on the path the caller asks for.
ArrayPtr fast_quantized_linear(const Array& x, const Array& w, const Array& scales, std::unique_ptr<Array> biases, int32_t group_size, int32_t bits, kern::WeightLayout layout, fast::Path path);
ArrayPtr fast_quantized_gather(const Array& ids, const Array& w, const Array& scales, std::unique_ptr<Array> biases, int32_t group_size, int32_t bits, kern::WeightLayout layout, float scale, fast::Path path);
std::unique_ptr<ArrayList> fast_quantized_linear_multi(const Array& x, const ArrayList& weights, rust::Slice<const int32_t> heads, int32_t group_size, int32_t bits, kern::WeightLayout layout, fast::Path path);
ArrayPtr fast_quantized_gated_linear(kern::Activation act, const Array& x, const ArrayList& weights, int32_t group_size, int32_t bits, kern::WeightLayout layout, fast::Path path);
std::unique_ptr<ArrayList> fast_linear_multi(const Array& x, const ArrayList& weights, rust::Slice<const int32_t> heads, fast::Path path);
ArrayPtr fast_gated_linear(kern::Activation act, const Array& x, const ArrayList& weights, fast::Path path);
ArrayPtr fast_gather_rows(const Array& ids, const Array& table, float scale, fast::Path path);
ArrayPtr fast_rms_norm(const Array& x, std::unique_ptr<Array> weight, float eps, fast::Path path);
ArrayPtr fast_add(const Array& a, const Array& b, fast::Path path);
ArrayPtr fast_rope(const Array& x, const RopeParams& rope, std::unique_ptr<Array> freqs, int32_t offset, fast::Path path);
ArrayPtr fast_sdpa(const Array& q, const Array& k, const Array& v, float scale, fast::MaskMode mask_mode, std::unique_ptr<Array> mask, fast::Path path);
std::unique_ptr<ArrayList> fast_cached_attention(const ArrayList& arrays, const RopeParams& rope, std::unique_ptr<Array> freqs, rust::Slice<const CacheStep> rows, float scale, fast::Path path);
ArrayPtr fast_merge_heads(const Array& x, fast::Path path);
ArrayPtr fast_gated_activation(kern::Activation act, const Array& a, const Array& b, fast::Path path);
int32_t kernels_threads();
int32_t kernels_default_threads();
void kernels_set_threads(int32_t n);
void kernels_set_default_threads(int32_t n);
void kernels_set_spin(int32_t spin_us, bool spin_yield);
bool retain_freed_memory();
kern::Isa kernels_isa();
bool kernels_isa_supported(kern::Isa isa);
bool kernels_amx_supported();
void kernels_set_amx(bool on);
bool kernels_amx_active();
bool kernels_set_isa(kern::Isa isa);
double kernels_read_bandwidth(size_t bytes, int32_t reps);
rust::Vec<rust::String> pending_ops(const ArrayList& list);
bool eval_inline(const ArrayList& list);
double kernels_bench_qmm(const Array& x, const ArrayList& weights, int32_t group_size, int32_t bits, int32_t reps);

// Random numbers, always from an explicit key (deterministic per seed).
ArrayPtr random_key(uint64_t seed);
ArrayPtr random_split(const Array& key, int32_t num);
ArrayPtr random_uniform(float low, float high, rust::Slice<const int32_t> shape, Dtype dtype, const Array& key);
ArrayPtr random_normal(rust::Slice<const int32_t> shape, Dtype dtype, float loc, float scale, const Array& key);
ArrayPtr random_categorical(const Array& logits, int32_t axis, const Array& key);

// Devices, versions and memory.
rust::String mlx_version();
bool gpu_available();
DeviceKind default_device();
void set_default_device(DeviceKind device);
rust::String device_name(DeviceKind device);
rust::String cuda_arch();
void set_jit_cache_dir(rust::Str dir);
size_t load_gpu_kernels(rust::Slice<const uint8_t> cubin, rust::Str names);
bool gpu_kernels_loaded();

// Decode steps recorded as one CUDA graph (cpp/nodes/gpu.h).
using StepGraph = fast::gpu::StepGraph;
std::unique_ptr<StepGraph> record_step(const ArrayList& outputs, const Array& tokens, const Array& logits,
                                       rust::String& refusal);
bool replay_step(StepGraph& graph, rust::Slice<const uint32_t> tokens, const ArrayList& caches,
                 rust::Slice<const CacheStep> rows, rust::Slice<float> logits);
void synchronize();
size_t active_memory();
size_t peak_memory();
void reset_peak_memory();
size_t cache_memory();
void clear_cache();

}  // namespace mlxcel
