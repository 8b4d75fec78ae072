// Recording a decode step of our GPU nodes as one CUDA graph, and replaying
// it (gpu.h `record_step`, `StepGraph`).
//
// Why: a decode step of SmolLM2 is about 160 nodes; building them costs the
// host about 0.7 ms and MLX's evaluation about 15 µs a node more (2.6 ms),
// for 1.3 ms of GPU time (docs/cuda.md "Where a decode step's host time
// goes"). Consecutive decode steps of the same sequences run the same
// kernels on the same buffers: only the token ids and each cache row's
// position change. So the first such step is evaluated by MLX as usual
// while every launch of our nodes is noted (gpu_graph.h `add_launch`), and
// the launches become a CUDA graph; the next steps copy the token ids and
// the sequences' positions in (the attention launches read them from a
// buffer of the graph's), launch the graph and copy the logits out.
//
// What makes that sound: every node of the step is ours (checked before
// the step is evaluated), so the noted launches are all of its kernels; the
// graph holds every buffer they touch (note_buffers), so no address in it is
// reused while it lives; the cache buffers are written in place, so the
// caller's cache arrays stay the graph's (a replay checks each one); and the
// kernels' arguments are their only parameters, so a replay's arguments are
// the recorded ones, with the positions read from device memory instead of
// the arguments: the same kernels on the same data, bit for bit what MLX's
// evaluation of the step would compute.
#include <stdexcept>

#include "mlx/transforms.h"
#include "mlxcel-mlx/cpp/nodes/gpu.h"

#ifdef MLXCEL_CUDA
#include <cuda.h>

#include <cstring>
#include <unordered_map>
#include <unordered_set>

#include "mlx/backend/cuda/device.h"
#include "mlxcel-mlx/cpp/nodes/gpu_driver.h"
#include "mlxcel-mlx/cpp/nodes/gpu_graph.h"
#include "mlxcel-mlx/cpp/nodes/node.h"
#include "mlxcel-mlx/cuda/gpu_args.h"
#endif

namespace mlxcel::fast::gpu {

#ifdef MLXCEL_CUDA
namespace {

using mx::array;

struct Launch {
  CUfunction f;
  dim3 grid, block;
  LaunchKind kind;
  // The one by-value parameter, as launched (8-byte words keep it aligned
  // for the pointers and 64-bit integers in it).
  std::vector<uint64_t> args;
  CUgraphNode node = nullptr;
};

struct Recording {
  std::vector<Launch> launches;
  std::vector<std::shared_ptr<mx::array::Data>> buffers;
  std::unordered_set<const void*> held;
  CUstream stream = nullptr;
  bool several_streams = false;
};

// The step being recorded on this thread (MLX evaluates GPU nodes on the
// thread that called eval).
thread_local Recording* t_recording = nullptr;

template <class T>
T& args_as(Launch& l) {
  return *reinterpret_cast<T*>(l.args.data());
}

// Every node `outputs` still need is one of our nodes on the GPU: "" when
// so, else the first other node's name (for the message only).
std::string foreign_node(const std::vector<array>& outputs) {
  std::unordered_set<std::uintptr_t> seen;
  std::vector<array> stack(outputs.begin(), outputs.end());
  while (!stack.empty()) {
    array a = std::move(stack.back());
    stack.pop_back();
    if (a.status() != array::Status::unscheduled) continue;
    if (!a.has_primitive()) continue;
    if (!seen.insert(a.primitive_id()).second) continue;
    mx::Primitive& p = a.primitive();
    if (!is_node(p) || p.stream().device != mx::Device::gpu) return p.name();
    for (const auto& in : a.inputs()) stack.push_back(in);
  }
  return "";
}

class Recorded final : public StepGraph {
 public:
  Recorded(Recording&& r, const array& tokens, const array& logits) : r_(std::move(r)) {
    auto& d = driver();
    tokens_ = mx::gpu_ptr<uint8_t>(tokens);
    token_count_ = tokens.size();
    logits_ = mx::gpu_ptr<uint8_t>(logits);
    logits_count_ = logits.size();
    // Every attention launch's rows read their positions from their own
    // entries of one buffer, which each replay fills with one copy (setting
    // each launch's arguments in the executable graph cost the host a
    // driver call per launch and step).
    size_t entries = 0;
    for (auto& l : r_.launches)
      if (l.kind == LaunchKind::Attention) entries += args_as<AttentionArgs>(l).batch;
    if (entries) {
      check(d.alloc_async(&positions_, entries * sizeof(StepPositions), r_.stream), "allocating a step's positions");
      check(d.synchronize(r_.stream), "allocating a step's positions");
      host_positions_.resize(entries);
      auto* device = reinterpret_cast<const StepPositions*>(positions_);
      size_t at = 0;
      for (auto& l : r_.launches) {
        if (l.kind != LaunchKind::Attention) continue;
        auto& a = args_as<AttentionArgs>(l);
        a.positions = device + at;
        at += a.batch;
      }
    }
    // The logits come back through page-locked memory, then one memcpy:
    // a copy straight to the caller's pageable memory goes through the
    // driver's own staging in pieces (Gemma 3's 1 MB of logits: a replayed
    // step 0.09-0.14 ms faster this way on an H100; docs/cuda.md).
    try {
      check(d.alloc_host(&host_logits_, logits_count_ * sizeof(float)), "allocating a step's page-locked logits");
      check(d.graph_create(&graph_, 0), "creating a step graph");
      CUgraphNode previous = nullptr;
      for (auto& l : r_.launches) {
        void* arg = nullptr;
        CUDA_KERNEL_NODE_PARAMS p = params(l, &arg);
        // One chain, in the order MLX evaluated the nodes: each kernel
        // after the one before, as on the stream.
        check(d.graph_add_kernel(&l.node, graph_, previous ? &previous : nullptr, previous ? 1 : 0, &p),
              "adding a kernel to a step graph");
        previous = l.node;
      }
      check(d.graph_instantiate(&exec_, graph_, 0), "instantiating a step graph");
    } catch (...) {
      if (graph_) d.graph_destroy(graph_);
      if (host_logits_) d.free_host(host_logits_);
      if (positions_) d.free_async(positions_, r_.stream);
      throw;
    }
  }

