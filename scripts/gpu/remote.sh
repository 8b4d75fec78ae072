#!/usr/bin/env bash
# Runs on the lent NVIDIA machine (docs/cuda.md).
#   remote.sh stash DIR...  copy the files of the carried DIRs to /root/stash
#                           (calls within the machine's 30 s warm window add up)
#   remote.sh env           (source it) unpack the CUDA MLX tarball to /root/mlx-cuda
#                           once, join any split model (NAME.00, NAME.01, ... in
#                           /root/stash become /root/models/NAME.gguf), and export
#                           LD_LIBRARY_PATH, CUDA_HOME, MLXCEL_DEVICE=gpu, MLXCEL_CUDA_SITE
set -euo pipefail
case "${1:-}" in
  stash)
    shift
    mkdir -p /root/stash
    for d in "$@"; do cp "$d"/* /root/stash/; done
    ls -la /root/stash
    ;;
  env)
    stash=/root/stash
    if [ ! -f /root/mlx-cuda/mlx/lib/libmlx.so ]; then
      mkdir -p /root/mlx-cuda
      p2=$stash/mlx-cuda.tar.xz.01
      [ -f "$p2" ] || p2=.gpu/p2/mlx-cuda.tar.xz.01
      cat "$stash/mlx-cuda.tar.xz.00" "$p2" | xz -d | tar -C /root/mlx-cuda -xf -
    fi
    mkdir -p /root/models
    for first in "$stash"/*.00 .gpu/*/*.00; do
      [ -f "$first" ] || continue
      name=$(basename "$first" .00)
      case "$name" in mlx-cuda.tar.xz) continue ;; esac
      [ -f "/root/models/$name.gguf" ] && continue
      parts=()
      for i in $(seq -f %02g 0 99); do
        p=$stash/$name.$i
        [ -f "$p" ] || p=$(ls .gpu/*/"$name.$i" 2>/dev/null | head -1 || true)
        [ -n "$p" ] && [ -f "$p" ] || break
        parts+=("$p")
      done
      cat "${parts[@]}" >"/root/models/$name.gguf"
    done
    site=$(python3 -c 'import nvidia,os;print(os.path.dirname(list(nvidia.__path__)[0]))')
    LD_LIBRARY_PATH=$(ls -d "$site"/nvidia/*/lib | paste -sd:):/root/mlx-cuda/mlx/lib
    export LD_LIBRARY_PATH
    export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
    export MLXCEL_DEVICE=gpu
    # NVRTC and the CUDA headers for tests that compile mlxcel's kernels (gpu_products).
    export MLXCEL_CUDA_SITE=$site
    export MLX_PTX_CACHE_DIR=/root/ptx-cache
    ;;
  *)
    echo "usage: remote.sh stash DIR... | env" >&2
    exit 2
    ;;
esac
