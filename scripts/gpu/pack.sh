#!/usr/bin/env bash
# Prepares .gpu/ for a run on the lent NVIDIA machine (docs/cuda.md):
#   .gpu/p1/, .gpu/p2/  the CUDA MLX tree (.deps/mlx-cuda-13: mlx/ with its
#                       CCCL/CUTLASS headers, and mlx_cuda_13.libs/) as an xz
#                       tarball split in two, each under the 64 MiB a call carries;
#   .gpu/bin/           the binaries given as arguments, stripped.
# The tarball is made once and reused while .deps/mlx-cuda-13 is unchanged.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cuda=$root/.deps/mlx-cuda-13
out=$root/.gpu
[ -f "$cuda/mlx/lib/libmlx.so" ] || { echo "pack: $cuda is missing: run make setup-cuda" >&2; exit 1; }
mkdir -p "$out/p1" "$out/p2" "$out/bin"
stamp=$(cat "$root/.deps/stamps/mlx-cuda-13")
if [ "$(cat "$out/stamp" 2>/dev/null)" != "$stamp" ]; then
  echo "pack: compressing the CUDA MLX tree (xz -9e, a few minutes)" >&2
  tar -C "$cuda" -cf - mlx mlx_cuda_13.libs | xz -9e -T0 >"$out/mlx-cuda.tar.xz"
  rm -f "$out"/p1/* "$out"/p2/*
  split -n 2 -d "$out/mlx-cuda.tar.xz" "$out/part."
  mv "$out/part.00" "$out/p1/mlx-cuda.tar.xz.00"
  mv "$out/part.01" "$out/p2/mlx-cuda.tar.xz.01"
  rm -f "$out/mlx-cuda.tar.xz"
  echo "$stamp" >"$out/stamp"
fi
rm -f "$out"/bin/*
for b in "$@"; do
  strip -o "$out/bin/$(basename "$b" | sed 's/-[0-9a-f]\{16\}$//')" "$b"
done
du -sh "$out"/p1 "$out"/p2 "$out"/bin >&2
