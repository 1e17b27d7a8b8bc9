# Two commands: `make demo` and `make test`. Each creates .venv when missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-all bench clean ocr

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first, pinned, so nothing later resolves a CUDA build.
	$(PY) -m pip install --quiet "torch==2.13.0"
	$(PY) -m pip install --quiet -e ".[io,dev,langchain,llamaindex]"
	touch $(STAMP)

demo: $(STAMP) ocr
	$(VENV)/bin/cdsjax demo

# The suite runs in parallel, whole test files per worker process (pytest-xdist; one worker per core, at most
# 4): on 2 cores 9 minutes instead of 13.
XDIST := -n auto --maxprocesses 4 --dist loadfile

test: $(STAMP) ocr
	$(PY) -m pytest -q $(XDIST)

test-all: $(STAMP) ocr
	$(PY) -m pytest -q $(XDIST) -m ""

# Tesseract reads scanned pages (pages without a text layer) when it is installed. Installed here as root
# where apt works; skipped silently otherwise (scanned pages are then indexed as page images).
ocr:
	@command -v tesseract >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tesseract-ocr) >/dev/null 2>&1; } || true

clean:
	rm -rf $(VENV) build *.egg-info
