#!/usr/bin/env bash
# Differential conformance against vLLM's real schedulers (`make conformance`).
#
#   bash tools/conformance.sh [run_v1.py options]     e.g. --count 1000 --first-seed 5000
#
# 1. Builds the vLLM 0.33.0 oracle venv with the in-repo kit
#    (tools/oracle/kit/build.sh) if its interpreter is missing (about 80 s, 3 GB;
#    PyPI by package name only).
# 2. Runs the v1 harness (tests/conformance/run_v1.py): hand-written scenarios plus
#    200 random ones and their pre-fix-guard twins, 500 random ones with prefix
#    caching on, and 500 random P/D ones (a KV connector in each role), through
#    vLLM and through our engine, step by step. Prints "v1 conformance ...: N
#    scenarios, M matched" with a P/D breakdown by role, load-failure policy and
#    guard, and writes a shrunk reproduction per mismatch class under
#    build/conformance/v1/.
# Exit status: 0 all matched, 1 mismatch or failed expectation, 2 oracle/venv missing.
# The v0 scheduler has its own command: tools/conformance_v0.sh (`make conformance-v0`).
#
# Environment: DISAGG_SIM_ORACLE_V1 (oracle interpreter), PYTHON (default <repo>/.venv/bin/python).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-$REPO/.venv/bin/python}

if [ ! -x "$PY" ]; then
  echo "project interpreter $PY not found: run \`make venv\` first (or set PYTHON)" >&2
  exit 2
fi

bash "$REPO/tools/oracle/ensure_oracles.sh" v1
echo "== v1 scheduler vs vLLM 0.33.0"
exec "$PY" "$REPO/tests/conformance/run_v1.py" "$@"
