"""The proxy's side of node outputs on the in-process runtime: their trip
over the proxy link, the client's records (tokens and their arrival times,
the first scheduled time, KV wait times), the hand-over of a finished
prompt from a prefill node to a decode node, and a request's finish. The
steady-decode fast-forward's outputs come in bulk (`_steady_outputs`) and
their tokens are kept as runs (token_runs.py). A mixin of `InProcCluster`,
kept apart from the load driver, the node set-up and faults."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.outputs import SteadyTokens
from engine.records import RequestRecord
from node.messages import KVEvent, NodeEvent, OutputEvent
from node.role import NodeRole

if TYPE_CHECKING:
    from .cluster import InProcCluster

OUTPUT_BYTES = 64


class ProxyOutputsMixin:
    # `self` is an InProcCluster: the attributes used here are its own.
    def _from_node(self: InProcCluster, name: str, events: list[NodeEvent]) -> None:
        now = self.loop.now()
        n = len(events)
        if events and type(events[0]) is SteadyTokens:  # one output per request it names
            n += len(events[0].request_ids) - 1
        arrival = self._proxy_links[name][1].transit(now, OUTPUT_BYTES * n)
        if arrival is None:
            self.loop.call_soon(self._connection_broken, name)
            return
        self.loop.at(arrival, self._proxy_receive, self.nodes[name], events)

    def _proxy_receive(self: InProcCluster, node: NodeRole, events: list[NodeEvent]) -> None:
        now = self.loop.now()
        if self.touched is not None:  # once per batch, not per token
            self.touched.update([ev.request_id for ev in events])
        decoding = node.role != "prefill"
        node_of = self._node_of
        if events and type(events[0]) is SteadyTokens:
            steady = events[0]
            self._record_runs(node, steady.request_ids, [now], None)
            events = events[1:]
        runs = self._token_runs if self._token_runs.has_open() else None
        for ev in events:
            if runs is not None:
                runs.close(ev.request_id)  # its record is about to be read or written
            rec = self.records.get(ev.request_id)
            if rec is None or rec.finish_reason is not None:
                if type(ev) is OutputEvent and not decoding and ev.kv_transfer_params and ev.finish_reason == "length":
                    # A prompt finished for a request that ended meanwhile (its
                    # client went away): the prefill node need not hold it.
                    self._release_held(node, ev.request_id)
                continue
            if node_of.get(ev.request_id) is not node:
                # Not the node the request is routed to (any more): a killed
                # decode node's last tokens, after the request moved on.
                self.events_rejected += 1
                continue
            if decoding and type(ev) is OutputEvent and ev.finish_reason is None:
                # The common case, once per token: tokens from a decode node.
                if rec.first_scheduled_time is None:
                    rec.first_scheduled_time = ev.first_scheduled_time
                rec.output_token_ids.extend(ev.new_token_ids)
                rec.token_times.extend([now] * len(ev.new_token_ids))
                continue
            if isinstance(ev, KVEvent):
                if ev.phase == "start":
                    rec.remote_kv_wait_start = ev.time
                    self._log("pull_start", ev.request_id, node.name)
                else:
                    rec.remote_kv_wait_end = ev.time
                    self._log("pull_end", ev.request_id, ev.ok)
                continue
            self._on_output(node, rec, ev, now)

    def _steady_outputs(
        self: InProcCluster,
        node: NodeRole,
        ids: list[str],
        ends: list[float],
        sizes: list[int],
        finished: dict[int, list[OutputEvent]],
    ) -> None:
        """What `_from_node` and `_proxy_receive` do for the outputs of
        forwarded steps (fast_forward.py): one proxy-link transit per step at
        its end (`sizes`: its outputs), the requests' tokens (one per step
        until each finishes), and each step's finishing outputs (`finished`,
        by step) through `_proxy_receive` when the step ends. Tokens are recorded at the end
        of the first step, before any finish (the proxy's receipt of the
        outputs before these is due now)."""
        line = self._proxy_links[node.name][1]
        arrivals = line.transit_all(ends, [OUTPUT_BYTES * n for n in sizes])  # ideal: arrival == t
        assert arrivals == ends, "the fast-forward runs only over an ideal proxy link"
        # A request finishing in these steps gets its last token with its finish.
        finishing = {ev.request_id: j - 1 for j, events in finished.items() for ev in events}
        self.loop.at(ends[0], self._record_runs, node, ids, ends, finishing or None)
        for j, events in finished.items():
            self.loop.at(ends[j - 1], self._proxy_receive, node, events)

    def _record_runs(
        self: InProcCluster,
        node: NodeRole,
        ids: list[str],
        times: list[float],
        finishing: dict[str, int] | None,
    ) -> None:
        """One token per request and step at `times` (a request in
        `finishing`: only the first `finishing[id]`), as `_proxy_receive`
        records token outputs, kept as runs (token_runs.py)."""
        self._token_runs.receive(node, ids, times, finishing)

    def _on_output(self: InProcCluster, node: NodeRole, rec: RequestRecord, ev: OutputEvent, now: float) -> None:
        if rec.first_scheduled_time is None:
            rec.first_scheduled_time = ev.first_scheduled_time
        if node.role == "prefill":
            if ev.finish_reason is None:
                return  # the prefill's own token is not streamed: decode resamples it
            if ev.kv_transfer_params and ev.finish_reason == "length":
                w = self._workload[ev.request_id]
                self._prefill_of[ev.request_id] = node  # type: ignore[assignment]
                if self.decode_router is None:
                    self._release_at_prefill(ev.request_id)
                    self._finish(ev.request_id, "error", "no live decode node")
                    return
                dnode = self._pick(self.decode_router, w)
                self._log("to_decode", ev.request_id, dnode.name)
                self._send(dnode, self._message(w, w.output_len, dict(ev.kv_transfer_params)))
                return
            # The prompt's first token already ended it (EOS): no handoff; the
            # client gets that token from the prefill.
            if ev.finish_reason == "stop":
                rec.output_token_ids.extend(ev.new_token_ids)
                rec.token_times.extend([now] * len(ev.new_token_ids))
            self._finish(ev.request_id, ev.finish_reason or "error")
            return
        rec.output_token_ids.extend(ev.new_token_ids)
        rec.token_times.extend([now] * len(ev.new_token_ids))
        if ev.finish_reason is not None:
            rec.num_preemptions = ev.num_preemptions
            why = ""
            if ev.kv_transfer_params and "rejected" in ev.kv_transfer_params:
                why = f"rejected by {node.name}: {ev.kv_transfer_params['rejected']}"
                self._log("rejected", ev.request_id, ev.kv_transfer_params["rejected"])
            self._finish(ev.request_id, ev.finish_reason, why or f"{node.name} finished it with an error")

    def _finish(self: InProcCluster, request_id: str, reason: str, why: str = "") -> None:
        self._token_runs.close(request_id)
        rec = self.records[request_id]
        if rec.finish_reason is not None:
            return
        if reason == "error":
            self.failures[request_id] = why or "error"
        rec.finish_time = self.loop.now()
        rec.finish_reason = reason
        if self.touched is not None:
            self.touched.add(request_id)
        self._log("finish", request_id, reason, len(rec.output_token_ids))
        if self.observer is not None:
            node = self._node_of.get(request_id)
            self.observer.on_request_finished(node.name if node else "proxy", rec)
        self._in_flight -= 1
        if self._backlog:
            self._arrive(self._backlog.pop(0))
