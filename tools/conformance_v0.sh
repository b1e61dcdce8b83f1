#!/usr/bin/env bash
# Differential conformance of engine/v0 against vLLM 0.5.3.post1's real v0 scheduler.
# Builds the v0 oracle venv if it is missing (tools/oracle/kit/build-v0.sh, ~1 min, 1.8 GB),
# then runs the step-by-step harness over the hand-written and random scenarios.
# Usage: bash tools/conformance_v0.sh [--count N] [--seed S]     (defaults: 240 random, seed 0)
# Env: DISAGG_SIM_ORACLE_V0 (oracle python).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
ORACLE_PY=${DISAGG_SIM_ORACLE_V0:-$HOME/.cache/disagg-sim/vllm-v0-oracle/bin/python}
PY=${PYTHON:-$REPO/.venv/bin/python}
[ -x "$PY" ] || PY=python3

bash "$REPO/tools/oracle/ensure_oracles.sh" v0
export DISAGG_SIM_ORACLE_V0=$ORACLE_PY
exec "$PY" "$REPO/tests/conformance/v0/v0_harness.py" "$@"
