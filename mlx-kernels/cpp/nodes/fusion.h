// The graph rewrites: every place where one of mlxcel's nodes absorbs
// another node it meets while the graph is built. Each rule matches nodes by
// C++ type and spec (node.h `pending`), never by name, and gives exactly the
// bits of the unfused graph (fusion.cc says why for each rule;
// mlx-kernels/tests/kernels.rs has one test per rule).
#pragma once

#include <optional>

#include "mlxcel-mlx/cpp/nodes/node.h"

namespace mlxcel::fast {

/// The x a product reads and the RMS norm it applies first, if any.
struct ProductInput {
  mx::array x;
  std::optional<RmsNormParams> prologue;
  std::optional<mx::array> norm_weight;
};

/// Rule 1: a product of a pending plain RMS norm's output normalises the
/// norm's input itself (the norm node is not evaluated unless something
/// else reads it). Returns `x` unchanged when it is no such norm.
ProductInput absorb_norm(const mx::array& x);

/// Rule 2: `a + b` where one side is a pending single plain product (or,
/// failing that, a pending plain RMS norm) of ours and the other an f32
/// array of its shape: one node of the same kind that adds the residual as
/// it writes. None when neither side matches.
std::optional<mx::array> fold_residual(const mx::array& a, const mx::array& b);

/// The cache buffers attention reads directly, and how many of their first
/// positions are the keys.
struct CachePrefix {
  mx::array keys;
  mx::array values;
  int positions;
};

/// Rule 3: keys and values that are pending slices of the first n positions
/// (axis 2) of two 4-D f32 buffers (what a KV cache hands out).
std::optional<CachePrefix> cache_prefix(const mx::array& k, const mx::array& v);

/// Rule 4: `merge_heads` of a pending attention node of ours that writes
/// `[B, H, L, Dv]`: the same attention writing `[B, L, H · Dv]`.
std::optional<mx::array> merge_into_attention(const mx::array& x);

}  // namespace mlxcel::fast
