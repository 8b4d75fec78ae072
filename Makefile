# The two commands of the README: `make demo` (the main job) and `make test`
# (the whole suite). Both install what they need first (`make setup`).

CARGO ?= cargo
export MLXCEL_DEPS_DIR ?= $(CURDIR)/.deps

.PHONY: setup setup-cuda build demo test fmt fmt-check clippy unit

## Install the pinned MLX wheel, the Debian packages and the model packages into .deps/.
setup:
	@bash scripts/setup.sh

## Also install MLX's CUDA wheel into .deps/mlx-cuda-13 (for `--features cuda`; docs/cuda.md).
setup-cuda:
	@MLXCEL_SETUP_CUDA=1 bash scripts/setup.sh

## Build every binary (release).
build: setup
	$(CARGO) build --release --workspace

## The main job: compile the real SmolLM2 into a bundle and generate text from it.
demo: build
	@bash scripts/demo.sh

## The whole suite: format check, clippy with -D warnings, every test of the workspace.
test: setup fmt-check clippy unit

fmt-check:
	$(CARGO) fmt --all -- --check

clippy:
	$(CARGO) clippy --workspace --all-targets -- -D warnings

unit:
	$(CARGO) test --workspace --no-fail-fast

fmt:
	$(CARGO) fmt --all
