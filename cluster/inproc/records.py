"""The clients' side of the in-process runtime: the proxy's `ClientPort`
written straight into each request's `RequestRecord` (what `vllm bench
serve` would have measured: token arrival times, the first scheduled time,
KV wait, the finish)."""

from __future__ import annotations

from collections.abc import Callable

from engine.records import RequestRecord, WorkloadRequest
from engine.sampler import DeterministicSampler
from engine.token_ids import TokenIds
from node.messages import KVEvent
from proxy.client import Finished

from .observer import RunObserver


class ClientRecords:
    def __init__(self, sampler: DeterministicSampler, observer: RunObserver | None = None) -> None:
        self.sampler = sampler
        self.observer = observer
        self.records: dict[str, RequestRecord] = {}
        self.workload: dict[str, WorkloadRequest] = {}
        # Serving (`bench/serve/driver.py`): ids of requests whose record changed
        # since the server last looked, so it wakes only their handlers. None: off.
        self.touched: set[str] | None = None
        # Called after each finish with the time the client sees it (the load driver's closed loop).
        self.on_finish: Callable[[float], None] | None = None
        # A fleet run's streaming (`InProcCluster(stream=...)`): finished records
        # are handed over in batches of `stream_batch` and forgotten. None: kept.
        self.on_done_batch: Callable[[list[RequestRecord]], None] | None = None
        self.stream_batch = 1024
        self._done: list[RequestRecord] = []
        self.last_finish = 0.0  # the latest finish time (a streamed run's duration)

    def expect(self, w: WorkloadRequest) -> None:
        self.workload[w.request_id] = w

    def forget(self, request_id: str) -> None:
        self.records.pop(request_id, None)
        self.workload.pop(request_id, None)

    # -- the ClientPort -------------------------------------------------------------
    def arrived(self, request_id: str, time: float) -> None:
        w = self.workload[request_id]
        self.records[request_id] = RequestRecord(request_id, time, w.prompt_len, w.output_len, w.priority)

    def scheduled(self, request_id: str, time: float) -> None:
        rec = self.records[request_id]
        if rec.first_scheduled_time is None:
            rec.first_scheduled_time = time
        if self.touched is not None:
            self.touched.add(request_id)

    def tokens(self, request_id: str, token_ids: list[int], time: float) -> None:
        rec = self.records[request_id]
        rec.output_token_ids.extend(token_ids)
        rec.token_times.extend([time] * len(token_ids))
        if self.touched is not None:
            self.touched.add(request_id)

    def token_run(self, request_id: str, first: int, times: list[float]) -> None:
        rec = self.records[request_id]
        out = rec.output_token_ids
        if not isinstance(out, TokenIds):
            out = rec.output_token_ids = TokenIds(out)
        out.add_run(self.sampler.token_at, request_id, rec.prompt_len, first, len(times))
        rec.token_times.extend(times)

    def kv_event(self, event: KVEvent) -> None:
        rec = self.records[event.request_id]
        if event.phase == "start":
            rec.remote_kv_wait_start = event.time
        else:
            rec.remote_kv_wait_end = event.time

    def ttft_breakdown(self, request_id: str, parts: dict[str, float]) -> None:
        self.records[request_id].ttft_breakdown = parts

    def finished(self, event: Finished) -> None:
        rec = self.records[event.request_id]
        rec.finish_time = event.time
        rec.finish_reason = event.reason
        rec.num_preemptions = event.num_preemptions
        if self.touched is not None:
            self.touched.add(event.request_id)
        if self.observer is not None:
            self.observer.on_request_finished(event.node or "proxy", rec)
        if event.time > self.last_finish:
            self.last_finish = event.time
        if self.on_done_batch is not None:
            self._done.append(rec)
            if len(self._done) >= self.stream_batch:
                self.flush_done()
        if self.on_finish is not None:
            self.on_finish(event.time)

    def flush_done(self) -> None:
        """Hand the finished records over and forget them (streaming only)."""
        done, self._done = self._done, []
        if not done or self.on_done_batch is None:
            return
        self.on_done_batch(done)
        for rec in done:
            del self.records[rec.request_id]
            del self.workload[rec.request_id]
