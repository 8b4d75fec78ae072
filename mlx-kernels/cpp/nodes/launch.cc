// Input readers and the inline-evaluation flag (launch.h), and the GPU
// refusal every node shares (node.h).
#include "mlxcel-mlx/cpp/nodes/launch.h"

#include <stdexcept>
#include <string>

#include "mlxcel-mlx/cpp/kernels/kernels.h"
#include "mlxcel-mlx/cpp/nodes/node.h"

namespace mlxcel::fast {
namespace {

// Set while eval_inline runs nodes on the calling thread.
thread_local bool t_inline = false;

[[noreturn]] void no_gpu(const char* name) {
  throw std::runtime_error(std::string(name) +
                           ": mlxcel's CPU kernel has no GPU version (on the GPU mlxcel uses MLX's own ops)");
}

}  // namespace

void UnaryNode::eval_gpu(const std::vector<mx::array>&, mx::array&) { no_gpu(name()); }
void MultiNode::eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) { no_gpu(name()); }

std::optional<int64_t> row_stride(const array& a) {
  const int nd = a.ndim();
  if (nd == 0) return std::nullopt;
  const auto& sh = a.shape();
  const auto& st = a.strides();
  if (sh[nd - 1] > 1 && st[nd - 1] != 1) return std::nullopt;
  int64_t stride = -1, expect = 0;
  for (int d = nd - 2; d >= 0; --d) {
    if (sh[d] == 1) continue;
    if (stride < 0) {
      stride = st[d];
    } else if (st[d] != expect) {
      return std::nullopt;
    }
    expect = st[d] * sh[d];
  }
  return stride < 0 ? static_cast<int64_t>(sh[nd - 1]) : stride;
}

const float* rows_of(const array& a, std::vector<float>& buf, int64_t& ld) {
  if (auto s = row_stride(a)) {
    ld = *s;
    return a.size() == 0 ? nullptr : a.data<float>();
  }
  ld = a.shape(-1);
  return row_major(a, buf);
}

const void* ScaleData::read(const array& a, int& type) {
  if (a.dtype() == mx::float32) {
    type = kern::kScaleF32;
    return row_major(a, b32);
  }
  type = a.dtype() == mx::float16 ? kern::kScaleF16 : kern::kScaleBF16;
  return row_major(a, b16);
}

bool running_inline() { return t_inline; }
InlineScope::InlineScope() { t_inline = true; }
InlineScope::~InlineScope() { t_inline = false; }

}  // namespace mlxcel::fast
