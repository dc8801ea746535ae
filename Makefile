# Two commands on a fresh machine: `make demo` and `make test`. Each builds what it needs.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
BENCH_STAMP := $(VENV)/.bench-installed
PYTEST_ARGS ?= --durations=30
# make test runs three pytest-xdist workers on the two cores: one test file per worker at a time
# and in file order (module-scoped servers start once; a file's tests may follow one another),
# the files in collection order (the long integration files first, the thousands of short unit
# tests last, filling the gaps). Three, not two: with two, a quarter of the CPU sat idle while
# both workers waited on servers, sleeps of slowed replicas and process starts (sampled from
# /proc/stat every 5 s: 25% idle with -n 2, 9% with -n 3); pytest went 441 -> 373 s on a
# warm venv, and beside a CPU hog a fresh clone's took 8:27 (it took 9:56-10:58 with -n 2).
# XDIST= runs serially.
XDIST ?= -n 3 --dist loadfile --no-loadscope-reorder
# flags for a bench target, e.g. make bench-tail ARGS='--part codec'
ARGS ?=

.PHONY: demo test lint typecheck deadcode bench-overhead bench-tail bench-accuracy bench-selection \
	bench-simulate bench-frontend_wrk bench-parm_testbed bench-parm_calibration bench-serf bench-serf_noise \
	bench-parity_curve bench-berrut_group_wait bench-ray_cluster bench-hams bench-cold_start \
	bench-observability_run bench-hams_nodes \
	check-plain-install test-observability \
	fuzz soak mutate docs clean venv

venv: $(STAMP)

# pip byte-compiles what it installs, and that stays: skipping it (--no-compile) saved 32 s
# of install here, but where PYTHONDONTWRITEBYTECODE is set (it is on this machine and in
# CI) nothing compiled on import is ever kept, so every worker process compiled torch again
# and make test's pytest went from 8.6 to 12 minutes.
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
	$(BIN)/ruff check parityserve tests benchmarks
	# A private Redis (127.0.0.1:6390, or $$PARITYSERVE_REDIS_PORT) for the shared-state tests;
	# it is stopped again whether or not the tests pass.
	scripts/redis.sh ensure && scripts/redis.sh start
	# mypy runs beside the tests (about 30 s of one core on a fresh clone, which the suite's
	# waits for servers mostly hide); its verdict counts all the same, printed after the
	# tests. `make typecheck` alone is the quick way to see it.
	# The local Ray clusters (marker ray_cluster: four raylets, their GCS and a graph's
	# actors) run after the rest, alone: beside the other workers they left a runnable graph
	# member without a core for 2 s (a clean-clone make test: a bare graph's primary timed out
	# and lost its stream state). pytest's exit 5 there is "none selected" (PYTEST_ARGS chose
	# other tests).
	mkdir -p .cache; $(BIN)/mypy parityserve >.cache/mypy.txt 2>&1 & mypy=$$!; \
	status=0; export PARITYSERVE_REDIS_URL="$$(scripts/redis.sh url)"; \
	$(BIN)/pytest $(XDIST) -m "not ray_cluster" $(PYTEST_ARGS) || status=$$?; \
	$(BIN)/pytest -m ray_cluster $(PYTEST_ARGS) || { rc=$$?; [ $$rc -eq 5 ] || status=$$rc; }; \
	scripts/redis.sh stop; \
	if wait $$mypy; then tail -n 1 .cache/mypy.txt; else cat .cache/mypy.txt; status=1; fi; \
	exit $$status

# The dashboard's and the rules' PromQL through a real Prometheus (Debian's package, which
# scripts/prometheus.sh installs) scraping a real server, promtool check rules, and
# `parityserve top` against a real server, and docs/metrics.md against the registry. .ci/run runs
# it after the tests.
test-observability: $(STAMP)
	scripts/prometheus.sh ensure
	$(BIN)/pytest $(PYTEST_ARGS) tests/unit/deploy/test_dashboard.py tests/unit/deploy/test_metrics_page.py \
	  tests/unit/test_top_view.py \
	  tests/integration/test_observability.py tests/e2e/test_top_cli.py

lint: $(STAMP)
	$(BIN)/ruff check parityserve tests benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy parityserve

