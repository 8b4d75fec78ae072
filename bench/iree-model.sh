#!/usr/bin/env bash
# The bundle's own IREE module (mlxcel-compile --target iree-llvm-cpu) timed
# on this CPU with IREE's benchmark tool, beside `mlxcel bench` on MLX, in one
# run (issue [8]; results in docs/benchmarks.md "IREE on the CPU").
#
#   bash bench/iree-model.sh [GGUF]     # default: the package's SmolLM2 Q4_1
#   THREADS=2 CONTEXT=1024 REPS=5 bash bench/iree-model.sh
#   WORK=/tmp/w bash bench/iree-model.sh   # keeps the bundles, parameters and vmfb there
#
# The module runs twice: under iree-benchmark-module (its weights the
# bundle's tensors written out as a safetensors parameter file, byte for
# byte from `mlxcel inspect --json`'s offsets, its KV caches zeroed
# arguments of CONTEXT positions; pp512 = 512 / the time of one
# `prefill_512` call, tg = 1 / the time of one `decode_1` call), with IREE's
# per-dispatch profile; and under `mlxcel bench --backend iree` (the
# runtime's IREE backend, a build with the `iree` feature in target/iree:
# the parameters imported from the bundle's map). Each IREE decode step
# attends over all CONTEXT positions; MLX's tg128 over the 512..640 it has.
# Time to ready: `mlxcel run -v`'s "ready in" line on each backend.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
deps=${MLXCEL_DEPS_DIR:-$root/.deps}
gguf=${1:-$deps/models/SmolLM2-135M-Instruct.Q4_1.gguf}
threads=${THREADS:-2}
context=${CONTEXT:-1024}
reps=${REPS:-5}
bench=$deps/iree/iree/_runtime_libs/iree-benchmark-module
[ -x "$bench" ] || { echo "iree-model.sh: $bench is missing: run make setup" >&2; exit 2; }
[ -f "$gguf" ] || { echo "iree-model.sh: $gguf is missing: run make setup" >&2; exit 2; }
[ "$context" -ge 512 ] || { echo "iree-model.sh: CONTEXT must be at least 512 (the prefill_512 chunk)" >&2; exit 2; }
work=${WORK:-$(mktemp -d)}
mkdir -p "$work"
[ -n "${WORK:-}" ] || trap 'rm -rf "$work"' EXIT INT TERM

cargo build -q --release -p mlxcel-cli -p mlxcel-compiler --bins
bin=$root/target/release
CARGO_TARGET_DIR=$root/target/iree bash "$root/scripts/iree-env.sh" \
  cargo build -q --release -p mlxcel-cli --bins --features mlxcel-cli/iree
ireebin=$root/target/iree/release
echo "== compiling $(basename "$gguf") with --target iree-llvm-cpu --iree-context $context"
/usr/bin/time -f "mlxcel-compile: %e s, peak RSS %M KB" env MLXCEL_DEPS_DIR="$deps" \
  "$bin/mlxcel-compile" "$gguf" -o "$work/iree.mlxb" --target iree-llvm-cpu --iree-context "$context" --quiet
