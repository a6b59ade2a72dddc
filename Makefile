# One command sets up, one runs, one tests. Everything lives in ./.venv.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: run test test-slow test-amqp cluster-test setup lint bench clean

$(STAMP): setup.cfg pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON)"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[worker,test]'
	touch $(STAMP)

setup: $(STAMP)

# PORT (the web, 8000) and METRICS_PORT (the pools' metrics: this one and the next five, one a pool, 9101)
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
	$(PY) -m pytest -q -m "not slow"; rc=$$?; $(MAKE) --no-print-directory test-amqp || rc=1; \
	  $(NO_BROWSER_BANNER); exit $$rc

# The fault and canary tests that take a minute or more each (marked slow): Redis and worker
# kills under `voxfarm up`, a 30 s Redis outage, redelivery, the canary's two decisions.
# Also the longest of the rest (docs/testing.md lists them): load bursts, the web-only
# install, two farms side by side, TLS on every hop, bursts of books, the voices' WER. About
# 15 minutes; .ci/run runs them after `make test`.
test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

# The farm tests again with RabbitMQ as the broker (VOXFARM_TEST_BROKER=amqp, see
# tests/brokers.py): a representative subset (a job's ordered chunks, cancel, a killed
# vocoder, admission under a burst, a killed book worker, interactive before batch), under a
# minute, because the whole integration suite takes several minutes more per broker on two
# cores. All of it: `make test-amqp AMQP_TESTS=tests/integration` (CI does). Without a
# reachable RabbitMQ and a rabbitmqctl to make a virtual host per farm, a banner says the pass
# was skipped.
AMQP_TESTS ?= tests/integration/test_farm.py::test_job_renders_speech_in_ordered_chunks \
  tests/integration/test_farm.py::test_cancel_stops_pending_segments \
  tests/integration/test_farm.py::test_killed_vocoder_loses_no_segment \
  tests/integration/test_farm.py::test_a_burst_of_submissions_at_once_is_admitted_only_up_to_the_bound \
  tests/integration/test_books.py::test_interactive_job_overtakes_a_book \
  tests/integration/test_books.py::test_book_worker_sigkill_mid_assembly_book_still_completes
test-amqp: $(STAMP)
	@why=$$($(PY) -c 'from tests.brokers import amqp_unavailable; print(amqp_unavailable())'); \
	if [ -n "$$why" ]; then printf '\n%s\n%s\n%s\n\n' \
	  '======================================================================' \
	  "!!  SKIPPED: the RabbitMQ pass of the farm tests: $$why" \
	  '======================================================================'; \
	else echo "== the farm tests again, RabbitMQ as the broker"; \
	  VOXFARM_TEST_BROKER=amqp $(PY) -m pytest -q $(AMQP_TESTS); fi

# The farm across network-namespace hosts (tests/cluster): root and iproute2, about 3 minutes.
cluster-test: $(STAMP)
	$(PY) -m pytest -q -s -p no:cacheprovider -m cluster tests/cluster

# ruff for style and imports, mypy (pyproject.toml) for what the annotations say.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

bench: $(STAMP)
	$(PY) tests/bench/bench_farm.py

clean:
	rm -rf $(VENV) var .pytest_cache
