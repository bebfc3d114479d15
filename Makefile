# flashlab: two commands do all set-up on a fresh machine with Python 3.11:
#   make book   -> .venv + pinned requirements + the HTML book in _build/html
#   make test   -> the same set-up, then pytest (package + nbval on every notebook) and the book build
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export PYDEVD_DISABLE_FILE_VALIDATION := 1

.PHONY: help venv assets book book-stored check-site handout assignments test test-wheel lint pytest lab bench bench-quick clean

help:
	@echo "make book   build the HTML book (_build/html/index.html), executing every notebook"
	@echo "make test   run the package tests, nbval on every notebook, the book build (from the"
	@echo "            stored outputs nbval checks), check-site and lint"
	@echo "            (not the wheel tests: make test-wheel)"
	@echo "make test-wheel  the slow wheel tests (pytest -m wheel): flashlab built as a wheel into a"
	@echo "            fresh venv (requirements-student.txt), the smoke test, every notebook and handout"
	@echo "make lint   ruff (pyflakes, pycodestyle, isort, bugbear) and mypy on the whole package"
	@echo "make check-site  build the book, then open every page in headless Chromium (network off):"
	@echo "            fails on JS errors, missing images, broken links/anchors, empty widgets,"
	@echo "            content cut off at 1280 or 390 px;"
	@echo "            screenshots in _build/screenshots/ (needs Debian's chromium)"
	@echo "make handout  students' notebooks without answers or outputs, in _build/handout/"
	@echo "make assignments  the coding exercises as an nbgrader course in _build/assignments/"
	@echo "            (installs the optional, pinned requirements-grading.txt)"
	@echo "make lab    open the chapters in JupyterLab"
	@echo "make bench  benchmark flashlab against numpy naive and torch SDPA (installs"
	@echo "            requirements-bench.txt; N up to 16384: about an hour, ~11 GB free memory)"
	@echo "make bench-quick  its subset (N 1024, 2048; memory at 1024), < 2 minutes, results"
	@echo "            in bench-results/quick/; both end with the per-call overhead rows"
	@echo "            (small shapes, first call; overhead.json) when torch is installed"
	@echo "make clean  remove builds and caches (.venv is kept; rm -rf .venv to start over)"

# .venv is created if missing and re-synced whenever requirements.txt or pyproject.toml change
$(STAMP): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip==26.3"
	$(BIN)/python -m pip install --quiet -r requirements.txt
	touch $(STAMP)

venv: $(STAMP)

# -W: warnings are errors; -n: nitpicky references; --keep-going: report every problem;
# --all: re-read every page (every notebook is re-executed anyway; a build left over from an
# older configuration otherwise keeps stale state, e.g. a bibliography it never loaded).
# Without -W a notebook that raises still "builds" and exits 0.
# MathJax and the widget manager, fetched once from the npm registry into _vendor/ (git-ignored)
# and served by the site from _static/, so the book needs no CDN (tools/web_assets.py)
assets: $(STAMP)
	$(BIN)/python tools/web_assets.py

book: assets
	$(BIN)/jupyter-book build . --all -W -n --keep-going

# The same book from the notebooks' stored outputs, for make test: there nbval (make pytest)
# re-executes every notebook and checks each stored output against today's flashlab, so running
# them in the book build as well would execute every notebook twice. The configuration is
# _config.yml with execution off (written beside it, git-ignored: its relative paths must resolve).
STORED_CONFIG := .config-stored.yml
book-stored: assets
	sed 's/^  execute_notebooks: force$$/  execute_notebooks: "off"/' _config.yml > $(STORED_CONFIG)
	grep -q '^  execute_notebooks: "off"$$' $(STORED_CONFIG) || { echo "book-stored: _config.yml has no 'execute_notebooks: force' line to switch off"; exit 1; }
	$(BIN)/jupyter-book build . --config $(STORED_CONFIG) --all -W -n --keep-going

check-site: book
	$(BIN)/python tools/check_site.py

handout: $(STAMP)
	$(BIN)/python tools/handout.py

# nbgrader is optional: pinned in requirements-grading.txt and installed here only
assignments: $(STAMP)
	$(BIN)/python -m pip install --quiet -r requirements-grading.txt
	$(BIN)/python tools/assignments.py

# Debian's chromium (.ci/run installs it), else Google Chrome (GitHub's runner image has it)
CHROMIUM := $(shell command -v chromium || command -v chromium-browser || command -v google-chrome)

