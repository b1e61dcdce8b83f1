# Two entry points do all the set-up on a fresh machine:
#   make run   — runs the main job (the built-in cascade scenario)
#   make test  — runs the test suite
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test lint venv oracles browser conformance conformance-v0 bench compiled test-compiled clean

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
test: $(STAMP) lint browser
	$(PY) -m pytest -q $(PYTEST_ARGS)

# The HTML report's test renders it in headless Chromium: Debian's package,
# installed here when missing and we are root (CI is); otherwise that test
# skips and says why.
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }; } || \
	  echo "note: no chromium: the HTML report's browser test will skip"

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

# The optional compiled engine (docs/compiled.md): mypyc (from the mypy the
# [test] extra pins) builds the hot modules into build/compiled/, never into
# the source tree; DISAGG_SIM_COMPILED=1 runs them. Without a C compiler it
# says so and builds nothing. Rebuilds only when a compiled module changed.
compiled: $(STAMP)
	$(PY) tools/build_compiled.py

# The fast paths' on/off equality suites and the conformance suites against
# the compiled build (the pure build's run in `make test`); skipped, with a
# note, when the build could not be made.
COMPILED_TESTS ?= tests/e2e_inproc/test_fast_paths.py tests/e2e_inproc/test_fast_paths_faults.py \
	tests/conformance/test_v1_oracle.py tests/conformance/test_pd_oracle.py tests/unit/test_compiled_build.py
test-compiled: compiled
	@if [ -f build/compiled/manifest.json ]; then \
	  DISAGG_SIM_COMPILED=1 $(PY) -m pytest -q $(COMPILED_TESTS) $(PYTEST_ARGS); \
	else echo "note: no compiled build (see above): test-compiled skipped"; fi

bench: $(STAMP)
	$(PY) -m benchmarks.sched_step_cost
	$(PY) -m benchmarks.inproc_speed
	$(PY) -m benchmarks.kv_handoff

clean:
	rm -rf $(VENV) .pytest_cache build/compiled
