# Two entry points do all the set-up on a fresh machine:
#   make run   — runs the main job (the built-in cascade scenario)
#   make test  — runs the test suite
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test lint venv oracles conformance conformance-v0 bench clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/disagg-sim run $(ARGS)

# Lint and format check (ruff) over the repository, types (mypy) over the
# packages listed in pyproject.toml's [tool.mypy], then the tests.
test: $(STAMP) lint
	$(PY) -m pytest -q $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# Builds the missing conformance oracles (vLLM 0.33.0's v1 and 0.5.3.post1's v0
# schedulers, each in its own venv under ~/.cache/disagg-sim, from the in-repo kit
# tools/oracle/kit/); a failed build is reported with a banner on stderr and the
# suites that need it then skip. `.ci/run` runs this before `make test`.
oracles:
	bash tools/oracle/ensure_oracles.sh

# Builds vLLM 0.33.0's real scheduler (if missing) and runs the differential harness.
conformance: $(STAMP)
	bash tools/conformance.sh

# The same for the legacy v0 scheduler against vLLM 0.5.3.post1.
conformance-v0: $(STAMP)
	bash tools/conformance_v0.sh

bench: $(STAMP)
	$(PY) -m benchmarks.sched_step_cost
	$(PY) -m benchmarks.inproc_speed
	$(PY) -m benchmarks.kv_handoff

clean:
	rm -rf $(VENV) .pytest_cache
