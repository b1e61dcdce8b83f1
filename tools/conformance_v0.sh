#!/usr/bin/env bash
# Differential conformance of engine/v0 against vLLM 0.5.3.post1's real v0 scheduler.
# Builds the v0 oracle venv if it is missing (shared/oracle/build-v0.sh, ~1 min, 1.8 GB),
# then runs the step-by-step harness over the hand-written and random scenarios.
# Usage: bash tools/conformance_v0.sh [--count N] [--seed S]     (defaults: 240 random, seed 0)
# Env: DISAGG_SIM_ORACLE_V0 (oracle python), DISAGG_SIM_SHARED (the shared/ directory).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
SHARED=${DISAGG_SIM_SHARED:-$REPO/../shared}
ORACLE_PY=${DISAGG_SIM_ORACLE_V0:-$HOME/.cache/disagg-sim/vllm-v0-oracle/bin/python}
PY=${PYTHON:-$REPO/.venv/bin/python}
[ -x "$PY" ] || PY=python3

if [ ! -x "$ORACLE_PY" ]; then
  if [ -n "${DISAGG_SIM_ORACLE_V0:-}" ]; then
    echo "DISAGG_SIM_ORACLE_V0=$DISAGG_SIM_ORACLE_V0 does not exist; unset it to build the default venv" >&2
    exit 2
  fi
  echo "v0 oracle missing; building it with $SHARED/oracle/build-v0.sh" >&2
  bash "$SHARED/oracle/build-v0.sh"
fi
export DISAGG_SIM_SHARED=$SHARED DISAGG_SIM_ORACLE_V0=$ORACLE_PY
exec "$PY" "$REPO/tests/conformance/v0/v0_harness.py" "$@"
