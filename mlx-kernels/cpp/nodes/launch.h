// How a node runs its kernel, and how a kernel reads its inputs.
//
// Mechanics (MLX 0.32 CPU backend): `eval_cpu` runs on the thread that called
// eval, before the inputs are necessarily computed. It allocates the output,
// then hands a task to the stream's command encoder; the task runs on the
// stream thread after the inputs' tasks, and only it may read them. The task
// captures weak copies of the arrays and its parameters by value (the
// primitive itself may be released before the task runs). Kernels never
// throw: every check is made when the node is built. Under `eval_inline`
// (inline_eval.cc) every input is computed already and the task runs at once
// on the calling thread.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "mlx/allocator.h"
#include "mlx/array.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/primitives.h"

namespace mlxcel::fast {

namespace mx = mlx::core;
using mx::array;

// ---------------------------------------------------------------------------
// Reading inputs inside a task.

/// The elements of `a` in row-major order: its own memory when it is
/// row-contiguous, else a copy in `buf`.
template <class T>
const T* row_major(const array& a, std::vector<T>& buf) {
  if (a.size() == 0) return nullptr;
  if (a.flags().row_contiguous) return a.data<T>();
  buf.resize(a.size());
  const auto& shape = a.shape();
  const auto& strides = a.strides();
  const int nd = a.ndim();
  const int inner = shape[nd - 1];
  const int64_t is = strides[nd - 1];
  const size_t rows = a.size() / inner;
  std::vector<int> idx(nd, 0);
  const T* src = a.data<T>();
  T* dst = buf.data();
  for (size_t r = 0; r < rows; ++r) {
    int64_t off = 0;
    for (int d = 0; d < nd - 1; ++d) off += idx[d] * strides[d];
    for (int c = 0; c < inner; ++c) dst[c] = src[off + c * is];
    dst += inner;
    for (int d = nd - 2; d >= 0; --d) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
  return buf.data();
}

/// When `a`, read as rows of its last axis, has a contiguous last axis and
/// one stride between consecutive rows, that stride in elements.
std::optional<int64_t> row_stride(const array& a);

/// Rows of the last axis of `a`: pointer and row stride, copying when the
/// layout has no single row stride.
const float* rows_of(const array& a, std::vector<float>& buf, int64_t& ld);

/// Scales or biases (f32, f16 or bf16) in row-major order, and their
/// kern::ScaleType.
struct ScaleData {
  std::vector<float> b32;
  std::vector<uint16_t> b16;
  const void* read(const array& a, int& type);
};

// ---------------------------------------------------------------------------
// Handing a kernel to the stream.

/// Whether nodes run on the calling thread now (`eval_inline`).
bool running_inline();

/// Marks the calling thread as evaluating inline while it lives.
class InlineScope {
 public:
  InlineScope();
  ~InlineScope();
  InlineScope(const InlineScope&) = delete;
  InlineScope& operator=(const InlineScope&) = delete;
};

/// Hands `task` to the stream's encoder, or runs it now under eval_inline
/// (whose caller has checked that every input is already computed).
template <class T>
void submit(mx::cpu::CommandEncoder& enc, T&& task) {
  if (running_inline()) {
    task();
  } else {
    enc.dispatch(std::forward<T>(task));
  }
}

/// Dispatches `f(inputs, outputs)` on the stream for outputs whose memory is
/// already set (allocated, or an input's buffer taken over).
template <class F>
void dispatch_multi(mx::Primitive& p, const std::vector<array>& inputs, std::vector<array>& outputs, F f) {
  auto& enc = mx::cpu::get_command_encoder(p.stream());
  std::vector<array> ins, outs;
  ins.reserve(inputs.size());
  outs.reserve(outputs.size());
  for (const auto& in : inputs) {
    enc.set_input_array(in);
    ins.push_back(array::unsafe_weak_copy(in));
  }
  for (auto& out : outputs) {
    enc.set_output_array(out);
    outs.push_back(array::unsafe_weak_copy(out));
  }
  submit(enc, [f = std::move(f), ins = std::move(ins), outs = std::move(outs)]() mutable { f(ins, outs); });
}

/// Allocates the output and dispatches `f(inputs, out)` on the stream.
template <class F>
void launch(mx::Primitive& p, const std::vector<array>& inputs, array& out, F f) {
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& enc = mx::cpu::get_command_encoder(p.stream());
  std::vector<array> ins;
  ins.reserve(inputs.size());
  for (const auto& in : inputs) {
    enc.set_input_array(in);
    ins.push_back(array::unsafe_weak_copy(in));
  }
  enc.set_output_array(out);
  submit(enc, [f = std::move(f), ins = std::move(ins), out = array::unsafe_weak_copy(out)]() mutable {
    f(ins, out);
  });
}

/// `launch` for nodes with several outputs.
template <class F>
void launch_multi(mx::Primitive& p, const std::vector<array>& inputs, std::vector<array>& outputs, F f) {
  for (auto& out : outputs) out.set_data(mx::allocator::malloc(out.nbytes()));
  dispatch_multi(p, inputs, outputs, std::move(f));
}

}  // namespace mlxcel::fast