"$bin/mlxcel-compile" "$gguf" -o "$work/rows16.mlxb" --quiet
ls -l "$work"/*.mlxb | awk '{print $9 ": " $5 " bytes"}'

# The parameter file and the vmfb, cut out of the bundle.
"$bin/mlxcel" inspect --json --tensors "$work/iree.mlxb" > "$work/inspect.json"
"$deps/venv/bin/python" - "$work/iree.mlxb" "$work/inspect.json" "$work" <<'PY'
import json, struct, sys
bundle, listing, out = sys.argv[1:4]
info = json.load(open(listing))
dtypes = {"u32": "I32", "f32": "F32", "f16": "F16", "bf16": "BF16"}
header, offset = {}, 0
for t in info["tensors"]:
    header[t["name"]] = {"dtype": dtypes[t["dtype"]], "shape": t["shape"], "data_offsets": [offset, offset + t["length"]]}
    offset += t["length"]
text = json.dumps(header).encode()
text += b" " * (-len(text) % 8)
with open(bundle, "rb") as src, open(f"{out}/params.safetensors", "wb") as dst:
    dst.write(struct.pack("<Q", len(text)) + text)
    for t in info["tensors"]:
        src.seek(t["offset"])
        dst.write(src.read(t["length"]))
    vmfb = next(s for s in info["sections"] if s["kind"] == "iree-vmfb")
    src.seek(vmfb["offset"])
    open(f"{out}/model.vmfb", "wb").write(src.read(vmfb["length"]))
config = info["model"]["config"]
open(f"{out}/cache.txt", "w").write(f'{config["num_hidden_layers"]} {config["num_key_value_heads"]} {config["head_dim"]}\n')
PY
read -r layers kv_heads head_dim < "$work/cache.txt"
caches=()
for _ in $(seq $((2 * layers))); do caches+=("--input=1x${kv_heads}x${context}x${head_dim}xf32=0"); done
run() {
  "$bench" --device=local-task --task_topology_max_group_count="$threads" \
    --module="$work/model.vmfb" --parameters=model="$work/params.safetensors" \
    --benchmark_repetitions="$reps" --benchmark_min_warmup_time=0.5 "$@" "${caches[@]}" 2>&1 |
    awk '/_median/ {print "  " $0}'
}
echo "== IREE, $threads threads: prefill_512 (one 512-token chunk)"
run --function=prefill_512 --input=1x512xi32=1 --input=i32=0 --input=i32=511
echo "== IREE, $threads threads: decode_1 (one token at position 512)"
run --function=decode_1 --input=1x1xi32=1 --input=1xi32=512
echo "== IREE, where one decode_1 call's time goes (host-execution profile, $threads threads)"
"$deps/iree/iree/_runtime_libs/iree-run-module" --device=local-task --task_topology_max_group_count="$threads" \
  --module="$work/model.vmfb" --parameters=model="$work/params.safetensors" \
  --function=decode_1 --input=1x1xi32=1 --input=1xi32=512 "${caches[@]}" \
  --device_profiling_mode=host-execution --device_profiling_output="$work/decode.ireeprof" \
  >/dev/null 2>"$work/profile.err" || { cat "$work/profile.err" >&2; exit 1; }
"$deps/iree/iree/_runtime_libs/iree-profile" statistics "$work/decode.ireeprof" > "$work/profile.txt"
"$deps/venv/bin/python" - "$work/profile.txt" <<'PY'
import re, sys
unit = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}
groups, dealloc = {}, 0.0
def kind(name):
    if "batch_matmul" in name or "softmax" in name:
        return "attention (scores, softmax, values)"
    if "matvec" in name or "matmul" in name:
        return "products on dequantized f32 weights"
    if re.search(r"_i32xi32xf32$", name):
        return "unpacking codes to f32"
    if re.search(r"_f32xf(16|32)xf(16|32)xf32$", name):
        return "scales and biases applied"
    return "the rest (norms, RoPE, copies, ...)"
for line in open(sys.argv[1]):
    m = re.match(r"\s*host_execute (\S+)\s+count=(\d+) total=([\d.]+) (ns|us|ms|s)\b", line)
    if m:
        k = kind(m.group(1))
        groups[k] = groups.get(k, 0.0) + float(m.group(3)) * unit[m.group(4)]
    m = re.match(r"\s*host_execute_queue .* dealloca .*total=([\d.]+) (ns|us|ms|s)\b", line)
    if m:
        dealloc += float(m.group(1)) * unit[m.group(2)]
total = sum(groups.values())
for k, ms in sorted(groups.items(), key=lambda kv: -kv[1]):
    print(f"  {k:40s} {ms:8.1f} ms  {100 * ms / total:4.0f}%")
print(f"  {'dispatches in all':40s} {total:8.1f} ms")
print(f"  {'freeing the call transients':40s} {dealloc:8.1f} ms")
PY
for b in iree rows16; do
  echo "== mlxcel on MLX, $threads threads, the $b bundle"
  "$bin/mlxcel" bench "$work/$b.mlxb" -p 512 -n 128 -r "$reps" -t "$threads"
done
echo "== mlxcel --backend iree (the runtime's IREE backend, local-task), the iree bundle"
"$ireebin/mlxcel" bench "$work/iree.mlxb" -p 512 -n 128 -r "$reps" --backend iree
echo "== time to ready (mlxcel run -v, median of 5)"
for b in mlx iree; do
  for _ in 1 2 3 4 5; do
    "$ireebin/mlxcel" -t "$threads" run "$work/iree.mlxb" -p Hi -n 1 -v --backend "$b" 2>&1 >/dev/null |
      sed -n 's/.*ready in \([0-9.]*\) ms.*/\1/p'
  done | sort -n | sed -n 3p | xargs printf "  %s: ready in %s ms\n" "$b"
done
