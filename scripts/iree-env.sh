#!/usr/bin/env bash
# Runs a command with the environment the `iree` cargo feature's build needs:
# eerie-sys compiles IREE's runtime with CMake >= 3.26 and generates its Rust
# bindings with bindgen, which loads libclang; both come from .deps/iree-build
# (`make setup`, deps/iree-build.txt). bindgen parses with that libclang but
# this system's C headers, whose compiler-private part (stddef.h, ...) is the
# system compiler's.
#   bash scripts/iree-env.sh cargo build --release --features iree -p mlxcel-cli
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
deps=${MLXCEL_DEPS_DIR:-$root/.deps}
build=$deps/iree-build
if [ ! -x "$build/cmake/data/bin/cmake" ] || [ ! -f "$build/clang/native/libclang.so" ]; then
  echo "iree-env: CMake and libclang are not in $build: run \`make setup\`" >&2
  exit 1
fi
export PATH="$build/cmake/data/bin:$PATH"
export LIBCLANG_PATH="$build/clang/native"
cc_include=$(${CC:-cc} -print-file-name=include)
export BINDGEN_EXTRA_CLANG_ARGS="${BINDGEN_EXTRA_CLANG_ARGS:-} -I$cc_include"
exec "$@"
