"""vLLM 0.33.0's side of benchmarks/sched_step_cost.py. Runs INSIDE the oracle venv.

stdin:  {"sizes": [64, 256, 1024], "steps": 300, "repeat": 3}
stdout: {"vllm_version": "0.33.0", "rows": [{"n", "steps", "schedule_us", "update_us", ...}, ...]}
With `--serve`: one {"n", "steps"} per stdin line, one row per stdout line (see serve()).

The timed loop is `steady_decode_cost` from benchmarks/sched_step_cost.py,
loaded by path, so both sides run the same code; the scheduler comes from the
oracle kit through v1_driver.create_vllm_scheduler (same max_model_len pinning).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import v1_driver  # noqa: E402  (also routes vLLM's stdout chatter to stderr)
from v1_driver import REPO, create_vllm_scheduler, kit  # noqa: E402

sys.path.insert(0, str(REPO / "benchmarks"))
import sched_step_cost  # noqa: E402


def serve() -> None:
    """`--serve`: one {"n", "steps"} request per line, one result row per line, so
    the benchmark can interleave vLLM's runs with ours under the same machine load."""
    v1_driver._RESULT_OUT.write(json.dumps({"ready": True, "vllm_version": v1_driver.vllm.__version__}) + "\n")
    v1_driver._RESULT_OUT.flush()
    for line in sys.stdin:
        if line.strip():
            req = json.loads(line)
            cfg = sched_step_cost.bench_config(req["n"], req["steps"])
            row = _one_run(req["n"], cfg, req["steps"])
            v1_driver._RESULT_OUT.write(json.dumps(row) + "\n")
            v1_driver._RESULT_OUT.flush()


def main() -> None:
    if "--serve" in sys.argv[1:]:
        serve()
        return
    payload = json.load(sys.stdin)
    rows = []
    for n in payload["sizes"]:
        cfg = sched_step_cost.bench_config(n, payload["steps"])
        runs = [_one_run(n, cfg, payload["steps"]) for _ in range(payload.get("repeat", 1))]
        rows.append(sched_step_cost.best_of(runs))
    v1_driver._RESULT_OUT.write(json.dumps({"vllm_version": v1_driver.vllm.__version__, "rows": rows}))
    v1_driver._RESULT_OUT.flush()


def _one_run(n: int, cfg: dict, steps: int) -> dict:
    sched = create_vllm_scheduler(
        {
            "max_num_seqs": cfg["max_num_seqs"],
            "max_num_batched_tokens": cfg["max_num_batched_tokens"],
            "enable_chunked_prefill": True,
            "long_prefill_token_threshold": 0,
            "num_blocks": cfg["num_blocks"],
            "block_size": cfg["block_size"],
            "max_model_len": cfg["max_model_len"],
            "async_scheduling": False,
            "policy": "fcfs",
        }
    )
    reqs = kit.create_requests(n, num_tokens=sched_step_cost.PROMPT_LEN, max_tokens=cfg["max_tokens"], ignore_eos=True)
    return sched_step_cost.steady_decode_cost(sched, reqs, kit.make_model_runner_output, steps)


if __name__ == "__main__":
    main()
