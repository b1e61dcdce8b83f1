#!/usr/bin/env bash
# Differential conformance against vLLM's real schedulers (`make conformance`).
#
#   bash tools/conformance.sh [run_v1.py options]     e.g. --count 1000 --first-seed 5000
#
# 1. Builds the vLLM 0.33.0 oracle venv with ../shared/oracle/build.sh if its
#    interpreter is missing (about 80 s, 3 GB; PyPI by package name only).
# 2. Runs the v1 harness (tests/conformance/run_v1.py): hand-written scenarios plus
#    500 random ones with prefix caching on, and
#    200 random ones and their pre-fix-guard twins, through vLLM and through our
#    engine, step by step. Prints "v1 conformance ...: N scenarios, M matched" and
#    writes a shrunk reproduction per mismatch class under build/conformance/v1/.
# Exit status: 0 all matched, 1 mismatch or failed expectation, 2 oracle/venv missing.
# The v0 scheduler has its own command: tools/conformance_v0.sh (`make conformance-v0`).
#
# Environment: DISAGG_SIM_SHARED (default <repo>/../shared), DISAGG_SIM_ORACLE_V1
# (oracle interpreter), PYTHON (default <repo>/.venv/bin/python).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SHARED=${DISAGG_SIM_SHARED:-$REPO/../shared}
PY=${PYTHON:-$REPO/.venv/bin/python}

if [ ! -x "$PY" ]; then
  echo "project interpreter $PY not found: run \`make venv\` first (or set PYTHON)" >&2
  exit 2
fi

# ensure_oracle <interpreter> <build script>: builds the venv that holds <interpreter>.
ensure_oracle() {
  local python=$1 script=$2
  if [ -x "$python" ]; then
    return 0
  fi
  if [ ! -f "$SHARED/oracle/$script" ]; then
    echo "oracle missing at $python and no build script at $SHARED/oracle/$script (set DISAGG_SIM_SHARED)" >&2
    exit 2
  fi
  local venv
  venv=$(dirname "$(dirname "$python")")
  echo "== building oracle venv $venv with $SHARED/oracle/$script"
  bash "$SHARED/oracle/$script" "$venv"
}

V1_PY=${DISAGG_SIM_ORACLE_V1:-$HOME/.cache/disagg-sim/vllm-oracle/bin/python}
ensure_oracle "$V1_PY" build.sh
echo "== v1 scheduler vs vLLM 0.33.0"
exec "$PY" "$REPO/tests/conformance/run_v1.py" "$@"
