# Two commands do the whole set-up on a fresh machine:
#   make demo   -> creates .venv, installs, trains the digits classifier on ltc:0
#   make test   -> creates .venv, installs, runs the test suite
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch is pinned for development and tests: this machine has a local CPU wheel of 2.13.0, an
# unpinned install would pull a multi-GB CUDA build.  The package itself accepts a range.
TORCH_PIN ?= torch==2.13.0

.PHONY: setup demo test test-tiered bench conformance conformance-inductor reliability fuzz clean

$(BIN)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH_PIN)"
	$(BIN)/pip install -q -e ".[test]"
	$(BIN)/pip install -q ninja
	touch $@

# the native PrivateUse1 hooks (ltc_async/patches/native: PyTorch's DDP with find_unused_parameters
# or static_graph needs them), built again when their source changes; a machine without a C++
# compiler keeps everything else
$(BIN)/.native: $(BIN)/.installed ltc_async/patches/native/pinned_hooks.cpp
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m ltc_async.patches.native \
		|| echo "warning: ltc_async native hooks not built (see ltc_async/patches/native/__init__.py)"
	touch $@

setup: $(BIN)/.native

demo: setup
	$(BIN)/python examples/train_mlp.py

# The suite on the TorchScript backend, then the executor-level tests again on the reference
# backend (the IR interpreter): the backend seam must not change results.
test: setup
	$(BIN)/python -m pytest -q -p no:cacheprovider tests
	LTC_ASYNC_BACKEND=reference $(BIN)/python -m pytest -q -p no:cacheprovider \
		tests/test_training.py tests/test_aliasing.py tests/test_rng.py tests/test_async.py \
		tests/test_faults.py
	# the model tests' training and generate() again with tiering on (fp32, bf16, autocast;
	# Mixtral's float32 `_grouped_mm`; generate's per-token program built with symbolic sizes;
	# all models:
	# `make test-tiered`): each hot graph's Inductor program is built inline when it turns hot
	# (tests/conftest.py), so the last steps run on it
	LTC_ASYNC_TIERS=ts,inductor LTC_ASYNC_TIER_UP_AFTER=2 LTC_ASYNC_TIER_TRIAL=0 \
		LTC_ASYNC_TEST_TIER_UP_INLINE=1 $(BIN)/python -m pytest -q -p no:cacheprovider \
		tests/models/test_models.py -k "(test_training_matches_eager and (resnet or gpt2 or bert or grad_acc or bf16 or mixtral)) or generate"

# every model test with tiering on (the slice `make test` runs, and the RNNs, MobileNet, generate;
# ~15 min here: one Inductor build per hot graph)
test-tiered: setup
	LTC_ASYNC_TIERS=ts,inductor LTC_ASYNC_TIER_UP_AFTER=2 LTC_ASYNC_TIER_TRIAL=0 \
		LTC_ASYNC_TEST_TIER_UP_INLINE=1 $(BIN)/python -m pytest -q -p no:cacheprovider tests/models

bench: setup
	$(BIN)/pip install -q -e ".[bench]"   # matplotlib, for the figure
	$(BIN)/python -m benchmarks.bench_lazy --plot benchmarks/bench_lazy.png
	$(BIN)/python -m benchmarks.bench_executor
	$(BIN)/python -m benchmarks.bench_ddp
	$(BIN)/python -m benchmarks.bench_diagnostics

# The reliability suite at full length (CI runs the same tests with bounded lengths):
# fault injection over 2000 steps, then the concurrency and shutdown tests three times.
reliability: setup
	LTC_FAULT_STEPS=2000 $(BIN)/python -m pytest -q -p no:cacheprovider tests/test_faults.py
	for i in 1 2 3; do $(BIN)/python -m pytest -q -p no:cacheprovider \
		tests/test_concurrency.py tests/test_shutdown.py tests/test_loader.py || exit 1; done

# Full op_db run on ltc and on torch._lazy (tens of minutes); summary lines go to
# tests/CONFORMANCE.md, the generated op list to devices/torchscript/ops.yaml.
conformance: setup
	$(BIN)/python tests/opdb_conformance.py --backend ltc --json conformance-ltc.jsonl \
		--op-list devices/torchscript/ops.yaml | tee conformance-ltc.txt
	$(BIN)/python tests/opdb_conformance.py --backend torch_lazy --json conformance-torch_lazy.jsonl \
		| tee conformance-torch_lazy.txt

# The same op_db run with every graph compiled by Inductor (the top tier alone, synchronously:
# LTC_ASYNC_TIERS=inductor; hours here: every sample's graph is an Inductor build).
conformance-inductor: setup
	LTC_ASYNC_TIERS=inductor $(BIN)/python tests/opdb_conformance.py --backend ltc --op-timeout 900 --max-samples 2 \
		--json conformance-inductor.jsonl | tee conformance-inductor.txt

# Differential fuzzing against eager PyTorch at length (tests/test_fuzz.py; CI runs a bounded
# profile): LTC_FUZZ_EXAMPLES programs per test (LTC_FUZZ_TIERED_EXAMPLES, default 300, for the
# top-tier tests: an Inductor build or a few each), failures saved to tests/fuzz/.hypothesis.
fuzz: setup
	LTC_FUZZ_PROFILE=long $(BIN)/python -m pytest -q -p no:cacheprovider -s tests/test_fuzz.py

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