# Unused code, found by vulture (names frameworks call are listed in the whitelist, with why).
deadcode: $(STAMP)
	$(BIN)/vulture parityserve benchmarks tests scripts/vulture_whitelist.py --min-confidence 60

# The measurements need the bench extra (aiohttp, matplotlib); dev pulls it in, and this makes
# sure of it in a venv that was installed some other way.
$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -c 'import aiohttp, matplotlib' 2>/dev/null || $(BIN)/pip install --quiet -e '.[bench]'
	touch $(BENCH_STAMP)

# The documentation site: docs/ built by MkDocs (Material) into site/, strictly, so a broken
# link, anchor or results file fails it. The docs extra is in dev; this makes sure of it in a
# venv that was installed some other way.
DOCS_STAMP := $(VENV)/.docs-installed
$(DOCS_STAMP): $(STAMP)
	$(BIN)/python -c 'import mkdocs, material' 2>/dev/null || $(BIN)/pip install --quiet -e '.[docs]'
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

bench-overhead: $(BENCH_STAMP)
	$(BIN)/parityserve bench overhead $(ARGS)

# The paper reproductions, run from the project root: python -m benchmarks.NAME --help says more.
BENCHES := tail accuracy selection simulate frontend_wrk parm_testbed parm_calibration serf serf_noise \
	parity_curve berrut_group_wait ray_cluster hams hams_nodes cold_start soak observability_run
$(addprefix bench-,$(BENCHES)): bench-%: $(BENCH_STAMP)
	$(BIN)/python -m benchmarks.$* $(ARGS)

# The wrk-driven benchmarks install wrk (Debian's package) first, and frontend_wrk its
# comparison server, LitServe (the compare extra; it adds only FastAPI to the venv).
bench-frontend_wrk bench-frontend_shards: WRK_READY
bench-frontend_wrk: LITSERVE_READY
LITSERVE_READY: $(STAMP)
	$(BIN)/python -c 'import litserve' 2>/dev/null || $(BIN)/pip install --quiet -e '.[compare]'
.PHONY: LITSERVE_READY
WRK_READY:
	scripts/wrk.sh ensure
.PHONY: WRK_READY bench-frontend_shards
bench-frontend_shards: $(BENCH_STAMP)
	$(BIN)/python -m benchmarks.frontend_shards $(ARGS)

# A real install in a throwaway venv: `pip install .` with no extras serves python:, sklearn and
# zoo models and refuses a stateful graph naming the torch extra; then '.[torch]' in the same
# venv serves a torch model and the graph. Each step timed. .ci/run runs it after the tests.
PLAIN_VENV ?= .cache/plain-venv
check-plain-install:
	PYTHON=$(PYTHON) PLAIN_VENV=$(PLAIN_VENV) scripts/check_plain_install.sh

# A long schemathesis pass over every route of a live zoo:noop server (>= 10,000 requests);
# counts per operation, failures and the command go to benchmarks/results/fuzz/. An interrupted
# run resumes where it stopped. Routes without parameters yield only a case or two each.
FUZZ_EXAMPLES ?= 650
fuzz: $(STAMP)
	$(BIN)/python tests/integration/fuzz_api.py --examples $(FUZZ_EXAMPLES) --out benchmarks/results/fuzz

# A soak (not part of make test): a well-behaved client's p50/p99/p99.9 and success in calm
# windows and in hostile ones, where every attack of issue 38 runs on a loop against the README's
# stocks graph and a model (10 rounds of 30 s calm + 60 s hostile by default; ARGS='--quick':
# under 3 minutes). The table goes to benchmarks/results/soak/; a stopped run resumes.
soak: $(BENCH_STAMP)
	$(BIN)/python -m benchmarks.soak $(ARGS)

# Known bugs planted one at a time in a scratch copy of the package, each against the unit tests
# nearest its module (core/scheduling, cache, admission, coding, hams): which the tests catch,
# which survive and why. The report goes to benchmarks/results/mutate/ (a few minutes).
mutate: $(STAMP)
	nice -n 10 $(BIN)/python scripts/mutate.py $(ARGS)

clean:
	rm -rf $(VENV) .cache .pytest_cache .mypy_cache .ruff_cache site
