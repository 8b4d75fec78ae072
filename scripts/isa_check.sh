#!/usr/bin/env bash
# The AArch64 NEON kernels on any machine (`make isa-check`, part of `make
# test`): builds mlx-kernels/cpp/tests/isa_check.cc with the kernels (no MLX)
# for AArch64 — cross-compiled and run under qemu-user on x86-64 (both from
# `make setup`'s Debian packages), natively on an AArch64 host — and checks the
# neon and scalar builds against f64 references and each other.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=$root/target/isa-check
mkdir -p "$out/include"
# The kernels include each other as "mlxcel-mlx/cpp/kernels/..." (the path
# cxx-build gives the crate): the same name, pointing at the crate.
ln -sfn "$root/mlx-kernels" "$out/include/mlxcel-mlx"

case "$(uname -m)" in
  aarch64 | arm64) cxx=(g++); run=() ;;
  *) cxx=(aarch64-linux-gnu-g++ -static); run=(qemu-aarch64) ;;
esac
command -v "${cxx[0]}" >/dev/null || { echo "isa-check: ${cxx[0]} missing (run make setup)" >&2; exit 1; }
[ ${#run[@]} -eq 0 ] || command -v "${run[0]}" >/dev/null || { echo "isa-check: ${run[0]} missing (run make setup)" >&2; exit 1; }

kernels=$root/mlx-kernels/cpp/kernels
sources=("$root/mlx-kernels/cpp/tests/isa_check.cc" "$kernels"/pool.cc "$kernels"/dispatch.cc "$kernels"/mlx_math.cc "$kernels"/isa_*.cc)
# The flags build.rs compiles the kernels with.
"${cxx[@]}" -std=c++20 -O2 -ffp-contract=off -pthread -I"$out/include" -o "$out/isa_check_arm64" "${sources[@]}"
for isa in neon scalar; do
  "${run[@]}" "$out/isa_check_arm64" "$isa"
done
