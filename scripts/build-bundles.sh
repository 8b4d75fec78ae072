#!/usr/bin/env bash
# Builds the prebuilt bundles of bundles/catalog.toml (`make bundles`): the
# binaries, then every entry (mlxcel-compile, mlxcel verify, the smoke
# prompt: cli/examples/build_bundles.rs), then CycloneDX SBOMs of the
# binaries that built them (cargo-cyclonedx: `make bundles` installs it).
#
#   scripts/build-bundles.sh [--out DIR] [--profile release|dev] [--only NAME]... [--hub] [--no-sbom]
#
# Writes DIR (default dist/): NAME.mlxb per entry, index.json, and
# sbom/BINARY_bin.cdx.json (these are not byte-reproducible: cargo-cyclonedx
# stamps a time, a random serial number and the checkout's path). Package
# sources come from MLXCEL_MODELS_DIR (default .deps/models); --hub also builds the entries whose source is a Hugging Face
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
  [ -x "$cyclonedx" ] || { say "error: $cyclonedx is missing: run \`MLXCEL_SETUP_BUNDLES=1 make setup\` (make bundles does)"; exit 1; }
  say "writing the SBOMs of the binaries (CycloneDX 1.5)"
  mkdir -p "$out/sbom"
  # One SBOM per binary of the workspace (mlxcel, mlxcel-server,
  # mlxcel-compile: the crates each is built from), for this host's target.
  # cargo-cyclonedx writes BIN_bin.cdx.json beside each Cargo.toml; they are
  # moved into the output folder.
  (cd "$root" && PATH="$deps/cargo/bin:$PATH" "$cargo" cyclonedx --format json --spec-version 1.5 \
    --describe binaries -q)
  find "$root" -path "$root/target" -prune -o -path "$out" -prune -o -name '*_bin.cdx.json' -print0 \
    | xargs -0 -r mv -t "$out/sbom/"
  [ -n "$(ls "$out/sbom")" ] || { say "error: cargo-cyclonedx wrote no SBOM"; exit 1; }
fi
say "done: $(ls "$out" | tr '\n' ' ')"
