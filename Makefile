# One command sets up, one runs, one tests. Everything lives in ./.venv.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: run test setup lint bench clean

$(STAMP): setup.cfg pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON)"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[worker,test]'
	touch $(STAMP)

setup: $(STAMP)

# PORT (the web, 8000) and METRICS_PORT (the pools' metrics: this one and the next four, 9101)
# move the farm; ARGS passes anything else to `voxfarm up` (ARGS="--var var2 --flower").
run: $(STAMP)
	$(VENV)/bin/voxfarm up --port $${PORT:-8000} --metrics-port $${METRICS_PORT:-9101} $(ARGS)

# The browser tests (tests/browser) need Debian's chromium; without it they skip, and this
# banner, printed after the run, says so where nobody can miss it.
CHROMIUM := /usr/bin/chromium
NO_BROWSER_BANNER := test -x $(CHROMIUM) || printf '\n%s\n%s\n%s\n%s\n\n' \
  '======================================================================' \
  '!!  SKIPPED: the browser tests (tests/browser): no $(CHROMIUM)' \
  '!!  install it: apt-get install -y chromium   (.ci/run does)' \
  '======================================================================'

test: $(STAMP)
	$(PY) -m pytest -q; rc=$$?; $(NO_BROWSER_BANNER); exit $$rc

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench: $(STAMP)
	$(PY) tests/bench/bench_farm.py

clean:
	rm -rf $(VENV) var .pytest_cache
