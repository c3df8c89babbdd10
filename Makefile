# attnstudy — set-up and the README's commands. `make run` and `make test` set everything up first.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
EXPERIMENT ?= experiments/quickstart.toml

.PHONY: setup browser-deps run test test-fast bench ui lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# the CPU wheel first: a bare torch requirement would pull a multi-GB CUDA build
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

# Debian's chromium for the browser tests (tests/test_browser.py drives it with Playwright). Needs root
# and apt; without them the browser tests are skipped, with the reason printed.
browser-deps:
	@if [ -x /usr/bin/chromium ]; then :; \
	elif command -v apt-get >/dev/null 2>&1 && apt-get update && apt-get install -y chromium; then :; \
	else echo "warning: could not install Debian chromium (no apt-get, not root, or apt failed):" \
	          "the browser tests will be skipped" >&2; fi

run: setup
	$(VENV)/bin/attnstudy run $(EXPERIMENT)

test: setup browser-deps
	$(PY) -m pytest

test-fast: setup
	$(PY) -m pytest -m "not slow"

bench: setup
	$(PY) -m benchmarks.run_all

ui: setup
	$(VENV)/bin/attnstudy ui

lint: setup
	$(VENV)/bin/ruff check src analysis tests benchmarks

clean:
	rm -rf $(VENV) reports
