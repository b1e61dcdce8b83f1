"""The proxy: the third role, written once and driven by both runtimes
(vLLM's disaggregated proxy). Free of I/O: it reacts to what reaches it
(a client's request or abort, a node's events, a node's death) and acts
through its ports (proxy/ports.py).

The P/D request flow: a request goes to a prefill node with `max_tokens=1`
and `do_remote_decode`; when its prompt is done the prefill node answers
with `kv_transfer_params` and keeps the blocks, and the request goes with
those params to a decode node, whose tokens stream to the client. Without
prefill nodes a request goes straight to a decode node. Routing is per pool,
each pool with its own policy (proxy/routing.py); the load-reading policies
count the requests outstanding at each node and their prompt blocks as the
proxy knows them (it cannot look into a node, in-process or on Ray, so both
runtimes route alike).

A node's events count only for the requests routed to that node; others
are dropped (`events_rejected`). The proxy's half of the fault policy: when
a node dies, its prompts fail (finish reason "error") and its decode
requests go to a live decode node, computed there from scratch (their
prompt plus the tokens the client already has; sampling is per position,
so the stream continues exactly), and the prefill node holding their blocks
is told to release them; with no decode node left they fail.

A client that goes away (`abort`): the request finishes "abort" at once,
the node that has it is told to abort it in its engine (`AbortMessage`, on
the same ordered link as its request), and a prefill node holding its
prompt is told to release it — also when the prompt finishes after the
abort (its output finds the request gone).
"""

from __future__ import annotations

from engine.front_end import OutputStream
from node.messages import KVEvent, NodeEvent, OutputEvent

from .breakdown import breakdown
from .dispatch import RequestDispatch
from .ports import ProxyPorts, ProxySettings
from .requests import ProxiedRequest
from .token_runs import FirstScheduled, TokenRuns


