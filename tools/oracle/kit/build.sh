#!/usr/bin/env bash
# Builds a virtual environment holding the real vLLM 0.33.0 v1 scheduler, CPU only.
# Usage: bash build.sh [VENV_DIR] [VLLM_VERSION]   (defaults: ~/.cache/disagg-sim/vllm-oracle, 0.33.0)
# (In-repo change: the version is a parameter, so 0.29.0-0.32.x build the same way;
#  see tools/oracle/kit/README.md.)
# Takes about 80 s and 3 GB. Only the scheduler is usable: vllm._C does not load,
# which the scheduler does not need.
set -euo pipefail
export PIP_NO_CACHE_DIR=1
VENV=${1:-$HOME/.cache/disagg-sim/vllm-oracle}
VERSION=${2:-0.33.0}
python3 -m venv "$VENV"
PIP="$VENV/bin/pip"
# CPU torch: this machine keeps a 2.13.0 CPU wheel that pip takes by this exact pin.
# vllm 0.33.0 asks for torch 2.14.0 (a multi-GB CUDA build), hence --no-deps below.
"$PIP" install -q torch==2.13.0
"$PIP" install -q --no-deps "vllm==$VERSION"
# What importing the scheduler really needs (bounds from vllm 0.33.0's metadata).
"$PIP" install -q packaging numpy regex cachetools psutil msgspec "pydantic>=2.12.0" \
  cloudpickle "pyzmq>=25.0.0" tqdm blake3 cbor2 pybase64 pyyaml \
  "prometheus_client>=0.18.0" "requests>=2.33.0" "transformers>=5.16.1,<5.21.0" \
  "huggingface_hub>=1.31.0" "tokenizers>=0.23.2" "safetensors>=0.6.2" sentencepiece \
  py-cpuinfo einops "filelock>=3.20.3" setproctitle "aiohttp>=3.14.4" \
  "oss-harmony>=0.0.11" "openai>=2.25.0" orjson "pillow>=13.0.0" uvloop \
  "fastapi[standard]>=0.133.0,<0.137.0" partial-json-parser "llguidance>=1.7.0,<1.8.0" pytest
# The structured-output manager imports xgrammar; --no-deps keeps a 1 GB triton wheel out.
"$PIP" install -q --no-deps xgrammar==0.2.8 apache-tvm-ffi==0.1.11
"$VENV/bin/python" -c "from vllm.v1.core.sched.scheduler import Scheduler; import vllm; print('vllm', vllm.__version__, 'scheduler OK')"
echo "$VENV"
