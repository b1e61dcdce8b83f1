"""Our engine's side of the v1 differential harness: the adapter that
`v1_play.play` drives, mirroring `tools/oracle/v1_driver.py` for vLLM.

Mapping of the scenario config onto `engine.testing.create_scheduler`:
- `force_defer_block_free` true  -> `defer_block_free=True` (forced, as vLLM's tests do);
  false -> `defer_block_free=None`, the production gate (off: no consumer connector).
- `prefix_guard` -> `preemption_guard="prefix"` (pre-#49675 loop) vs `"fixed"`.
- `kv` -> a `PDConnector` in `kv.role` with `kv.load_failure_policy`; the fence
  is then forced to the scenario's flag either way (as on the oracle, whose CPU
  platform does not give the production gate's depth).
- `async_scheduling` -> the async scheduler (output placeholders), like vLLM's
  `AsyncScheduler`; the batch-queue depth is the scenario's `drain.depth`.
"""

from __future__ import annotations

from pd_worker import ordered_ids
from v1_play import play

from engine.kv_connector.pd_connector import PDConnectorMetadata
from engine.outputs import KVConnectorOutput, ModelRunnerOutput
from engine.request import RequestStatus
from engine.testing import create_requests, create_scheduler


class OursAdapter:
    name = "disagg-sim"

    @staticmethod
    def create_scheduler(config: dict):
        kv = config.get("kv")
        if config["force_defer_block_free"]:
            defer: bool | None = True
        else:
            defer = False if kv is not None else None
        return create_scheduler(
            max_num_seqs=config["max_num_seqs"],
            max_num_batched_tokens=config["max_num_batched_tokens"],
            enable_chunked_prefill=config["enable_chunked_prefill"],
            long_prefill_token_threshold=config["long_prefill_token_threshold"],
            num_blocks=config["num_blocks"],
            block_size=config["block_size"],
            max_model_len=config["max_model_len"],
            async_scheduling=config["async_scheduling"],
            policy=config["policy"],
            defer_block_free=defer,
            preemption_guard="prefix" if config["prefix_guard"] else "fixed",
            enable_prefix_caching=config.get("enable_prefix_caching", False),
            kv_role=kv["role"] if kv is not None else None,
            kv_load_failure_policy=kv["load_failure_policy"] if kv is not None else "fail",
        )

    @staticmethod
    def create_request(spec: dict):
        request = OursAdapter._create_request(spec)
        if "kv_transfer_params" in spec:
            request.kv_transfer_params = dict(spec["kv_transfer_params"])
        return request

    @staticmethod
    def _create_request(spec: dict):
        return create_requests(
            1,
            num_tokens=spec["prompt_len"],
            max_tokens=spec["max_tokens"],
            stop_token_ids=list(spec["stop_token_ids"]) or None,
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
        )

    @staticmethod
    def abort(sched, ids: list[str]) -> None:
        sched.finish_requests(ids, RequestStatus.FINISHED_ABORTED)

    @staticmethod
    def connector_meta(scheduler_output) -> tuple[dict, dict]:
        meta = scheduler_output.kv_connector_metadata
        assert isinstance(meta, PDConnectorMetadata)
        recv = {rid: list(spec.local_block_ids) for rid, spec in meta.reqs_to_recv.items()}
        return recv, dict(meta.reqs_to_send)

    @staticmethod
    def attach_kv_output(model_runner_output, report: dict) -> None:
        model_runner_output.kv_connector_output = KVConnectorOutput(
            finished_sending=ordered_ids(report["finished_sending"]),
            finished_recving=ordered_ids(report["finished_recving"]),
            failed_recving=ordered_ids(report["failed_recving"]),
            invalid_block_ids=set(report["invalid_block_ids"]),
        )


def run_ours(scenarios: list[dict]) -> list[dict]:
    adapter = OursAdapter()
    return [play(s, adapter) for s in scenarios]
