# The two commands of the README. Both create (once) and reuse .venv.
VENV ?= .venv
# test workers (pytest-xdist); the tests that drive Chromium share one of them (tests/conftest.py)
JOBS ?= 2
PY := $(VENV)/bin/python

.PHONY: demo test lint env clean sample-runs device-check
demo: $(VENV)/.ready
	$(PY) -m gpudash demo $(ARGS)

test: $(VENV)/.ready
	$(VENV)/bin/ruff check gpudash tests benchmarks scripts examples
	$(VENV)/bin/mypy
	$(PY) -m pytest -n $(JOBS) --dist loadgroup --durations=25 $(ARGS)

lint: $(VENV)/.ready
	$(VENV)/bin/ruff check gpudash tests benchmarks scripts examples
	$(VENV)/bin/mypy

env: $(VENV)/.ready

sample-runs: $(VENV)/.ready
	$(PY) scripts/make_sample_runs.py

device-check: $(VENV)/.ready
	PY=$(PY) scripts/device_check.sh $(or $(OUT),device-check)

$(VENV)/.ready: pyproject.toml scripts/bootstrap.sh
	VENV=$(VENV) scripts/bootstrap.sh
	touch $@

clean:
	rm -rf $(VENV) runs
