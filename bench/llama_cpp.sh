#!/usr/bin/env bash
# llama.cpp, built from the llama-cpp-python==0.3.36 source package (it vendors
# llama.cpp), for the benchmarks that compare against it (bench/cpu.sh,
# bench/server.sh). Sourced, it defines:
#
#   llama_cpp_build TARGET...   build these CMake targets (llama-bench,
#                               llama-server, llama-quantize, ...) into
#                               $llama_bin unless they are there already
#   llama_dir, llama_bin        .deps/llama.cpp-0.3.36 and its build/bin
#
# Run directly, it builds the targets named on its command line:
#
#   bash bench/llama_cpp.sh llama-server llama-bench llama-quantize
#
# The build takes ~5 min on 2 cores; its logs are $llama_dir/cmake.log and
# build.log. cmake and ninja come from PyPI (pinned) in .deps/build-tools; the
# sdist is fetched directly and checked against its published sha256. The
# server's web UI is neither downloaded nor built (no network at build time).
# A lock file serialises builds started by several scripts at once.

_llama_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
llama_version=0.3.36
llama_url=https://files.pythonhosted.org/packages/ec/e9/e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/llama_cpp_python-0.3.36.tar.gz
llama_sha256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
llama_dir=${MLXCEL_DEPS_DIR:-$_llama_root/.deps}/llama.cpp-$llama_version
llama_bin=$llama_dir/build/bin

# The CPU's own instruction sets, as a native build would pick them, except
# AMX: llama.cpp 0.3.36 built with AMX stops with SIGILL at its first tile
# load (tileloadd in ggml_backend_amx_mul_mat, gdb, 2026-12-03) on a Xeon
# whose kernel grants the tiles (mlxcel's AMX kernels run there), and a
# hypervisor that does not grant them hides the flags anyway.
_llama_isa_flags() {
  [ "$(uname -m)" = x86_64 ] || return 0
  local flags
  flags=$(grep -m1 '^flags' /proc/cpuinfo)
  has() { [[ " $flags " == *" $1 "* ]] && echo ON || echo OFF; }
  echo -DGGML_NATIVE=OFF -DGGML_AVX="$(has avx)" -DGGML_AVX2="$(has avx2)" -DGGML_FMA="$(has fma)" \
    -DGGML_F16C="$(has f16c)" -DGGML_BMI2="$(has bmi2)" -DGGML_AVX512="$(has avx512f)" \
    -DGGML_AVX512_VBMI="$(has avx512vbmi)" -DGGML_AVX512_VNNI="$(has avx512_vnni)" \
    -DGGML_AVX512_BF16="$(has avx512_bf16)" -DGGML_AVX_VNNI="$(has avx_vnni)" -DGGML_AMX_TILE=OFF \
    -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
}

llama_cpp_build() (
  set -euo pipefail
  local missing=() t isa=()
  read -r -a isa <<<"$(_llama_isa_flags)"
  # A build made for other instruction sets (another machine's, or one made
  # before this record existed) is rebuilt whole.
  local stale=0
  [ -d "$llama_dir/build" ] && [ "$(cat "$llama_dir/build/mlxcel-isa.txt" 2>/dev/null)" != "${isa[*]}" ] && stale=1
  for t in "$@"; do
    [ $stale = 0 ] && [ -x "$llama_bin/$t" ] || missing+=("$t")
  done
  [ ${#missing[@]} -gt 0 ] || return 0
  mkdir -p "$llama_dir"
  exec 9>"$llama_dir/.lock"
  flock 9
  if [ $stale = 1 ]; then
    echo "llama.cpp in $llama_dir/build was built for other instruction sets: rebuilding" >&2
    rm -rf "$llama_dir/build"
  fi
  echo "building llama.cpp $llama_version (vendored by llama-cpp-python): ${missing[*]} in $llama_dir" >&2
  # cmake and ninja from PyPI, pinned, in a project-local virtual environment.
  local tools=$_llama_root/.deps/build-tools
  if [ ! -x "$tools/bin/cmake" ] || [ ! -x "$tools/bin/ninja" ]; then
    python3 -m venv "$tools"
    "$tools/bin/python" -m pip install --quiet --only-binary=:all: cmake==3.31.10 ninja==1.13.2
  fi
  # pip download would build the package's metadata (minutes); the sdist is
  # fetched directly and checked against its published sha256.
  local tarball=$llama_dir/llama_cpp_python-$llama_version.tar.gz
  if ! echo "$llama_sha256  $tarball" | sha256sum -c --quiet - >/dev/null 2>&1; then
    curl -fsSL --retry 3 -o "$tarball.part" "$llama_url"
    echo "$llama_sha256  $tarball.part" | sha256sum -c --quiet -
    mv "$tarball.part" "$tarball"
  fi
  if [ ! -f "$llama_dir/src/vendor/llama.cpp/CMakeLists.txt" ]; then
    rm -rf "$llama_dir/src"
    mkdir -p "$llama_dir/src"
    tar -xzf "$tarball" -C "$llama_dir/src" --strip-components=1
  fi
  # The server is configured in (it is only built when asked for); its web UI
  # is neither built with npm nor downloaded from Hugging Face.
  PATH=$tools/bin:$PATH cmake -S "$llama_dir/src/vendor/llama.cpp" -B "$llama_dir/build" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DGGML_CCACHE=OFF "${isa[@]}" >"$llama_dir/cmake.log" 2>&1 ||
    { tail -30 "$llama_dir/cmake.log" >&2; echo "llama_cpp.sh: cmake failed (log: $llama_dir/cmake.log)" >&2; exit 1; }
  PATH=$tools/bin:$PATH cmake --build "$llama_dir/build" --target "${missing[@]}" -j "$(nproc)" \
    >"$llama_dir/build.log" 2>&1 ||
    { tail -30 "$llama_dir/build.log" >&2; echo "llama_cpp.sh: build failed (log: $llama_dir/build.log)" >&2; exit 1; }
  for t in "${missing[@]}"; do
    [ -x "$llama_bin/$t" ] || { echo "llama_cpp.sh: $t was not built into $llama_bin" >&2; exit 1; }
  done
  echo "${isa[*]}" >"$llama_dir/build/mlxcel-isa.txt"
)

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  [ $# -gt 0 ] || { sed -n '2,19p' "$0" >&2; exit 2; }
  llama_cpp_build "$@"
fi
