// What all of mlxcel's graph nodes share: the base classes that mark a
// primitive as ours (inline evaluation and the fusion rules find our nodes by
// C++ type, never by `name()`, which is for display only), and the parameter
// types more than one kind of node uses.
#pragma once

#include <cstdint>
#include <vector>

#include "mlx/array.h"
#include "mlx/primitives.h"

namespace mlxcel::fast {

namespace mx = mlx::core;

/// The mark of an mlxcel node: a primitive that runs one of mlxcel's CPU
/// kernels (and, for the quantized products, a CUDA kernel: gpu.h).
class Node {
 public:
  virtual ~Node() = default;
};

/// A node with one output.
class UnaryNode : public mx::UnaryPrimitive, public Node {
 public:
  explicit UnaryNode(mx::Stream s) : mx::UnaryPrimitive(s) {}
  void eval_gpu(const std::vector<mx::array>& inputs, mx::array& out) override;
};

/// A node with several outputs.
class MultiNode : public mx::Primitive, public Node {
 public:
  explicit MultiNode(mx::Stream s) : mx::Primitive(s) {}
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
};

/// Whether `p` is one of mlxcel's nodes.
inline bool is_node(const mx::Primitive& p) { return dynamic_cast<const Node*>(&p) != nullptr; }

/// The node of type `T` behind `a` when `a` is such a node's output and not
/// computed yet (a fusion rule may still rewrite or absorb it); else null.
template <class T>
const T* pending(const mx::array& a) {
  if (!a.has_primitive() || a.status() != mx::array::Status::unscheduled) return nullptr;
  return dynamic_cast<const T*>(&a.primitive());
}

/// An RMS norm of rows: `x / sqrt(mean(x²) + eps) (· w)`; with `weight`, the
/// node has the weight `[D]` as an input.
struct RmsNormParams {
  float eps = 0.0f;
  bool weight = false;
  bool operator==(const RmsNormParams&) const = default;
};

/// What a node does to its rows as it writes them.
enum class Epilogue : uint8_t {
  None,
  /// Adds its last input, of the output's shape (a residual connection).
  AddResidual,
};

}  // namespace mlxcel::fast
