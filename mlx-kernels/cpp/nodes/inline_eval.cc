// Evaluating a graph of mlxcel's nodes on the calling thread, and listing the
// nodes a graph has still to compute (ops.h `eval_inline`, `pending_ops`).
#include <unordered_set>

#include "mlxcel-mlx/cpp/nodes/launch.h"
#include "mlxcel-mlx/cpp/nodes/node.h"
#include "mlxcel-mlx/cpp/nodes/ops.h"

namespace mlxcel::fast {

std::vector<std::string> pending_ops(const std::vector<mx::array>& outputs) {
  std::vector<std::string> names;
  std::unordered_set<std::uintptr_t> seen;
  std::vector<array> stack(outputs.begin(), outputs.end());
  while (!stack.empty()) {
    array a = stack.back();
    stack.pop_back();
    if (a.status() != array::Status::unscheduled || !a.has_primitive()) continue;
    if (!seen.insert(a.primitive_id()).second) continue;  // siblings share one primitive
    names.emplace_back(a.primitive().name());
    for (const auto& in : a.inputs()) stack.push_back(in);
  }
  return names;
}

bool eval_inline(const std::vector<mx::array>& outputs) {
  // The pending nodes in dependency order (a post-order walk). The walk keeps
  // one array per node and none of their inputs, so that when a node runs,
  // its inputs are held only by the graph, as under MLX's own eval (the cache
  // buffers of CachedAttention must stay donatable).
  std::vector<array> order;
  std::unordered_set<std::uintptr_t> seen;
  std::vector<std::pair<array, bool>> stack;
  for (const auto& o : outputs) stack.emplace_back(o, false);
  while (!stack.empty()) {
    auto [a, expanded] = std::move(stack.back());
    stack.pop_back();
    if (a.status() != array::Status::unscheduled) {
      // Computed earlier, or still being computed by the stream: MLX waits.
      if (!a.is_available()) return false;
      continue;
    }
    if (!a.has_primitive() || a.is_tracer()) return false;
    if (expanded) {
      order.push_back(std::move(a));
      continue;
    }
    if (!seen.insert(a.primitive_id()).second) continue;  // siblings share one node
    mx::Primitive& p = a.primitive();
    // Only our CPU nodes know how to run inline (launch.h `submit`).
    if (p.stream().device != mx::Device::cpu || !is_node(p)) return false;
    auto inputs = a.inputs();
    stack.emplace_back(std::move(a), true);
    for (auto& in : inputs) stack.emplace_back(std::move(in), false);
  }
  InlineScope scope;
  for (auto& a : order) {
    array node = std::move(a);
    auto outs = node.outputs();
    node.primitive().eval_cpu(node.inputs(), outs);
    for (auto& o : outs) o.set_status(array::Status::available);
    // What MLX's eval does after a node: drop its inputs (freeing what no
    // later node needs) and its primitive.
    node.detach();
  }
  return true;
}

}  // namespace mlxcel::fast
