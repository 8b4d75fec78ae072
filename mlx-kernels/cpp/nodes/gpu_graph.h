// How our GPU nodes' launches reach a step being recorded (gpu.h
// `record_step`): every launch of gpu.cc goes through `add_launch`, which
// adds it to MLX's command encoder and, while a step is recorded on this
// thread, to the recording too. Internal to cpp/nodes/; built with the
// `cuda` feature only.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "mlx/array.h"
#include "mlx/backend/cuda/device.h"

namespace mlxcel::fast::gpu {

namespace mx = mlx::core;

/// What a recorded launch is to the replay.
enum class LaunchKind : uint8_t {
  /// Replayed as recorded.
  Plain,
  /// `AttentionArgs`: each replay supplies its rows' positions.
  Attention,
  /// `GatherRowsArgs`: reads the step's token ids.
  Gather,
  /// A cache buffer copied because it could not be written in place: a
  /// step that must not be replayed (the replay would copy the old buffer
  /// over the new one again).
  Copy,
};

/// Notes a launch of `f` whose one by-value parameter is the `size` bytes
/// at `args` (nothing unless a step is recorded on this thread).
void note_launch(mx::cu::CommandEncoder& enc, CUfunction f, dim3 grid, dim3 block, const void* args, size_t size,
                 LaunchKind kind);

/// Keeps the buffers of `arrays` alive as long as the step recorded on
/// this thread (nothing unless one is): its graph keeps their addresses.
void note_buffers(const std::vector<mx::array>& arrays);

/// Adds the launch of `f` with its one by-value parameter `args` to MLX's
/// command encoder, and notes it.
template <class Args>
void add_launch(mx::cu::CommandEncoder& enc, CUfunction f, dim3 grid, dim3 block, Args& args,
                LaunchKind kind = LaunchKind::Plain) {
  void* params[] = {&args};
  enc.add_kernel_node_raw(f, grid, block, dim3(), 0, params);
  note_launch(enc, f, grid, block, &args, sizeof(Args), kind);
}

}  // namespace mlxcel::fast::gpu
