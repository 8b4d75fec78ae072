#!/usr/bin/env bash
# Prepares .gpu/ for a run on the lent NVIDIA machine (docs/cuda.md):
#   .gpu/p1/, .gpu/p2/  the CUDA MLX tree (.deps/mlx-cuda-13: mlx/ with its
#                       CCCL/CUTLASS headers, and mlx_cuda_13.libs/) as an xz
#                       tarball split in two, each under the 64 MiB a call carries;
#   .gpu/bin/           the binaries given as arguments, stripped;
#   .gpu/src/           what bench/gpu.sh builds and installs there: llama.cpp's
#                       source (llama-cpp-python 0.3.36's vendored copy, the
#                       folders a CUDA build of llama-bench needs, ~8 MB of xz)
#                       and the wheels of MLX's Python bindings and mlx-lm for
#                       the machine's Python 3.12.
# The tarballs are made once and reused while their sources are unchanged.
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
mkdir -p "$out/src"
llama=$root/.deps/llama.cpp-0.3.36/src/vendor/llama.cpp
if [ ! -f "$out/src/llama-src.tar.xz" ]; then
  [ -f "$llama/CMakeLists.txt" ] || { echo "pack: $llama is missing: run bench/cpu.sh (bench/llama_cpp.sh unpacks it)" >&2; exit 1; }
  echo "pack: llama.cpp's source for the CUDA build" >&2
  tar -C "$llama" -cf - CMakeLists.txt cmake common ggml include src tools vendor licenses examples pocs app |
    xz -6 -T0 >"$out/src/llama-src.tar.xz.part"
  mv "$out/src/llama-src.tar.xz.part" "$out/src/llama-src.tar.xz"
fi
if ! ls "$out"/src/mlx-0.32.4-cp312-*.whl "$out"/src/mlx_lm-0.32.2-*.whl >/dev/null 2>&1; then
  "$root/.deps/venv/bin/pip" download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_35_x86_64 mlx==0.32.4 mlx-lm==0.32.2 -d "$out/src"
fi
du -sh "$out"/p1 "$out"/p2 "$out"/bin "$out"/src >&2