class Proxy(RequestDispatch):
    """The proxy: `RequestDispatch` (proxy/dispatch.py) routes requests and
    finishes them; this class takes what nodes send back and streams it to
    the clients."""

    def __init__(self, settings: ProxySettings, ports: ProxyPorts) -> None:
        super().__init__(settings, ports)
        self._runs = TokenRuns(self)

    # -- node events --------------------------------------------------------------------
    def on_node_events(self, node: str, events: list[NodeEvent]) -> None:
        """A node's events, in order, as they came off its link."""
        now = self.now()
        client = self.client
        is_prefill = node in self._prefill_set
        runs = self._runs if self._runs.has_open() else None
        requests = self.requests
        seen = self._batch_visible_at(node, now, events)
        for ev in events:
            rid = ev.request_id
            if runs is not None:
                runs.close(rid)  # what the client has of it is about to change
            req = requests.get(rid)
            if req is None or req.done:
                if is_prefill and type(ev) is OutputEvent and ev.kv_transfer_params and ev.finish_reason == "length":
                    # A prompt finished for a request that ended meanwhile
                    # (its client went away): the prefill node need not hold it.
                    self._release_held(node, rid)
                continue
            if req.node != node:
                # Not routed there (any more): a dead decode node's last
                # tokens, or a node speaking of another node's request.
                self.events_rejected += 1
                continue
            if isinstance(ev, KVEvent):
                if not req.delivered:
                    req.marks["decode_queue" if ev.phase == "start" else "transfer"] = ev.time
                client.kv_event(ev)
                if self._log is not None:
                    self._log(*(("pull_start", rid, node) if ev.phase == "start" else ("pull_end", rid, ev.ok)))
                continue
            if not req.sched_sent:
                self.first_scheduled(req, ev.first_scheduled_time)
            if not req.delivered:
                self.mark_scheduled(req, is_prefill, ev.first_scheduled_time)
            if not is_prefill and ev.finish_reason is None:
                # The common case, once per token: tokens from a decode node.
                tokens = ev.new_token_ids
                if tokens:
                    if not req.delivered:
                        self.first_token(req, now, seen)
                    req.delivered += len(tokens)
                    if seen > req.seen:
                        req.seen = seen
                    client.tokens(rid, tokens, req.seen)
                continue
            self._on_output(node, is_prefill, req, ev, now, seen)

    def output_stream(self, node: str) -> OutputStream:
        """The API server's output side in front of `node` (one per node)."""
        stream = self._streams.get(node)
        if stream is None:
            stream = self._streams[node] = self.front_end.output_stream()
        return stream

    def _batch_visible_at(self, node: str, now: float, events: list[NodeEvent]) -> float:
        """When the client sees the tokens of the node's outputs that reached
        the proxy at `now`: its API server streams every token of the batch
        (passed on or not: it detokenizes what its engine emits), after the
        batches before (engine/front_end.py, `OutputStream`)."""
        stream = self.output_stream(node)
        if stream.is_off:
            return now
        n = 0
        for ev in events:
            if type(ev) is OutputEvent:
                n += len(ev.new_token_ids)
        if not n:
            return now
        # A bulk receipt at `now` may have served this batch already (token_runs.py).
        seen = stream.pending.pop(now, None)
        return stream.batch_visible_at(now, n) if seen is None else seen

    def on_steady_tokens(
        self,
        node: str,
        ids: list[str],
        times: list[float],
        finishing: dict[str, int] | None,
        first_scheduled: FirstScheduled,
        event_tokens: dict[int, int] | None = None,
    ) -> None:
        """The bulk-token interface (the in-process steady-decode paths): one
        token per request in `ids` and per time in `times`, except that a
        request in `finishing` gets only its first `finishing[id]` here (its
        last comes with its finish event). `first_scheduled` gives the node's
        first scheduled time of a request it names; `event_tokens[i]` the
        tokens of the node's outputs that reach `on_node_events` at
        `times[i]` (the same batch of outputs, for the API server)."""
        self._runs.receive(node, ids, times, finishing, first_scheduled, event_tokens)

    def flush_token_runs(self) -> None:
        """Hand every open token run to the client (at the end of a run)."""
        self._runs.close_all()

    def reject_events(self, n: int) -> None:
        self.events_rejected += n

    def first_scheduled(self, req: ProxiedRequest, time: float | None) -> None:
        if time is not None:
            req.sched_sent = True
            self.client.scheduled(req.request_id, time)

    # -- the TTFT breakdown (proxy/breakdown.py) ---------------------------------------
    def mark_scheduled(self, req: ProxiedRequest, is_prefill: bool, time: float | None) -> None:
        """A node first scheduled the request at `time` (its clock), before
        its first token: the end of its queue, or, at the decode node of a
        hand-off, of its admission."""
        if time is None:
            return
        req.marks["decode_admission" if not is_prefill and "prefill" in req.marks else "queue"] = time

    def first_token(self, req: ProxiedRequest, now: float, seen: float) -> None:
        """The request's first token reached the proxy at `now` and the
        client at `seen` (the API server's streaming, `to_client`): its TTFT's
        parts go to the client."""
        req.marks["first_decode_step" if "prefill" in req.marks else "prefill"] = now
        self.client.ttft_breakdown(req.request_id, breakdown(req.arrival, req.marks, seen))

    def _on_output(
        self, node: str, is_prefill: bool, req: ProxiedRequest, ev: OutputEvent, now: float, seen: float
    ) -> None:
        rid, reason, params = req.request_id, ev.finish_reason, ev.kv_transfer_params
        if is_prefill:
            if reason is None:
                return  # the prefill's own token is not streamed: decode resamples it
            self._release(req)
            if params and reason == "length":
                req.prefill_node = node
                # The prefill's reply with kv_transfer_params back through the
                # proxy, then the second request to a decode instance.
                req.marks["prefill"] = now
                sent = req.marks["proxy_decode_request"] = now + self.timeline.handoff_s
                self._after(sent - now, req, "decode", req.output_len, dict(params), event="to_decode")
                return
            # A first token that is EOS ends the request at the prefill node:
            # no hand-off; the client gets that token.
            if reason == "stop" and ev.new_token_ids:
                self._finish(req, reason, at=self._tokens(req, ev.new_token_ids, now, seen))
                return
            self._finish(req, reason or "error")
            return
        # A decode node's unfinished outputs never come here (on_node_events streams them).
        assert reason is not None
        if ev.new_token_ids:
            seen = self._tokens(req, ev.new_token_ids, now, seen)
        else:
            # Nothing to stream: the finish goes out at once, after the tokens the client has.
            seen = now if now > req.seen else req.seen
        why = ""
        if reason == "error":
            if params and "rejected" in params:
                why = f"rejected by {node}: {str(params['rejected'])[:200]}"
                if self._log is not None:
                    self._log("rejected", rid, params["rejected"])
            else:
                why = f"{node} finished it with an error"
        # The finish rides the last token's chunk: the client sees it then.
        self._finish(req, reason, ev.num_preemptions, why, at=seen)

    def _tokens(self, req: ProxiedRequest, tokens: list[int], now: float, seen: float) -> float:
        """Pass `tokens` on; the client's time of them (not before its last)."""
        if not req.delivered:
            self.first_token(req, now, seen)
        req.delivered += len(tokens)
        if seen > req.seen:
            req.seen = seen
        self.client.tokens(req.request_id, tokens, req.seen)
        return req.seen