  ~Recorded() override {
    // The last replay synchronised its stream: nothing of the graph runs.
    auto& d = driver();
    if (exec_) d.graph_exec_destroy(exec_);
    if (graph_) d.graph_destroy(graph_);
    if (host_logits_) d.free_host(host_logits_);
    if (positions_) d.free_async(positions_, r_.stream);
  }

  bool replay(const uint32_t* tokens, size_t count, const std::vector<ReplayRow>& rows, float* logits,
              size_t logits_count) override {
    if (count != token_count_)
      throw std::invalid_argument("step graph: " + std::to_string(count) + " token ids for a step recorded with " +
                                  std::to_string(token_count_));
    if (logits_count != logits_count_)
      throw std::invalid_argument("step graph: room for " + std::to_string(logits_count) + " logits, the step has " +
                                  std::to_string(logits_count_));
    // Each recorded cache row must be one of `rows` (its buffers unchanged),
    // and every one of `rows` used. Rows are found by their key buffer: a
    // map, not a search per attention row, so a batch of 32 costs 32 lookups
    // per layer rather than 32².
    std::unordered_map<const void*, size_t> by_keys;
    by_keys.reserve(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) by_keys.emplace(mx::gpu_ptr<float>(*rows[i].keys), i);
    std::vector<bool> used(rows.size(), false);
    size_t at = 0;
    for (auto& l : r_.launches) {
      if (l.kind != LaunchKind::Attention) continue;
      const auto& a = args_as<AttentionArgs>(l);
      for (int b = 0; b < a.batch; ++b) {
        const auto& row = a.rows[b];
        auto found = by_keys.find(row.keys);
        if (found == by_keys.end()) return false;
        size_t i = found->second;
        if (mx::gpu_ptr<float>(*rows[i].values) != row.values) return false;
        used[i] = true;
        host_positions_[at++] = StepPositions{rows[i].offset, rows[i].slot, rows[i].visible, rows[i].causal ? 1 : 0};
      }
    }
    for (bool u : used)
      if (!u) return false;
    auto& d = driver();
    mx::cu::device(mx::Device::gpu).make_current();
    if (positions_)
      check(d.to_device_async(positions_, host_positions_.data(), host_positions_.size() * sizeof(StepPositions),
                              r_.stream),
            "copying a step's positions");
    check(d.to_device_async(reinterpret_cast<CUdeviceptr>(tokens_), tokens, count * sizeof(uint32_t), r_.stream),
          "copying a step's token ids");
    check(d.graph_launch(exec_, r_.stream), "launching a step graph");
    check(d.to_host_async(host_logits_, reinterpret_cast<CUdeviceptr>(logits_), logits_count * sizeof(float),
                          r_.stream),
          "copying a step's logits");
    check(d.synchronize(r_.stream), "waiting for a step graph");
    std::memcpy(logits, host_logits_, logits_count * sizeof(float));
    return true;
  }