# pytest collects tests/ and, through nbval (make pytest), every notebook in book/ (norecursedirs
# keeps the executed copies under _build/ out). Every step always runs; any failing fails. The book
# is built from the stored outputs (book-stored), which nbval then checks by re-executing each
# notebook; check-site opens that build.
test: $(STAMP)
	@status=0; \
	$(MAKE) --no-print-directory book-stored || status=1; \
	if [ $$status -eq 0 ] && [ -n "$(CHROMIUM)" ]; then \
	    $(BIN)/python tools/check_site.py --chromium "$(CHROMIUM)" || status=1; \
	elif [ -z "$(CHROMIUM)" ]; then echo "make test: chromium not installed, check-site skipped"; fi; \
	$(MAKE) --no-print-directory lint || status=1; \
	$(MAKE) --no-print-directory pytest || status=1; \
	if [ $$status -ne 0 ]; then echo "make test: FAILED (see above)"; fi; \
	exit $$status

# The notebooks' outputs are stored with the kernels OpenBLAS picks itself (no OPENBLAS_CORETYPE;
# SkylakeX, AVX-512, on the machine that stores them). nbval re-executes them under another
# kernel set, NBVAL_CORETYPE (Sandybridge: AVX, which every x86-64 CPU that runs CI has), so an
# output that depends on the BLAS kernels fails here rather than on a reader's machine. Other
# architectures keep their own kernels. The package tests run with the environment as it is.
NBVAL_CORETYPE ?= Sandybridge
NBVAL_ENV := $(if $(filter x86_64,$(shell uname -m)),OPENBLAS_CORETYPE=$(NBVAL_CORETYPE))
# the settings (rules, line length, mypy's strictness; mypy checks the whole package) are in
# pyproject.toml; .pre-commit-config.yaml runs the same two tools, at the same versions, before
# each commit
lint: $(STAMP)
	$(BIN)/ruff check flashlab tests tools
	$(BIN)/mypy

# plain pytest leaves out the tests marked `wheel` (pyproject.toml): test-wheel runs them
pytest: $(STAMP)
	@status=0; \
	$(BIN)/python -m pytest tests -p no:cacheprovider || status=1; \
	echo "nbval: every notebook in book/, $(or $(NBVAL_ENV),OpenBLAS's own kernels)"; \
	$(NBVAL_ENV) $(BIN)/python -m pytest book --nbval --nbval-current-env \
	    --nbval-sanitize-with tests/sanitize.cfg -p no:cacheprovider || status=1; \
	exit $$status

# flashlab as a student installs it: a wheel in a fresh venv, every notebook and handout run from
# it (tests/test_wheel.py; -s prints each phase's wall time)
test-wheel: $(STAMP)
	$(BIN)/python -m pytest tests/test_wheel.py -m wheel -s -p no:cacheprovider

lab: $(STAMP)
	$(BIN)/jupyter lab book/

# results in bench-results/bench.json and bench.md (ending with the per-call overhead rows of
# flashlab.bench.overhead, also in overhead.json), the BLAS ceiling in bench-results/ceiling.json
# (bench-quick: bench-results/quick/); torch (requirements-bench.txt) is optional for the
# package and installed here only.
# Options: $(BIN)/python -m flashlab.bench --help
# torch is optional: when pip cannot install it (offline, no wheel for this platform or Python)
# the benchmark still runs and lists the torch SDPA cases as skipped, with the reason
BENCH_DEPS = $(BIN)/python -m pip install --quiet -r requirements-bench.txt \
	|| echo "make: torch (requirements-bench.txt) could not be installed; running without it: the torch SDPA cases are skipped"

bench: $(STAMP)
	@$(BENCH_DEPS)
	$(BIN)/python -m flashlab.bench
	$(BIN)/python -m flashlab.bench --ceiling-only

bench-quick: $(STAMP)
	@$(BENCH_DEPS)
	$(BIN)/python -m flashlab.bench --quick

clean:
	rm -rf _build _vendor .jupyter_cache .pytest_cache .hypothesis bench-results $(STORED_CONFIG)
	find . -path ./.venv -prune -o \( -name __pycache__ -o -name .ipynb_checkpoints \) -type d -print0 | xargs -0 rm -rf
	find . -path ./.venv -prune -o \( -name '*.nbi' -o -name '*.nbc' \) -type f -print0 | xargs -0 rm -f
