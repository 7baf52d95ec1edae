# make test  : set everything up in .venv, build the extension, run the quick tier of the tests
#              (every test function, a parametrized one on a sample in which each value of each
#              parameter appears: tests/conftest.py, docs/development.md)
# make test-pairs : the pairs tier (make test grown until every pair of values of any two
#                   parameters of a test runs together); CI runs make test, then this
# make test-isas : the numerics tests' quick tier on the other instruction sets (CI runs it)
# make test-exhaustive : the whole cross product, the soaks, and the numerics' whole matrix on the
#                        other instruction sets (not in CI)
# make ci-local : a contributor's check of a change before submitting it, in about 10 minutes:
#                 the quick tier, the changed files' mutants and sanitizer tests (tools/ci_local.sh)
# make bench : set everything up in .venv, build the extension, run the benchmark suite
# make docs  : set everything up in .venv, build the extension and the documentation (HTML in
#              docs/_build/html; Sphinx, warnings as errors)
# make sanitize : the CPU kernels and the CUDA kernels on the emulator under ASan + UBSan, over the
#                 numerics tests (tools/sanitize.sh)
# make gpu-check : on a machine with an NVIDIA GPU and its own torch: build for that GPU, run the
#                  CUDA tests, the rest of the suite and the CUDA benchmarks (tools/gpu_check.py)
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.14.1
PY := $(VENV)/bin/python
STAMP := $(VENV)/.fused_amp-deps

GPU_PYTHON ?= python3

.PHONY: test test-pairs test-isas test-exhaustive bench build deps clean gpu-check sanitize docs ci-local ci-mark

# torchtitan goes into a folder of its own, without its dependencies (requirements-torchtitan.txt).
# The emulation's libraries that make test loads (tests/cuda_sim/build.py, any Python) compile
# meanwhile on the core pip leaves idle, at the lowest priority; a test that needs one still
# being compiled waits for it, and builds one that failed here. (A fresh make test on an AMD
# EPYC: 11:17 with its pytest 377 s when the pytest compiled them, 10:38 and 325 s when pip's
# install did; one run each.)
$(STAMP): requirements-dev.txt requirements-torchtitan.txt
	nice -n 19 python3 tests/cuda_sim/build.py > emulation-prebuild.log 2>&1 &
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip setuptools wheel
	$(PY) -m pip install "$(TORCH_SPEC)" -r requirements-dev.txt
	rm -rf $(VENV)/torchtitan
	$(PY) -m pip install --no-deps --target $(VENV)/torchtitan -r requirements-torchtitan.txt
	touch $(STAMP)

deps: $(STAMP)

# The extension is rebuilt only when a source, the build script or a variable the build reads
# changed since the last build that succeeded (a second make test/docs/bench starts at once).
BUILT := $(VENV)/.fused_amp-built
BUILD_ENV := $(VENV)/.fused_amp-build-env
BUILD_INPUTS := $(shell find csrc -type f) setup.py pyproject.toml
BUILD_VARS := FUSED_AMP_CUDA=$(FUSED_AMP_CUDA) FUSED_AMP_CPU_KERNELS=$(FUSED_AMP_CPU_KERNELS) \
              TORCH_CUDA_ARCH_LIST=$(TORCH_CUDA_ARCH_LIST) CUDA_HOME=$(CUDA_HOME) CUDA_PATH=$(CUDA_PATH)
# (rewritten only when the variables differ from the last run's, so that its time says when)
$(shell mkdir -p $(VENV); echo '$(BUILD_VARS)' | cmp -s - $(BUILD_ENV) || echo '$(BUILD_VARS)' > $(BUILD_ENV))

$(BUILT): $(STAMP) $(BUILD_INPUTS) $(BUILD_ENV)
	MAX_JOBS=$${MAX_JOBS:-$$(nproc)} $(PY) -m pip install --no-build-isolation --no-deps -v -e . > build.log 2>&1 \
		|| (grep -E -A5 "error|Error" build.log | tail -80; echo "build failed: see build.log"; exit 1)
	@echo "compiled:" $$(grep -oE "csrc/[a-z0-9_/]+\.(cpp|cu) -o" build.log | sed 's/ -o//' | sort -u)
	touch $(BUILT)

build: $(BUILT)
	$(PY) -c "import fused_amp; print('fused_amp.build_info():', fused_amp.build_info())"

