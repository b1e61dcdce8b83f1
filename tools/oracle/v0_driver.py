"""Runs v0 conformance scenarios through the REAL vLLM 0.5.3.post1 scheduler.

Runs INSIDE the v0 oracle venv (~/.cache/disagg-sim/vllm-v0-oracle), never in
the project's. Every decision comes from vLLM: the driver only builds the
scheduler and requests with the oracle kit (`make_scheduler`, `make_request`)
and steps it with the kit's `step()` (LLMEngine's bookkeeping minus the model).
The one addition is a pass-through wrapper on the scheduler instance's
`_preempt` that records which group was preempted and in which mode.

    python v0_driver.py --kit-dir tools/oracle/kit --in scenarios.json --out traces.json

Input:  {"scenarios": [scenario, ...]}  (format in tests/conformance/v0/v0_scenarios.py)
Output: {"vllm_version": str, "traces": [trace, ...]} in the same order, one
trace per scenario: {"name", "steps": [step record, ...], "error", "error_step"}.
"""

import argparse
import json
import logging
import sys
import time


def _step_record(rec, preempted, scheduler_warnings):
    return {
        "step": rec.step,
        "scheduled": ([[rid, n, True] for rid, n in rec.prefills] + [[rid, 1, False] for rid in rec.decodes]),
        "num_batched_tokens": rec.num_batched_tokens,
        "num_prefill_groups": len(rec.prefills),
        "preempted": preempted,
        "num_preempted": rec.preempted,
        "swap_in_blocks": rec.swap_in,
        "swap_out_blocks": rec.swap_out,
        "ignored": rec.ignored,
        "finished": rec.finished,
        "waiting": rec.waiting,
        "running": rec.running,
        "swapped": rec.swapped,
        "free_gpu_blocks": rec.free_gpu_blocks,
        "free_cpu_blocks": rec.free_cpu_blocks,
        "warnings": scheduler_warnings,
    }


def run_scenario(kit, scenario):
    cfg = scenario["config"]
    sched = kit.make_scheduler(
        num_gpu_blocks=cfg["num_gpu_blocks"],
        num_cpu_blocks=cfg["num_cpu_blocks"],
        block_size=cfg["block_size"],
        max_num_seqs=cfg["max_num_seqs"],
        max_num_batched_tokens=cfg["max_num_batched_tokens"],
        max_model_len=cfg["max_model_len"],
        enable_chunked_prefill=cfg["enable_chunked_prefill"],
        preemption_mode=cfg["preemption_mode"],
    )
    preempted = []
    original_preempt = sched._preempt

    def recording_preempt(seq_group, blocks_to_swap_out, preemption_mode=None):
        mode = original_preempt(seq_group, blocks_to_swap_out, preemption_mode)
        preempted.append([seq_group.request_id, mode.name])
        return mode

    sched._preempt = recording_preempt

    arrivals = {}
    for r in scenario["requests"]:
        arrivals.setdefault(r["arrival_step"], []).append(r)
    last_arrival = max(arrivals) if arrivals else 0
    steps, error, error_step = [], None, None
    for i in range(scenario["max_steps"]):
        for r in arrivals.get(i, []):
            sched.add_seq_group(
                kit.make_request(r["id"], r["prompt_len"], r["max_tokens"], r["arrival_time"], cfg["block_size"])
            )
        if not sched.has_unfinished_seqs() and i >= last_arrival:
            break
        del preempted[:]
        n_logs = len(kit.LOG.records)
        try:
            rec = kit.step(sched, i, token_id=scenario.get("token_id", 7))
        except Exception as e:  # vLLM aborts the engine (e.g. out of swap space)
            error, error_step = f"{type(e).__name__}: {e}", i
            break
        warnings = [
            line.split(": ", 1)[1] for line in kit.LOG.records[n_logs:] if line.startswith("WARNING vllm.core.")
        ]
        steps.append(_step_record(rec, list(preempted), warnings))
    return {"name": scenario["name"], "steps": steps, "error": error, "error_step": error_step}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kit-dir", required=True, help="directory holding v0_scheduler_kit.py (tools/oracle/kit)")
    ap.add_argument("--in", dest="inp", required=True, help="scenarios JSON")
    ap.add_argument("--out", required=True, help="traces JSON to write")
    args = ap.parse_args(argv)
    sys.path.insert(0, args.kit_dir)
    import v0_scheduler_kit as kit  # noqa: E402  (needs vLLM: oracle venv only)
    import vllm

    # vLLM's own handler prints every warning to stdout; the kit captures them anyway.
    for name in ("vllm", "vllm.core.scheduler", "vllm.core.block_manager_v1", "vllm.config"):
        logging.getLogger(name).propagate = False
        for h in list(logging.getLogger(name).handlers):
            if h is not kit.LOG:
                logging.getLogger(name).removeHandler(h)

    with open(args.inp) as f:
        scenarios = json.load(f)["scenarios"]
    t0 = time.perf_counter()
    traces = [run_scenario(kit, s) for s in scenarios]
    with open(args.out, "w") as f:
        json.dump({"vllm_version": vllm.__version__, "seconds": time.perf_counter() - t0, "traces": traces}, f)


if __name__ == "__main__":
    main()
