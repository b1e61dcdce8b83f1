#!/usr/bin/env bash
# Builds the conformance oracles that are missing: vLLM 0.33.0's v1 scheduler
# (tools/oracle/kit/build.sh, ~80 s, 3 GB) and vLLM 0.5.3.post1's v0 scheduler
# (tools/oracle/kit/build-v0.sh, ~60 s, 1.8 GB), each in its own venv, from PyPI
# by package name. `make oracles` and `.ci/run` call it, so the v1, prefix-caching,
# P/D and v0 conformance suites run instead of skipping.
#
#   bash tools/oracle/ensure_oracles.sh [v1] [v0]     (default: both)
#
# A build that fails is removed (a half-built venv would make the suites fail
# rather than skip) and reported with a banner on stderr; the names of the
# failed oracles are written to $DISAGG_SIM_ORACLE_FAILURES (if set), so a
# caller can repeat the banner after the tests. Exit status 0 either way: the
# suites then skip with the reason, loudly.
#
# Environment: DISAGG_SIM_ORACLE_V1 / DISAGG_SIM_ORACLE_V0 (the interpreters;
# default ~/.cache/disagg-sim/vllm-oracle/bin/python and .../vllm-v0-oracle/bin/python).
set -uo pipefail
KIT=$(cd "$(dirname "${BASH_SOURCE[0]}")/kit" && pwd)

banner() {
  {
    echo
    echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
    echo "!!  ORACLE BUILD FAILED: $1"
    echo "!!  The conformance suites that need it will be SKIPPED in this run."
    echo "!!  Build log: $2"
    echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
    echo
  } >&2
}

# ensure <name> <interpreter> <build script>
ensure() {
  local name=$1 python=$2 script=$3
  if [ -x "$python" ]; then
    echo "== oracle $name present: $python"
    return 0
  fi
  local venv log start
  venv=$(dirname "$(dirname "$python")")
  log=$(mktemp -t "oracle-$name-build.XXXXXX.log")
  echo "== building oracle $name into $venv with tools/oracle/kit/$script (log: $log)"
  start=$(date +%s)
  if bash "$KIT/$script" "$venv" >"$log" 2>&1; then
    echo "== oracle $name built in $(($(date +%s) - start)) s"
  else
    tail -20 "$log" >&2
    rm -rf "$venv"
    banner "$name ($script exited non-zero after $(($(date +%s) - start)) s)" "$log"
    if [ -n "${DISAGG_SIM_ORACLE_FAILURES:-}" ]; then
      echo "$name" >>"$DISAGG_SIM_ORACLE_FAILURES"
    fi
  fi
}

WANT=("$@")
[ ${#WANT[@]} -eq 0 ] && WANT=(v1 v0)
for name in "${WANT[@]}"; do
  case $name in
    v1) ensure v1 "${DISAGG_SIM_ORACLE_V1:-$HOME/.cache/disagg-sim/vllm-oracle/bin/python}" build.sh ;;
    v0) ensure v0 "${DISAGG_SIM_ORACLE_V0:-$HOME/.cache/disagg-sim/vllm-v0-oracle/bin/python}" build-v0.sh ;;
    *) echo "unknown oracle $name; allowed: v1, v0" >&2; exit 2 ;;
  esac
done
exit 0
