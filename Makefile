# memlab: two commands on a fresh machine, `make report` and `make test`; each creates .venv when it is absent.
#   make report [SCALE=auto|ci|full] [FORCE=1] [ONLY=NN]   execute the course, build the book reports/index.html
#   make test                                             ruff, then pytest (notebooks at ci scale, headless browser)
# Every dependency comes from requirements.lock (exact releases with hashes, written by `make lock` from
# pyproject.toml); torch comes after it by its own pin (on a CPU-only machine the pinned CPU wheel, in seconds; an
# unpinned torch would pull gigabytes of CUDA wheels): `make TORCH=torch==2.5.1 report` picks another, and memlab
# then says its family terms were not verified against it (memlab.predict.spec.versions).
#   make upgrade-check   the newest releases in a scratch venv: is memlab still exact? (a drift table)
#   make lock            re-resolve the lock (moves only after a green upgrade-check)

SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV ?= .venv
TORCH ?= torch==2.13.0
SCALE ?= auto
FORCE ?=
ONLY ?=
FRESH ?=
PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
CHROMIUM ?= /usr/bin/chromium
TEST_WORKERS ?= 2
# pytest-xdist workers for make test: the course's ci-scale build (the longest test fixture) runs on one while
# the rest of the suite runs on the other; modules sharing a fixture stay on one worker (tests/conftest.py).