# pytest's workers (pytest-xdist): one per core, each running one OpenMP thread (two teams of
# two threads on two cores wait on each other's barriers). TEST_JOBS=1: one pytest process.
TEST_JOBS ?= $(shell nproc)
# PYTEST_ARGS: more pytest options (CI: --durations=20, the slowest tests of each run)
PYTEST = $(if $(filter 1,$(TEST_JOBS)),$(PY) -m pytest -q,OMP_NUM_THREADS=1 $(PY) -m pytest -q -n $(TEST_JOBS) --dist worksteal) $(PYTEST_ARGS)

test: build
	FUSED_AMP_TEST_TIER=quick $(PYTEST) tests

# The CPU kernels exist once per instruction set (ATEN_CPU_CAPABILITY picks torch's and ours
# alike). The instruction set is a dimension of the matrix too: the numerics tests run on each
# one below this CPU's own, on a tier (quick: each value of every other dimension appears with
# it, so every pair with the instruction set does). This CPU's own runs in the tiers themselves,
# as do the tests that start a process per instruction set themselves (38 s, which each run
# here would repeat).
NUMERICS_TESTS := tests/test_unscale.py tests/test_optim.py tests/test_clip.py tests/test_memory_modes.py \
                  tests/test_weight_amax.py tests/test_delayed_scaling.py tests/test_float8_weights.py \
                  tests/test_mx_weights.py tests/test_quantized_state.py tests/test_master24.py
define other_isas
	native=$$($(PY) -c "import torch; print(torch.backends.cpu.get_cpu_capability().lower())"); \
	for isa in default avx2; do \
		if [ $$isa = $$native ]; then echo "numerics on $$isa: this CPU's own, which the tiers run"; continue; fi; \
		ATEN_CPU_CAPABILITY=$$isa FUSED_AMP_TEST_TIER=$(1) $(PYTEST) $(NUMERICS_TESTS) \
			-k "not on_every_instruction_set" || exit 1; \
	done
endef

test-pairs: build
	FUSED_AMP_TEST_TIER=pairs $(PYTEST) tests

test-isas: build
	$(call other_isas,quick)

test-exhaustive: test
	FUSED_AMP_TEST_TIER=pairs $(PYTEST) tests
	FUSED_AMP_TEST_TIER=rest $(PYTEST) tests
	FUSED_AMP_TEST_TIER=soak $(PYTEST) tests
	$(call other_isas,full)

# the outside references of the memory suite's convergence runs are optional
bench: build
	$(PY) -m pip install -r requirements-bench.txt || echo "optional benchmark dependencies not installed: their rows are skipped"
	$(PY) -m fused_amp.benchmark $(BENCH_ARGS)

# autodoc imports the built package; the generator comes from requirements-docs.txt
docs: build
	$(PY) -m pip install -r requirements-docs.txt
	$(PY) -m sphinx -W --keep-going -b html docs docs/_build/html

# The CPU kernels and the CUDA kernels on the emulator under AddressSanitizer + UndefinedBehaviorSanitizer
# (tools/sanitize.sh: a separate build in build-sanitize/), over the numerics, property, bad-input,
# emulator and emulation tests.
SANITIZE_TESTS ?= tests/test_unscale.py tests/test_bad_input.py tests/test_properties.py \
                  tests/test_cuda_sim.py tests/test_cuda_emulator.py tests/test_optim.py tests/test_clip.py tests/test_memory_modes.py \
                  tests/test_quantized_state.py tests/test_master24.py tests/test_lion.py \
                  tests/test_checkpoint_fuzz.py tests/test_peer_checks.py tests/test_py_lists.py \
                  tests/test_weight_amax.py tests/test_delayed_scaling.py tests/test_float8_weights.py \
                  tests/test_mx_weights.py

sanitize: $(STAMP)
	PY=$(abspath $(PY)) tools/sanitize.sh $(SANITIZE_TESTS) $(PYTEST_ARGS)

# before submitting: the marker (once per submission), then the local check of CI (tools/ci_local.sh)
ci-mark:
	python3 tools/ci_select.py mark $(COMMIT)

ci-local:
	tools/ci_local.sh

# No venv: the GPU machine's own interpreter and torch; results in $$FUSED_AMP_GPU_OUT.
gpu-check:
	$(GPU_PYTHON) tools/gpu_check.py $(GPU_CHECK_ARGS)

clean:
	rm -rf build build-sanitize docs/_build *.egg-info fused_amp/_C*.so $(BUILT)
