#!/usr/bin/env bash
# The first request's time to first token on a fresh mlxcel-server, with the
# warm-up (the default) and with --no-warmup (docs/server.md "Start-up").
# Run on the lent NVIDIA machine after `source scripts/gpu/remote.sh env`
# (or anywhere with MLXCEL_DEVICE=cpu and BIN=target/release):
#
#   bash scripts/gpu/server_warmup.sh BUNDLE [WORDS]
#
# Each case, three times, alternating: start the server on the GPU (kernels
# from the bundle), time from process start to /health 200, then one
# streamed completion of a raw prompt of WORDS words (default 100: over the
# 32 rows mlxcel's kernels take), 4 tokens, and the time from sending it to
# its first token; then a second request the same way.
set -uo pipefail
bundle=${1:?usage: server_warmup.sh BUNDLE [WORDS]}
words=${2:-100}
bin=${BIN:-.gpu/bin}
cache=$(mktemp -d /tmp/warmup.XXXX)
unset MLX_PTX_CACHE_DIR
python3 - "$bin/mlxcel-server" "$bundle" "$cache" "$words" <<'EOF'
import json, subprocess, sys, time, urllib.request

server, bundle, cache, words = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
port = 18080

def first_token_ms(prompt):
    body = json.dumps({"prompt": prompt, "max_tokens": 4, "temperature": 0, "stream": True}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body, {"content-type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req) as r:
        for line in r:
            if line.startswith(b"data: {"):
                return (time.perf_counter() - t0) * 1e3
    raise SystemExit("no token")

def case(flags):
    t0 = time.perf_counter()
    p = subprocess.Popen([server, "--bundle", bundle, "--port", str(port), "--gpu-kernels", "refuse",
                          "--gpu-kernel-cache", cache, *flags], stderr=subprocess.PIPE, text=True)
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health") as r:
                if r.status == 200:
                    break
        except Exception:
            pass
        if p.poll() is not None:
            raise SystemExit(p.stderr.read())
        time.sleep(0.005)
    healthy = (time.perf_counter() - t0) * 1e3
    prompt = " ".join(["the"] * words)
    first = first_token_ms(prompt)
    second = first_token_ms(prompt + " again")
    p.terminate()
    log = p.communicate(timeout=30)[1]
    loaded = next((l for l in log.splitlines() if "model loaded" in l), "")
    warm = loaded.split("warm_up_ms=")[1].split()[0] if "warm_up_ms=" in loaded else "?"
    print(f"{' '.join(flags) or 'warm-up':12s} healthy after {healthy:7.1f} ms (warm-up {warm} ms) | "
          f"first request's first token {first:6.1f} ms | second {second:6.1f} ms", flush=True)

print(f"== {bundle}, {words} words, fresh server processes")
for _ in range(3):
    case([])
    case(["--no-warmup"])
EOF
rm -rf "$cache"
