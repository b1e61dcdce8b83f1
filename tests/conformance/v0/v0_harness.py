"""The v0 differential harness: the same scenarios step by step through vLLM
0.5.3.post1's real scheduler (in its own interpreter, one subprocess for all
scenarios) and through engine/v0 (via the v1-shaped adapter), then a
field-by-field comparison of every step.

Per step both sides record: scheduled groups in order with token counts and
prefill flag, `num_batched_tokens`, `num_prefill_groups`, preempted groups with
their mode (in victim order), swap-in / swap-out block counts, ignored and
finished requests, the three queues in order, free GPU / CPU blocks, and the
scheduler's warning lines; plus the error that aborted the run, if any.

Run directly:  python tests/conformance/v0/v0_harness.py [--count N] [--seed S]
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from engine.outputs import ModelRunnerOutput  # noqa: E402
from engine.request import Request, SamplingParams  # noqa: E402
from engine.v0 import CacheConfig, SchedulerConfig, V0SchedulerAdapter  # noqa: E402
from engine.v0.loglines import LOGGER_NAME  # noqa: E402

DRIVER = REPO / "tools" / "oracle" / "v0_driver.py"
DEFAULT_ORACLE_PYTHON = Path.home() / ".cache" / "disagg-sim" / "vllm-v0-oracle" / "bin" / "python"


def oracle_python() -> Path:
    return Path(os.environ.get("DISAGG_SIM_ORACLE_V0", DEFAULT_ORACLE_PYTHON))


def kit_dir() -> Path:
    """The oracle kit: the in-repo copy (tools/oracle/kit) unless overridden."""
    return Path(os.environ.get("DISAGG_SIM_ORACLE_KIT_DIR", REPO / "tools" / "oracle" / "kit"))


def oracle_missing_reason() -> str | None:
    """None when the oracle can run, else why not (for pytest.skip)."""
    py = oracle_python()
    if not py.exists():
        return (
            f"v0 oracle absent: {py} does not exist (build it with tools/conformance_v0.sh or "
            f"{kit_dir() / 'build-v0.sh'}; or set DISAGG_SIM_ORACLE_V0)"
        )
    kit = kit_dir() / "v0_scheduler_kit.py"
    if not kit.exists():
        return f"v0 oracle kit absent: {kit} does not exist (unset DISAGG_SIM_ORACLE_KIT_DIR)"
    return None


def _oracle_env() -> dict[str, str]:
    # The same as the kit's env.sh: offline, caches out of $HOME.
    home = Path(os.environ.get("ORACLE_HOME", Path.home() / ".cache" / "disagg-sim" / "vllm-oracle-home"))
    home.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.update(
        {
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "HF_HOME": str(home / "hf"),
            "VLLM_CACHE_ROOT": str(home / "vllm-cache"),
            "VLLM_CONFIG_ROOT": str(home / "vllm-config"),
            "XDG_CACHE_HOME": str(home / "xdg-cache"),
            "XDG_CONFIG_HOME": str(home / "xdg-config"),
            "TORCHINDUCTOR_CACHE_DIR": str(home / "inductor"),
            "TRITON_CACHE_DIR": str(home / "triton"),
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "VLLM_TARGET_DEVICE": "cpu",
            "VLLM_LOGGING_LEVEL": "WARNING",
        }
    )
    env.pop("PYTHONPATH", None)
    return env


# How long the one oracle call may take; the conformance test gives pytest this bound too.
ORACLE_TIMEOUT_S = 600.0


def run_oracle(scenarios: list[dict], timeout: float = ORACLE_TIMEOUT_S) -> dict:
    """All scenarios in ONE subprocess (importing vLLM costs seconds)."""
    with tempfile.TemporaryDirectory(prefix="v0-oracle-") as tmp:
        inp, out = Path(tmp) / "scenarios.json", Path(tmp) / "traces.json"
        inp.write_text(json.dumps({"scenarios": scenarios}))
        proc = subprocess.run(
            [
                str(oracle_python()),
                str(DRIVER),
                "--kit-dir",
                str(kit_dir()),
                "--in",
                str(inp),
                "--out",
                str(out),
            ],
            env=_oracle_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"v0 oracle driver failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
        return json.loads(out.read_text())


class _WarningCapture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno == logging.WARNING:
            self.messages.append(record.getMessage())


def run_ours(scenario: dict) -> dict:
    cfg = scenario["config"]
    adapter = V0SchedulerAdapter(
        SchedulerConfig(
            max_num_batched_tokens=cfg["max_num_batched_tokens"],
            max_num_seqs=cfg["max_num_seqs"],
            max_model_len=cfg["max_model_len"],
            enable_chunked_prefill=cfg["enable_chunked_prefill"],
            preemption_mode=cfg["preemption_mode"],
        ),
        CacheConfig(
            num_gpu_blocks=cfg["num_gpu_blocks"], num_cpu_blocks=cfg["num_cpu_blocks"], block_size=cfg["block_size"]
        ),
        log_startup=False,
    )
    sched = adapter.scheduler
    token_id = scenario.get("token_id", 7)
    arrivals: dict[int, list[dict]] = {}
    for r in scenario["requests"]:
        arrivals.setdefault(r["arrival_step"], []).append(r)
    last_arrival = max(arrivals) if arrivals else 0
    capture = _WarningCapture()
    log = logging.getLogger(LOGGER_NAME)
    log.addHandler(capture)
    steps, error, error_step = [], None, None
    try:
        for i in range(scenario["max_steps"]):
            for r in arrivals.get(i, []):
                adapter.add_request(
                    Request(
                        r["id"],
                        list(range(r["prompt_len"])),
                        SamplingParams(max_tokens=r["max_tokens"], ignore_eos=True),
                        arrival_time=r["arrival_time"],
                    )
                )
            if not sched.has_unfinished_seqs() and i >= last_arrival:
                break
            n_warnings = len(capture.messages)
            try:
                so = adapter.schedule(now=float(i))
            except Exception as e:  # the same abort vLLM raises (e.g. out of swap space)
                error, error_step = f"{type(e).__name__}: {e}", i
                break
            outs = adapter.last_scheduler_outputs
            req_ids = list(so.num_scheduled_tokens)
            sampled = [[] if adapter.requests[rid].is_prefill_chunk else [token_id] for rid in req_ids]
            result = adapter.update_from_output(
                so, ModelRunnerOutput(req_ids, {r: k for k, r in enumerate(req_ids)}, sampled)
            )
            ignored = [g.request_id for g in outs.ignored_seq_groups]
            steps.append(
                {
                    "step": i,
                    "scheduled": [
                        [s.seq_group.request_id, s.token_chunk_size, k < outs.num_prefill_groups]
                        for k, s in enumerate(outs.scheduled_seq_groups)
                    ],
                    "num_batched_tokens": outs.num_batched_tokens,
                    "num_prefill_groups": outs.num_prefill_groups,
                    "preempted": [[rid, mode] for rid, mode in _victims(outs)],
                    "num_preempted": outs.preempted,
                    "swap_in_blocks": len(outs.blocks_to_swap_in),
                    "swap_out_blocks": len(outs.blocks_to_swap_out),
                    "ignored": ignored,
                    "finished": [o.request_id for o in result[0].outputs if o.finished and o.request_id not in ignored],
                    "waiting": [g.request_id for g in sched.waiting],
                    "running": [g.request_id for g in sched.running],
                    "swapped": [g.request_id for g in sched.swapped],
                    "free_gpu_blocks": adapter.get_num_free_gpu_blocks(),
                    "free_cpu_blocks": adapter.get_num_free_cpu_blocks(),
                    "warnings": capture.messages[n_warnings:],
                }
            )
    finally:
        log.removeHandler(capture)
    return {
        "name": scenario["name"],
        "steps": steps,
        "error": error,
        "error_step": error_step,
        "counters": adapter.counters(),
    }


def _victims(outs) -> list[tuple[str, str]]:
    # The oracle records victims in preemption order; ours keeps one list per mode,
    # and a pass preempts in a single mode (the mode is a scheduler-wide setting).
    return [(g.request_id, "RECOMPUTE") for g in outs.preempted_seq_groups] + [
        (g.request_id, "SWAP") for g in outs.swapped_out_seq_groups
    ]


def compare(scenario: dict, ours: dict, theirs: dict) -> list[str]:
    """Human-readable differences; empty when the traces agree."""
    name = scenario["name"]
    diffs = []
    for k, (a, b) in enumerate(zip(ours["steps"], theirs["steps"])):
        for key in b:
            if a.get(key) != b[key]:
                diffs.append(f"{name} step {k} field {key!r}: ours={a.get(key)!r} vllm={b[key]!r}")
        if diffs:
            return diffs  # later steps only repeat the first divergence
    if len(ours["steps"]) != len(theirs["steps"]):
        diffs.append(f"{name}: ours ran {len(ours['steps'])} steps, vllm {len(theirs['steps'])}")
    for key in ("error", "error_step"):
        if ours[key] != theirs[key]:
            diffs.append(f"{name} {key}: ours={ours[key]!r} vllm={theirs[key]!r}")
    return diffs


def run_all(scenarios: list[dict]) -> tuple[list[str], dict]:
    """(differences, summary) over all scenarios."""
    oracle = run_oracle(scenarios)
    diffs: list[str] = []
    summary = {
        "scenarios": len(scenarios),
        "steps": 0,
        "preemptions": 0,
        "swap_outs": 0,
        "ignored": 0,
        "aborted_runs": 0,
        "oracle_seconds": round(oracle.get("seconds", 0.0), 2),
        "vllm_version": oracle["vllm_version"],
    }
    for scenario, theirs in zip(scenarios, oracle["traces"]):
        assert theirs["name"] == scenario["name"]
        ours = run_ours(scenario)
        diffs.extend(compare(scenario, ours, theirs))
        summary["steps"] += len(theirs["steps"])
        summary["preemptions"] += sum(len(s["preempted"]) for s in theirs["steps"])
        summary["swap_outs"] += sum(1 for s in theirs["steps"] for _, m in s["preempted"] if m == "SWAP")
        summary["ignored"] += sum(len(s["ignored"]) for s in theirs["steps"])
        summary["aborted_runs"] += theirs["error"] is not None
    return diffs, summary


def main(argv: list[str] | None = None) -> int:
    import argparse

    from v0_scenarios import hand_written_scenarios, random_scenarios

    ap = argparse.ArgumentParser(description="v0 differential conformance against vLLM 0.5.3.post1")
    ap.add_argument("--count", type=int, default=240, help="random scenarios (default 240)")
    ap.add_argument("--seed", type=int, default=0, help="first random seed")
    args = ap.parse_args(argv)
    reason = oracle_missing_reason()
    if reason:
        print(reason, file=sys.stderr)
        return 2
    scenarios = hand_written_scenarios() + random_scenarios(args.count, args.seed)
    diffs, summary = run_all(scenarios)
    print(json.dumps(summary))
    for d in diffs[:50]:
        print(d)
    print(f"{len(diffs)} differences in {len(scenarios)} scenarios")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
