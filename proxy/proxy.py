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

import logging
from collections.abc import Iterable

from engine.front_end import OutputStream
from node.messages import (
    AbortMessage,
    KVEvent,
    NodeEvent,
    OutputEvent,
    ProxyMessage,
    ReleaseMessage,
    RequestMessage,
)

from .breakdown import breakdown
from .client import Finished, Submission
from .ports import KVTransferParams, ProxyPorts, ProxySettings
from .requests import ProxiedRequest
from .routing import PREFIX_POLICIES, PrefixIndex, Router
from .token_runs import FirstScheduled, TokenRuns

logger = logging.getLogger(__name__)

ROLES = ("prefill", "decode")


class Proxy:
    def __init__(self, settings: ProxySettings, ports: ProxyPorts) -> None:
        if not settings.decode:
            raise ValueError("the proxy needs at least one decode node")
        self.settings = settings
        self.now = ports.now
        self._send = ports.send
        self.client = ports.client
        self._log = ports.log
        self._call_later = ports.call_later
        self.timeline = settings.timeline
        self.front_end = settings.front_end
        self._prefill_set = set(settings.prefill)
        self._streams: dict[str, OutputStream] = {}  # node -> its API server's output side
        self.dead: set[str] = set()
        self.outstanding: dict[str, int] = {n: 0 for n in settings.prefill + settings.decode}
        # Prompt blocks of the requests outstanding at each node: its KV usage as the proxy estimates it.
        self.active_blocks: dict[str, int] = dict.fromkeys(self.outstanding, 0)
        self.requests: dict[str, ProxiedRequest] = {}  # in flight
        self.failures: dict[str, str] = {}  # request id -> why it finished with "error"
        self.rerouted: dict[str, int] = {}  # request id -> times re-routed to a live decode node
        self.routed: dict[str, int] = dict.fromkeys(self.outstanding, 0)  # node -> requests sent there
        self.events_rejected = 0  # node events about requests not routed to that node
        self.requests_aborted = 0  # requests whose client went away
        # Prefix-aware routing's memory per pool (kept when routers are rebuilt).
        self._prefix_index: dict[str, PrefixIndex[str]] = {role: PrefixIndex() for role in ROLES}
        self.routers: dict[str, Router[str] | None] = {}
        self._rebuild_routers()
        self._runs = TokenRuns(self)

    def _rebuild_routers(self) -> None:
        s = self.settings
        load = self.outstanding.__getitem__
        active = self.active_blocks
        for role, names in (("prefill", s.prefill), ("decode", s.decode)):
            live = [n for n in names if n not in self.dead]
            capacity = s.pool_blocks.get(role, 0)

            def kv_usage(node: str, capacity: int = capacity) -> float:
                return active[node] / capacity if capacity else 0.0

            self.routers[role] = (
                Router(live, s.policy(role), load, self._prefix_index[role], kv_usage, s.score_weights)
                if live
                else None
            )

    # -- clients ----------------------------------------------------------------------
    def submit(self, items: Iterable[Submission]) -> None:
        now = self.now()
        admitted = []
        for item in items:
            if item.request_id in self.requests:
                raise ValueError(f"duplicate request id {item.request_id!r}")
            req = self.requests[item.request_id] = ProxiedRequest.of(item, now)
            admitted.append(req)
            self.client.arrived(item.request_id, now)
            if self._log is not None:
                self._log("arrive", item.request_id)
        for req in admitted:
            # The API server's time (parse, template, tokenize, IPC), then, in P/D, the
            # proxy's prompt-only request to a prefill instance.
            ready = req.marks["front_end"] = self.front_end.request_ready_at(now, req.prompt_len)
            if self.settings.prefill:
                sent = req.marks["proxy_prefill_request"] = ready + self.timeline.prefill_request_s
                self._after(sent - now, req, "prefill", 1, {"do_remote_decode": True})
            else:
                self._after(ready - now, req, "decode", req.output_len, None)

    def abort(self, request_id: str) -> bool:
        """The client went away: the request finishes "abort" now; the node
        that has it aborts it in its engine, a prefill node holding its
        prompt releases it. False if it is not in flight."""
        req = self.requests.get(request_id)
        if req is None or req.done:
            return False
        self.requests_aborted += 1
        if req.node and req.node not in self.dead:
            self._send(req.node, AbortMessage([request_id]))
        self._release_at_prefill(req)
        self._finish(req, "abort")
        return True

    # -- routing ----------------------------------------------------------------------
    def _after(
        self,
        delay: float,
        req: ProxiedRequest,
        role: str,
        max_tokens: int,
        params: KVTransferParams | None,
        event: str = "",
    ) -> None:
        """Route `req` after `delay` (the timeline's HTTP legs), if it is still
        in flight then; at once when there is no delay."""
        if delay <= 0:
            self._route(req, role, max_tokens, params, event=event)
            return
        if self._call_later is None:
            raise ValueError("the proxy's timeline has delays but its runtime gave no call_later port")

        def route() -> None:
            if self.requests.get(req.request_id) is req and not req.done:
                self._route(req, role, max_tokens, params, event=event)

        self._call_later(delay, route)

    def _route(
        self,
        req: ProxiedRequest,
        role: str,
        max_tokens: int,
        params: KVTransferParams | None,
        prompt_extra: int = 0,
        event: str = "",
    ) -> None:
        """Send `req` to a node of the `role` pool (`event`: the trace's name
        for this routing, if any; `prompt_extra`: tokens a re-routed request's
        prompt grew by)."""
        self._runs.close(req.request_id)
        router = self.routers[role]
        if router is None:
            self._release_at_prefill(req)
            self._finish(req, "error", why=f"no live {role} node")
            return
        if router.policy in PREFIX_POLICIES:
            node = router.pick(self.settings.prompt_hashes(req.request_id, req.prompt_len, req.prompt_segments))
        else:
            node = router.pick()
        req.node, req.phase, req.counted = node, role, True
        self.outstanding[node] += 1
        req.blocks = -(-(req.prompt_len + prompt_extra) // self.settings.block_size)
        self.active_blocks[node] += req.blocks
        self.routed[node] += 1
        if event and self._log is not None:
            self._log(event, req.request_id, node, *([prompt_extra] if event == "reroute" else []))
        message = RequestMessage(
            req.request_id,
            req.prompt_len + prompt_extra,
            max_tokens,
            req.arrival,
            req.priority,
            params,
            self.settings.ignore_eos if req.ignore_eos is None else req.ignore_eos,
            # A re-routed request's prompt grew by what was streamed: content of its own.
            list(req.prompt_segments) if req.prompt_segments and not prompt_extra else None,
            max(0, req.min_tokens - prompt_extra),
            list(req.stop_token_ids) or None,
        )
        self._send(node, message)

    def deliverable(self, node: str, messages: list[ProxyMessage]) -> list[ProxyMessage]:
        """Messages to `node` that have crossed the link: those the node
        still gets. A request re-routed (or finished) while its message was on
        the way is not delivered; at a node that is gone, its requests fail."""
        if node in self.dead:
            for m in messages:
                if type(m) is RequestMessage:
                    req = self.requests.get(m.request_id)
                    if req is not None and not req.done and req.node == node:
                        self._finish(req, "error", why=f"{node} is gone")
            return []
        requests = self.requests
        return [
            m
            for m in messages
            if type(m) is not RequestMessage or ((req := requests.get(m.request_id)) is not None and req.node == node)
        ]

    def send_failed(self, node: str, request_ids: list[str]) -> None:
        """The node could not take these requests (its process is gone)."""
        for request_id in request_ids:
            req = self.requests.get(request_id)
            if req is not None and not req.done and req.node == node:
                self._finish(req, "error", why=f"{node} could not take it")

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

    def _finish(
        self, req: ProxiedRequest, reason: str, num_preemptions: int = 0, why: str = "", at: float | None = None
    ) -> None:
        """`at`: when the client sees the finish (default: now)."""
        rid = req.request_id
        self._runs.close(rid)
        if reason == "error":
            self.failures[rid] = why or "error"
        req.done = True
        self._release(req)
        del self.requests[rid]
        if self._log is not None:
            self._log("finish", rid, reason, req.delivered)
        self.client.finished(Finished(rid, reason, self.now() if at is None else at, num_preemptions, req.node))

    def _release(self, req: ProxiedRequest) -> None:
        if req.counted:
            req.counted = False
            self.outstanding[req.node] -= 1
            self.active_blocks[req.node] -= req.blocks

    # -- faults -------------------------------------------------------------------------
    def node_died(self, node: str, why: str = "is gone") -> None:
        """`node` is gone to the run (killed, or its connection broke): it
        leaves the routers, its prompts fail, its decode requests move."""
        if node in self.dead:
            return
        self.dead.add(node)
        self._runs.close_node(node)
        self._rebuild_routers()
        lost = [r for r in self.requests.values() if r.node == node and not r.done]
        rerouted = 0
        for req in lost:
            self._release(req)
            if req.phase == "decode" and self.routers["decode"] is not None:
                rerouted += self._reroute(req)
            else:
                # A prompt being prefilled there is lost with it (or no decode node is left).
                self._release_at_prefill(req)
                self._finish(req, "error", why=f"{node} {why}")
        if lost:
            logger.info("proxy: %s %s; %d request(s) re-routed, %d failed", node, why, rerouted, len(lost) - rerouted)

    def node_restarted(self, node: str) -> None:
        """A dead node's process is back (empty pool and cache): routed to again."""
        if node in self.dead:
            self.dead.discard(node)
            self._rebuild_routers()

    def _reroute(self, req: ProxiedRequest) -> bool:
        """A request whose decode node died goes to a live one, from scratch:
        its prompt plus the tokens the client already has, for the rest."""
        self._release_at_prefill(req)
        if req.delivered >= req.output_len:
            self._finish(req, "error", why="its decode node died after the last token")
            return False
        self.rerouted[req.request_id] = self.rerouted.get(req.request_id, 0) + 1
        delivered = req.delivered
        self._route(req, "decode", req.output_len - delivered, None, prompt_extra=delivered, event="reroute")
        return True

    def _release_at_prefill(self, req: ProxiedRequest) -> None:
        node, req.prefill_node = req.prefill_node, ""
        if node:
            self._release_held(node, req.request_id)

    def _release_held(self, node: str, request_id: str) -> None:
        if node not in self.dead:
            self._send(node, ReleaseMessage([request_id]))
