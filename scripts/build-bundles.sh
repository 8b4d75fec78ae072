#!/usr/bin/env bash
# Builds the prebuilt bundles of bundles/catalog.toml (`make bundles`): the
# binaries, then every entry (mlxcel-compile, mlxcel verify, the smoke
# prompt: cli/examples/build_bundles.rs), then a CycloneDX SBOM of the
# binaries that built them (cargo-cyclonedx, installed by `make setup`).
#
#   scripts/build-bundles.sh [--out DIR] [--profile release|dev] [--only NAME]... [--hub] [--no-sbom]
#
# Writes DIR (default dist/): NAME.mlxb per entry, index.json, and
# sbom/*.cdx.json. Package sources come from MLXCEL_MODELS_DIR (default
# .deps/models); --hub also builds the entries whose source is a Hugging Face
# repo (they need the Hub). The same inputs give byte-identical bundles and
# index (`make bundles-repro` checks it).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
deps=${MLXCEL_DEPS_DIR:-$root/.deps}
models=${MLXCEL_MODELS_DIR:-$deps/models}
cargo=${CARGO:-cargo}
out=$root/dist
profile=release
sbom=1
pass=()
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=$2; shift 2 ;;
    --profile) profile=$2; shift 2 ;;
    --only) pass+=(--only "$2"); shift 2 ;;
    --hub) pass+=(--hub); shift ;;
    --no-sbom) sbom=0; shift ;;
    *) echo "build-bundles.sh: unknown argument $1 (see the comment at the top)" >&2; exit 2 ;;
  esac
done
case $profile in
  release) dir=release ;;
  dev) dir=debug ;;
  *) echo "build-bundles.sh: --profile must be release or dev" >&2; exit 2 ;;
esac
bin=${CARGO_TARGET_DIR:-$root/target}/$dir
say() { printf 'build-bundles: %s\n' "$*" >&2; }

say "building mlxcel, mlxcel-compile and the bundle builder ($profile)"
"$cargo" build --profile "$profile" --workspace --bins --example build_bundles

# Start from an empty folder: dist/ holds exactly what this run built.
rm -rf "$out"
mkdir -p "$out"
"$bin/examples/build_bundles" --catalog "$root/bundles/catalog.toml" --bin "$bin" \
  --models "$models" --out "$out" ${pass[@]+"${pass[@]}"}

if [ "$sbom" = 1 ]; then
  cyclonedx=$deps/cargo/bin/cargo-cyclonedx
  [ -x "$cyclonedx" ] || { say "error: $cyclonedx is missing: run \`make setup\`"; exit 1; }
  say "writing the SBOM of the binaries (CycloneDX)"
  mkdir -p "$out/sbom"
  # cargo-cyclonedx writes NAME.cdx.json beside each Cargo.toml; the two
  # packages whose binaries built the bundles are moved into dist/sbom/.
  for pkg in cli compiler; do
    (cd "$root/$pkg" && PATH="$deps/cargo/bin:$PATH" "$cargo" cyclonedx --format json --spec-version 1.5 \
      --override-filename "$pkg.cdx" --target all)
    mv "$root/$pkg/$pkg.cdx.json" "$out/sbom/mlxcel-$pkg.cdx.json"
  done
fi
say "done: $(ls "$out" | tr '\n' ' ')"