VENV_ABS := $(abspath $(VENV))
PY := $(VENV_ABS)/bin/python
STAMP := $(VENV_ABS)/.memlab-installed
TORCH_PIN := $(VENV_ABS)/.torch-pin
NOTEBOOKS := $(wildcard notebooks/[0-9][0-9]_*.py)
BENCHMARKS := $(wildcard benchmarks/*.py)
IS_ROOT := $(filter 0,$(shell id -u))
PIP := $(PY) -m pip install --quiet --disable-pip-version-check

.PHONY: help setup report test lab bench sync clean chromium lock upgrade-check always

help: ## list the targets
	@echo "memlab: fresh machine: 'make report' (the course, rendered) and 'make test' (CI)."
	@grep -E '^[a-z][a-z-]*:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  make %-9s %s\n", $$1, $$2}'
	@echo "variables: VENV=$(VENV) TORCH=$(TORCH) SCALE=$(SCALE) FORCE=$(FORCE) ONLY=$(ONLY)"

# The torch pin is remembered in .venv, so `make TORCH=...` re-installs when it changes.
$(TORCH_PIN): always
	@mkdir -p $(VENV_ABS)
	@echo '$(TORCH)' | cmp -s - $@ || echo '$(TORCH)' > $@

# The lock first, without resolving (every pin and hash is in it), by uv (the lock's own uv, installed by pip from
# requirements-uv.lock: uv downloads in parallel, 13 s here where pip takes two minutes); then torch by pip (which
# finds a local CPU wheel where pip is configured to), its own dependencies already installed from the lock (a CUDA
# build adds only its exact-pinned CUDA wheels; where pip is configured with find-links holding that torch, as on this
# machine, uv installs it from there without an index, 8 s where pip takes 17); then memlab itself and uv's check that
# every requirement holds (uv: 1 s where pip takes 11). Bytecode is compiled when a
# module is first imported and kept (45 s less than compiling every installed file up front): make's recipes run
# without PYTHONDONTWRITEBYTECODE, which would have every kernel and rank compile every import again (chapters ran
# 1.6-2x slower).
unexport PYTHONDONTWRITEBYTECODE
$(STAMP): requirements.lock requirements-uv.lock pyproject.toml $(TORCH_PIN)
	@test -x $(PY) || { echo "creating $(VENV) with $(PYTHON)"; $(PYTHON) -m venv $(VENV_ABS); }
	@echo "installing requirements.lock (with uv), then $(TORCH), then memlab into $(VENV)"
	$(PIP) --require-hashes --no-deps -r requirements-uv.lock
	$(VENV_ABS)/bin/uv pip install --quiet --python $(PY) --require-hashes --no-deps -r requirements.lock
	@links="$${PIP_FIND_LINKS:-$$($(PY) -m pip config get global.find-links 2>/dev/null)}"; \
	if [ -n "$$links" ] && $(VENV_ABS)/bin/uv pip install --quiet --python $(PY) --no-deps --no-index \
		--find-links "$$links" "$(TORCH)" 2>/dev/null; then echo "$(TORCH) from $$links (uv)"; \
	else echo "$(PIP) --no-compile $(TORCH)"; $(PIP) --no-compile "$(TORCH)"; fi
	$(VENV_ABS)/bin/uv pip install --quiet --python $(PY) --no-deps --no-build-isolation -e .
	$(VENV_ABS)/bin/uv pip check --python $(PY)
	@touch $@

setup: $(STAMP) ## create .venv (when absent) and install torch, memlab and the course tools

report: $(STAMP) ## execute every chapter and build the book reports/index.html (SCALE=auto|ci|full, FORCE=1, ONLY=NN)
	$(PY) -m memlab.course.report --scale $(SCALE)$(if $(filter-out 0 no false,$(FORCE)), --force)$(foreach n,$(ONLY), --only $(n))

chromium: ## install Debian's chromium and a CJK font (fonts-noto-cjk) for the browser test (as root, when missing)
	@missing="$$(test -x $(CHROMIUM) || echo chromium) $$(fc-list :lang=zh 2>/dev/null | grep -q . || echo fonts-noto-cjk)"; \
	if [ -z "$${missing// /}" ]; then :; \
	elif [ -n "$(IS_ROOT)" ]; then \
		echo "installing$$missing (Debian packages) for the browser test"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing \
			>/dev/null; \
	else echo "missing:$$missing and this is not root: the browser test skips or fails on CJK glyphs"; fi

test: $(STAMP) chromium ## ruff, then the whole pytest suite (executes the notebooks at ci scale, browser check)
	$(VENV_ABS)/bin/ruff check .
	MEMLAB_SCREENSHOT_DIR=$(CURDIR)/reports/screenshots $(VENV_ABS)/bin/pytest -q -n $(TEST_WORKERS) --dist loadgroup -m "not wide"

# The learner's copies: lab/NN_topic.ipynb, one plain notebook per chapter, in a git-ignored folder, so opening or
# running a chapter never touches the committed pair (memlab/course/lab.py says why copies and not a git filter).
lab: $(STAMP) ## JupyterLab on plain copies of the chapters in lab/ (git-ignored; FRESH=1 replaces them)
	$(PY) -m memlab.course.lab$(if $(filter-out 0 no false,$(FRESH)), --fresh)
	cd lab && $(VENV_ABS)/bin/jupyter lab $(if $(IS_ROOT),--allow-root)

bench: $(STAMP) ## run each benchmark script in benchmarks/, then the widened sweeps (pytest -m wide)
	@status=0; for script in $(BENCHMARKS); do echo "== $$script"; $(PY) "$$script" || status=1; done; \
	echo "== pytest -m wide"; $(VENV_ABS)/bin/pytest -q -n $(TEST_WORKERS) -m wide || status=1; \
	[ -n "$(BENCHMARKS)" ] || echo "no benchmarks/*.py yet"; exit $$status

lock: $(STAMP) ## re-resolve requirements.lock and environment.yml from pyproject.toml (after a green upgrade-check)
	$(PY) scripts/lock.py --torch "$(TORCH)"

upgrade-check: $(STAMP) ## the newest releases in a scratch venv (.cache/upgrade-check): a drift table, exact/drifted/broken
	$(PY) scripts/upgrade_check.py --torch "$(TORCH)"

sync: $(STAMP) ## re-pair notebooks/NN_topic.py with NN_topic.ipynb (jupytext) and strip outputs
	$(VENV_ABS)/bin/jupytext --sync $(NOTEBOOKS)
	$(VENV_ABS)/bin/jupyter nbconvert --log-level=WARN --clear-output --inplace $(NOTEBOOKS:.py=.ipynb)
	@touch $(NOTEBOOKS:.py=.ipynb)  # contents are in sync now; the .ipynb is the newer file of each pair

clean: ## remove the rendered report, caches and build outputs (keeps .venv)
	rm -rf reports/build reports/*.html reports/index.json reports/.cache.json reports/solutions reports/screenshots \
		reports/_static reports/_images reports/_sources reports/searchindex.js reports/objects.inv reports/.buildinfo
	rm -rf .pytest_cache .ruff_cache .hypothesis
	find . -name __pycache__ -type d -not -path "./$(VENV)/*" -prune -exec rm -rf {} +

always:
