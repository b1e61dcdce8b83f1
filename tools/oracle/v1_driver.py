"""Runs v1 conformance scenarios through vLLM 0.33.0's real scheduler.

Runs INSIDE the oracle venv (started by tools/oracle/launch.py, never imported by
the project). Reads one JSON document on stdin::

    {"scenarios": [<scenario>, ...]}          # format: tests/conformance/v1_scenario.py

and prints one JSON document on stdout::

    {"vllm_version": "0.33.0", "traces": [<trace>, ...]}   # format: tests/conformance/v1_play.py

With `--serve` it answers one scenario per line instead (see serve()).

The replay loop is the project's own `tests/conformance/v1_play.py`, loaded by
path, so both sides are driven by identical code; this file only adapts vLLM.

Pre-fix guard (`config.prefix_guard`): `Scheduler._request_blocks_can_be_freed`
answers True when its caller is `schedule()` (the preemption loop's fence check
is disabled) and the real answer otherwise (the free path keeps deferring).
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
import types
from pathlib import Path

# vLLM logs to stdout; keep fd 1 for our one JSON document and send everything
# else (Python and C level) to stderr.
_RESULT_OUT = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
sys.stdout = sys.stderr

REPO = Path(os.environ.get("DISAGG_SIM_REPO") or Path(__file__).resolve().parents[2])
KIT_DIR = os.environ.get("DISAGG_SIM_ORACLE_KIT") or str(REPO / "tools" / "oracle" / "kit")
sys.path.insert(0, KIT_DIR)
sys.path.insert(0, str(REPO / "tests" / "conformance"))

_t0 = time.perf_counter()
import v1_play  # noqa: E402
import v1_scenario  # noqa: E402
import vllm  # noqa: E402
import vllm_scheduler_kit as kit  # noqa: E402
from pd_worker import ordered_ids  # noqa: E402
from vllm.config import KVTransferConfig  # noqa: E402
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import RequestStatus  # noqa: E402

IMPORT_SECONDS = time.perf_counter() - _t0
_REAL_MODEL_CONFIG = kit.ModelConfig
_REAL_VLLM_CONFIG = kit.VllmConfig
# The harness connector (tools/oracle/pd_oracle_connector.py), loaded by vLLM's factory.
sys.path.insert(0, str(Path(__file__).resolve().parent))


def _prefix_guard_answer(self, request) -> bool:
    """Pre-#49675 preemption loop: the retry never consults the fence."""
    if sys._getframe(1).f_code.co_name == "schedule":
        return True
    return type(self)._request_blocks_can_be_freed(self, request)


def create_vllm_scheduler(config: dict, force_defer_block_free=None, prefix_guard=False):
    """A real Scheduler/AsyncScheduler for a scenario config (also used by the benchmark)."""
    # The kit does not pass max_model_len to ModelConfig, so the scheduler would
    # use the OPT config's 2048; pin the scenario's value where vLLM reads it.
    kit.ModelConfig = functools.partial(_REAL_MODEL_CONFIG, max_model_len=config["max_model_len"])
    kv = config.get("kv")
    if kv is not None:
        kit.VllmConfig = functools.partial(
            _REAL_VLLM_CONFIG,
            kv_transfer_config=KVTransferConfig(
                kv_connector="PDHarnessConnector",
                kv_connector_module_path="pd_oracle_connector",
                kv_role=kv["role"],
                kv_load_failure_policy=kv["load_failure_policy"],
                engine_id="harness",
            ),
        )
    try:
        sched = kit.create_scheduler(
            max_num_seqs=config["max_num_seqs"],
            max_num_batched_tokens=config["max_num_batched_tokens"],
            enable_chunked_prefill=config["enable_chunked_prefill"],
            long_prefill_token_threshold=config["long_prefill_token_threshold"],
            num_blocks=config["num_blocks"],
            block_size=config["block_size"],
            max_model_len=config["max_model_len"],
            async_scheduling=config["async_scheduling"],
            policy=config["policy"],
            enable_prefix_caching=config.get("enable_prefix_caching", False),
        )
    finally:
        kit.ModelConfig = _REAL_MODEL_CONFIG
        kit.VllmConfig = _REAL_VLLM_CONFIG
    assert sched.max_model_len == config["max_model_len"], sched.max_model_len
    if force_defer_block_free:
        # As vLLM's own tests do: the production gate needs a consumer connector
        # and max_concurrent_batches > 1, which the CPU platform never yields.
        sched.defer_block_free = True
    elif kv is not None:
        # The same reason: with a connector the CPU platform's gate may say
        # either; the scenario's flag is the gate's value for its depth.
        sched.defer_block_free = False
    if prefix_guard:
        sched._request_blocks_can_be_freed = types.MethodType(_prefix_guard_answer, sched)
    return sched


class VllmAdapter:
    name = f"vllm-{vllm.__version__}"

    def __init__(self) -> None:
        self.block_size = 16

    def create_scheduler(self, config: dict):
        self.block_size = config["block_size"]
        return create_vllm_scheduler(
            config,
            force_defer_block_free=config["force_defer_block_free"],
            prefix_guard=config["prefix_guard"],
        )

    def create_request(self, spec: dict):
        request = self._create_request(spec)
        if "kv_transfer_params" in spec:
            request.kv_transfer_params = dict(spec["kv_transfer_params"])
        return request

    def _create_request(self, spec: dict):
        return kit.create_requests(
            1,
            num_tokens=spec["prompt_len"],
            max_tokens=spec["max_tokens"],
            stop_token_ids=list(spec["stop_token_ids"]) or None,
            block_size=self.block_size,
            req_ids=[spec["id"]],
            priorities=[spec["priority"]],
            arrival_times=[float(spec["arrival_time"])],
            ignore_eos=spec["ignore_eos"],
            prompt_token_ids=[spec["prompt_token_ids"]] if "prompt_token_ids" in spec else None,
        )[0]

    @staticmethod
    def make_model_runner_output(req_ids: list[str], sampled_token_ids: list[list[int]]):
        return ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
            sampled_token_ids=sampled_token_ids,
            logprobs=None,
            prompt_logprobs_dict={},
            pooler_output=[],
        )

    @staticmethod
    def abort(sched, ids: list[str]) -> None:
        sched.finish_requests(ids, RequestStatus.FINISHED_ABORTED)

    @staticmethod
    def connector_meta(scheduler_output) -> tuple[dict, dict]:
        meta = scheduler_output.kv_connector_metadata
        return dict(meta.reqs_to_recv), dict(meta.reqs_to_send)

    @staticmethod
    def attach_kv_output(model_runner_output, report: dict) -> None:
        fields = {
            "finished_sending": ordered_ids(report["finished_sending"]),
            "finished_recving": ordered_ids(report["finished_recving"]),
            "invalid_block_ids": set(report["invalid_block_ids"]),
        }
        if "failed_recving" in KVConnectorOutput.__dataclass_fields__:
            fields["failed_recving"] = ordered_ids(report["failed_recving"]) or set()
        elif report["failed_recving"]:
            # vLLM 0.29.0 has no per-request load failures: the scenario cannot run there.
            raise RuntimeError(f"vLLM {vllm.__version__}'s KVConnectorOutput has no failed_recving")
        model_runner_output.kv_connector_output = KVConnectorOutput(**fields)


def serve() -> None:
    """`--serve`: one scenario per stdin line, one trace per stdout line, until EOF
    (the shrinker replays hundreds of variants without paying vLLM's import again)."""
    adapter = VllmAdapter()
    _RESULT_OUT.write(json.dumps({"ready": True, "vllm_version": vllm.__version__}) + "\n")
    _RESULT_OUT.flush()
    for line in sys.stdin:
        if not line.strip():
            continue
        scenario = json.loads(line)
        try:
            v1_scenario.validate(scenario)
            answer = v1_play.play(scenario, adapter)
        except v1_scenario.ScenarioError as exc:
            answer = {"id": scenario.get("id"), "invalid": str(exc)}
        _RESULT_OUT.write(json.dumps(answer) + "\n")
        _RESULT_OUT.flush()


def main() -> None:
    if "--serve" in sys.argv[1:]:
        serve()
        return
    payload = json.load(sys.stdin)
    adapter = VllmAdapter()
    traces = []
    t0 = time.perf_counter()
    for scenario in payload["scenarios"]:
        v1_scenario.validate(scenario)
        traces.append(v1_play.play(scenario, adapter))
    result = {
        "vllm_version": vllm.__version__,
        "import_seconds": round(IMPORT_SECONDS, 2),
        "run_seconds": round(time.perf_counter() - t0, 2),
        "traces": traces,
    }
    _RESULT_OUT.write(json.dumps(result))
    _RESULT_OUT.flush()


if __name__ == "__main__":
    main()
