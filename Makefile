# The README's two commands: `make demo` (the main job) and `make test` (the full suite).
# Both create ./.venv on first use. On machines without an NVIDIA GPU the install is pinned by
# constraints/cpu.txt to torch 2.13.0's CPU build; with one, pip picks the usual CUDA build.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CONSTRAINTS := $(if $(shell command -v nvidia-smi 2>/dev/null),,-c constraints/cpu.txt)

.PHONY: demo test test-fast fuzz-native lint clean browser

$(BIN)/python:
	$(PYTHON) -c 'import sys; sys.exit("sptrace needs Python >= 3.10" if sys.version_info < (3, 10) else 0)'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# pip byte-compiles every module it installs on one core (a minute of the install here): it is told
# not to, and compileall does it on every core instead (its status ignored as pip ignores it: torch
# ships test files in newer Python syntax)
$(VENV)/.installed: $(BIN)/python pyproject.toml setup.py sptrace/load/_kineto.c constraints/cpu.txt
	$(BIN)/python -m pip install --quiet --no-compile -e '.[dev]' $(CONSTRAINTS)
	$(BIN)/python -m compileall -q -j 0 $$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') >/dev/null || true
	touch $@

demo: $(VENV)/.installed
	$(BIN)/sptrace demo

# The browser tests drive Debian's chromium (never a downloaded browser): `make browser` installs it
# (apt-get: root, or sudo).
APT := $(if $(shell command -v sudo 2>/dev/null),sudo ,)apt-get

browser:
	@command -v chromium >/dev/null 2>&1 || { $(APT) update -qq && \
		DEBIAN_FRONTEND=noninteractive $(APT) install -y -qq chromium chromium-driver; }

# needs no root: tests that want Debian's chromium or the real-trace corpus skip, saying so, when
# those are absent (`make browser` installs chromium; SPTRACE_CORPUS=DIR points at a corpus)
test: $(VENV)/.installed
	$(BIN)/python -m pytest -rs $(PYTEST_ARGS)

# the inner loop: no torchrun launch and no browser (about 1 minute on 2 cores); `make test`
# stays the whole suite
test-fast: $(VENV)/.installed
	$(BIN)/python -m pytest -rs -m "not distributed and not browser" $(PYTEST_ARGS)

# the native decoder under AddressSanitizer and UndefinedBehaviorSanitizer (CI runs 90 s of it)
FUZZ_SECONDS ?= 600
fuzz-native: $(VENV)/.installed
	$(BIN)/python benchmarks/fuzz_native.py --self-check --seconds $(FUZZ_SECONDS) \
		$(if $(wildcard ../shared/corpus),--seeds ../shared/corpus,)

lint: $(VENV)/.installed
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) sptrace-demo .pytest_cache
