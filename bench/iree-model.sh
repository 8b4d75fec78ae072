#!/usr/bin/env bash
# The bundle's own IREE module (mlxcel-compile --target iree-llvm-cpu) timed
# on this CPU with IREE's benchmark tool, beside `mlxcel bench` on MLX, in one
# run (issue [8]; results in docs/benchmarks.md "IREE on the CPU").
#
#   bash bench/iree-model.sh [GGUF]     # default: the package's SmolLM2 Q4_1
#   THREADS=2 CONTEXT=1024 REPS=5 bash bench/iree-model.sh
#   WORK=/tmp/w bash bench/iree-model.sh   # keeps the bundles, parameters and vmfb there
#
# Until the runtime's IREE backend exists, the module is run by
# iree-benchmark-module: its weights are the bundle's tensors, written as a
# safetensors parameter file (byte for byte, from `mlxcel inspect --json`'s
# offsets), its KV caches zeroed arguments of CONTEXT positions. Rates:
# pp512 = 512 / the time of one `prefill_512` call, tg = 1 / the time of one
# `decode_1` call (each decode step attends over all CONTEXT positions; the
# MLX figure's tg128 over the 512..640 it has).
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
[ -n "${WORK:-}" ] || trap 'rm -rf "$work"' EXIT INT TERM

cargo build -q --release -p mlxcel-cli -p mlxcel-compiler --bins
bin=$root/target/release
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
for b in iree rows16; do
  echo "== mlxcel on MLX, $threads threads, the $b bundle"
  "$bin/mlxcel" bench "$work/$b.mlxb" -p 512 -n 128 -r "$reps" -t "$threads"
done
