#!/usr/bin/env bash
# Runs on the lent NVIDIA machine (docs/cuda.md).
#   remote.sh stash        keep part 1 of the CUDA MLX tarball in /root/stash
#   remote.sh env          (source it) unpack the tarball to /root/mlx-cuda once,
#                          and export LD_LIBRARY_PATH, CUDA_HOME, MLXCEL_DEVICE=gpu
set -euo pipefail
case "${1:-}" in
  stash)
    mkdir -p /root/stash
    cp .gpu/p1/mlx-cuda.tar.xz.00 /root/stash/
    ls -la /root/stash
    ;;
  env)
    if [ ! -f /root/mlx-cuda/mlx/lib/libmlx.so ]; then
      mkdir -p /root/mlx-cuda
      cat /root/stash/mlx-cuda.tar.xz.00 .gpu/p2/mlx-cuda.tar.xz.01 | xz -d | tar -C /root/mlx-cuda -xf -
    fi
    site=$(python3 -c 'import nvidia,os;print(os.path.dirname(list(nvidia.__path__)[0]))')
    LD_LIBRARY_PATH=$(ls -d "$site"/nvidia/*/lib | paste -sd:):/root/mlx-cuda/mlx/lib
    export LD_LIBRARY_PATH
    export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
    export MLXCEL_DEVICE=gpu
    export MLX_PTX_CACHE_DIR=/root/ptx-cache
    ;;
  *)
    echo "usage: remote.sh stash|env" >&2
    exit 2
    ;;
esac
