# Two entry points do all the set-up on a fresh machine:
#   make run   — runs the main job (the built-in cascade scenario)
#   make test  — runs the test suite
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test venv oracle conformance bench clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/disagg-sim run $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS)

# Builds vLLM 0.33.0's real scheduler (if missing) and runs the differential harness.
conformance: $(STAMP)
	bash tools/conformance.sh

bench: $(STAMP)
	$(PY) -m benchmarks.run_all

clean:
	rm -rf $(VENV) .pytest_cache
