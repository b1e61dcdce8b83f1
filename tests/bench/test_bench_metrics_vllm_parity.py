"""Our metrics against vLLM 0.33's own `calculate_metrics`, run in the oracle venv.

The oracle interpreter is a separate venv (the project never imports vLLM);
the records go over as JSON, vLLM's BenchmarkMetrics come back as JSON.
Skipped when the oracle venv is absent.
"""

import json
import os
import random
import subprocess
from pathlib import Path

import pytest

from bench.metrics import compute_metrics, request_latencies
from engine.records import RequestRecord

ORACLE_PY = Path.home() / ".cache/disagg-sim/vllm-oracle/bin/python"

pytestmark = [
    pytest.mark.oracle,
    pytest.mark.skipif(not ORACLE_PY.exists(), reason=f"vLLM oracle venv not built ({ORACLE_PY})"),
]

ORACLE_SCRIPT = r"""
import json, sys, dataclasses
from vllm.benchmarks.serve import calculate_metrics
from vllm.benchmarks.lib.endpoint_request_func import RequestFuncOutput
req = json.load(open(sys.argv[1]))
outs = [RequestFuncOutput(**o) for o in req["outputs"]]
m, _ = calculate_metrics([], outs, req["duration"], None, req["percentiles"], {})
json.dump(dataclasses.asdict(m), open(sys.argv[2], "w"))
"""


def random_records(n: int, seed: int) -> list[RequestRecord]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        arrival = rng.uniform(0, 20)
        t = arrival + rng.uniform(0.01, 2.0)
        times = []
        for _ in range(rng.randint(1, 30)):
            times.append(t)
            t += rng.expovariate(20.0)
        reason = rng.choice(["length", "stop", "stop", "abort"])
        out.append(
            RequestRecord(
                f"r{i}",
                arrival,
                rng.randint(1, 2000),
                64,
                token_times=times,
                finish_time=times[-1] + rng.uniform(0, 0.01),
                finish_reason=reason,
            )
        )
    return out


def as_vllm_output(rec: RequestRecord) -> dict:
    lat = request_latencies(rec)
    if lat is None:
        return {"success": False, "prompt_len": rec.prompt_len, "start_time": rec.arrival_time}
    return {
        "success": True,
        "prompt_len": rec.prompt_len,
        "start_time": rec.arrival_time,
        "ttft": lat.ttft,
        "latency": lat.e2el,
        "itl": lat.itls,
        "output_tokens": lat.output_len,
    }


def run_oracle(tmp_path: Path, records, duration, percentiles) -> dict:
    req = tmp_path / "req.json"
    res = tmp_path / "res.json"
    script = tmp_path / "oracle_metrics.py"
    script.write_text(ORACLE_SCRIPT)
    req.write_text(
        json.dumps({"outputs": [as_vllm_output(r) for r in records], "duration": duration, "percentiles": percentiles})
    )
    home = Path.home() / ".cache/disagg-sim/vllm-oracle-home"
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_HOME=str(home / "hf"),
        VLLM_CACHE_ROOT=str(home / "vllm-cache"),
        VLLM_CONFIG_ROOT=str(home / "vllm-config"),
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        VLLM_TARGET_DEVICE="cpu",
        VLLM_LOGGING_LEVEL="ERROR",
    )
    subprocess.run(
        [str(ORACLE_PY), str(script), str(req), str(res)], check=True, env=env, capture_output=True, timeout=240
    )
    return json.loads(res.read_text())


def test_matches_vllm_calculate_metrics(tmp_path):
    records = random_records(60, seed=7)
    percentiles = [50, 90, 99, 99.9]
    ours = compute_metrics(records, duration=25.0, percentiles=percentiles)
    theirs = run_oracle(tmp_path, records, 25.0, percentiles)
    d = ours.to_dict()
    assert ours.completed == theirs["completed"]
    assert ours.failed == theirs["failed"]
    assert ours.total_input_tokens == theirs["total_input"]
    assert ours.total_output_tokens == theirs["total_output"]
    for key in ("request_throughput", "output_throughput", "total_token_throughput", "max_output_tokens_per_s"):
        assert getattr(ours, key) == pytest.approx(theirs[key], rel=1e-12), key
    for name in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "std"):
            assert d[f"{stat}_{name}_ms"] == pytest.approx(theirs[f"{stat}_{name}_ms"], rel=1e-9), (stat, name)
        for p, value in theirs[f"percentiles_{name}_ms"]:
            word = str(int(p)) if int(p) == p else str(p)
            assert d[f"p{word}_{name}_ms"] == pytest.approx(value, rel=1e-9), (p, name)
    # vLLM counts concurrency in whole-second buckets, which can only overcount our exact sweep.
    assert 1 <= ours.max_concurrent_requests <= theirs["max_concurrent_requests"]
