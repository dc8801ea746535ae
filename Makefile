# Two commands on a fresh machine: `make demo` and `make test`. Each builds what it needs.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: demo test lint typecheck bench-overhead fuzz clean venv

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch is pinned; pip finds the CPU build of this exact version locally.
	$(BIN)/pip install --quiet 'torch==2.13.0'
	$(BIN)/pip install --quiet -e '.[torch,onnx,redis,dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/parityserve demo

test: $(STAMP)
	$(BIN)/ruff check parityserve tests
	$(BIN)/mypy parityserve
	# A private Redis (127.0.0.1:6390, or $$PARITYSERVE_REDIS_PORT) for the shared-state tests;
	# it is stopped again whether or not the tests pass.
	scripts/redis.sh ensure && scripts/redis.sh start
	status=0; PARITYSERVE_REDIS_URL="$$(scripts/redis.sh url)" $(BIN)/pytest $(PYTEST_ARGS) \
	  || status=$$?; scripts/redis.sh stop; exit $$status

lint: $(STAMP)
	$(BIN)/ruff check parityserve tests

typecheck: $(STAMP)
	$(BIN)/mypy parityserve

bench-overhead: $(STAMP)
	$(BIN)/parityserve bench overhead

# A long schemathesis pass over every route of a live zoo:noop server (>= 10,000 requests);
# counts per operation, failures and the command go to benchmarks/results/fuzz/. An interrupted
# run resumes where it stopped. Routes without parameters yield only a case or two each.
FUZZ_EXAMPLES ?= 650
fuzz: $(STAMP)
	$(BIN)/python tests/integration/fuzz_api.py --examples $(FUZZ_EXAMPLES) --out benchmarks/results/fuzz

clean:
	rm -rf $(VENV) .cache .pytest_cache .mypy_cache .ruff_cache