 private:
  // The node parameters of `l`; `arg` holds the pointer to its one
  // parameter (the driver copies the value during the call that takes them).
  static CUDA_KERNEL_NODE_PARAMS params(Launch& l, void** arg) {
    CUDA_KERNEL_NODE_PARAMS p{};
    p.func = l.f;
    p.gridDimX = l.grid.x;
    p.gridDimY = l.grid.y;
    p.gridDimZ = l.grid.z;
    p.blockDimX = l.block.x;
    p.blockDimY = l.block.y;
    p.blockDimZ = l.block.z;
    *arg = l.args.data();
    p.kernelParams = arg;
    return p;
  }

  Recording r_;
  const uint8_t* tokens_ = nullptr;
  size_t token_count_ = 0;
  const uint8_t* logits_ = nullptr;
  size_t logits_count_ = 0;
  CUgraph graph_ = nullptr;
  CUgraphExec exec_ = nullptr;
  // The attention launches' positions: on the device, and staged here.
  CUdeviceptr positions_ = 0;
  std::vector<StepPositions> host_positions_;
  // Page-locked staging of the logits (logits_count_ floats).
  void* host_logits_ = nullptr;
};

// Ends the recording on this thread however eval ends.
struct RecordingScope {
  explicit RecordingScope(Recording& r) { t_recording = &r; }
  ~RecordingScope() { t_recording = nullptr; }
};

}  // namespace

void note_launch(mx::cu::CommandEncoder& enc, CUfunction f, dim3 grid, dim3 block, const void* args, size_t size,
                 LaunchKind kind) {
  Recording* r = t_recording;
  if (!r) return;
  const auto stream = reinterpret_cast<CUstream>(static_cast<cudaStream_t>(enc.stream()));
  if (!r->stream) r->stream = stream;
  if (stream != r->stream) r->several_streams = true;
  Launch l{f, grid, block, kind, std::vector<uint64_t>((size + 7) / 8), nullptr};
  if (size) std::memcpy(l.args.data(), args, size);
  r->launches.push_back(std::move(l));
}

void note_buffers(const std::vector<array>& arrays) {
  Recording* r = t_recording;
  if (!r) return;
  for (const auto& a : arrays) {
    const auto& data = a.data_shared_ptr();
    if (data && r->held.insert(data.get()).second) r->buffers.push_back(data);
  }
}

std::unique_ptr<StepGraph> record_step(const std::vector<array>& outputs, const array& tokens, const array& logits,
                                       std::string& refusal) {
  refusal.clear();
  if (!loaded()) {
    refusal = "mlxcel's GPU kernels are not loaded";
  } else if (auto name = foreign_node(outputs); !name.empty()) {
    refusal = "the step has MLX's node " + name + ", which a step graph cannot replay";
  } else if (!tokens.is_available() || tokens.has_primitive()) {
    refusal = "the step's token ids are not a plain input array";
  } else if (tokens.dtype() != mx::uint32 && tokens.dtype() != mx::int32) {
    refusal = "the step's token ids are not 32-bit";
  }
  if (!refusal.empty()) {
    mx::eval(outputs);
    return nullptr;
  }
  Recording r;
  {
    RecordingScope scope(r);
    mx::eval(outputs);
  }
  // The launches of MLX's own nodes are not in the recording: the walk
  // above found none. What can still differ from step to step:
  bool copied = false, gathers_tokens = false;
  for (auto& l : r.launches) {
    if (l.kind == LaunchKind::Copy) copied = true;
    if (l.kind == LaunchKind::Gather && args_as<GatherRowsArgs>(l).ids == mx::gpu_ptr<int>(tokens))
      gathers_tokens = true;
  }
  if (copied) return nullptr;  // a cache buffer that was not written in place: the next step will be
  if (r.launches.empty() || r.several_streams) {
    refusal = "the step's kernels were not all issued on one stream by this thread";
    return nullptr;
  }
  if (!gathers_tokens) {
    refusal = "no gather of the step reads its token ids (the embeddings are not mlxcel's gather)";
    return nullptr;
  }
  if (!r.held.count(logits.data_shared_ptr().get()) || !logits.flags().row_contiguous ||
      logits.dtype() != mx::float32) {
    refusal = "the step's logits are not the f32 output of one of mlxcel's GPU nodes";
    return nullptr;
  }
  r.buffers.push_back(tokens.data_shared_ptr());
  r.held.clear();
  try {
    return std::make_unique<Recorded>(std::move(r), tokens, logits);
  } catch (const std::exception& e) {
    // The step itself was evaluated: only its replays are lost.
    refusal = e.what();
    return nullptr;
  }
}

#else  // without the cuda feature

std::unique_ptr<StepGraph> record_step(const std::vector<mx::array>& outputs, const mx::array&, const mx::array&,
                                       std::string& refusal) {
  refusal = "this build has no CUDA support";
  mx::eval(outputs);
  return nullptr;
}

#endif

}  // namespace mlxcel::fast::gpu
