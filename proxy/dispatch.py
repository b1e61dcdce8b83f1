"""The proxy's request table and routing, the part of `Proxy` (proxy/proxy.py)
that decides where a request goes: admission (`submit`, `abort`), routing to
the prefill and decode pools (proxy/routing.py) after the timeline's HTTP
legs, which messages a node still gets, finishing and releasing a request,
and the proxy's half of the fault policy (a node's death or restart:
re-route or fail its requests). What nodes send back (tokens, outputs, the
TTFT breakdown) is `Proxy`'s."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from engine.front_end import OutputStream
from node.messages import AbortMessage, ProxyMessage, ReleaseMessage, RequestMessage

from .client import Finished, Submission
from .ports import KVTransferParams, ProxyPorts, ProxySettings
from .requests import ProxiedRequest
from .routing import PREFIX_POLICIES, PrefixIndex, Router
from .token_runs import TokenRuns

logger = logging.getLogger(__name__)

ROLES = ("prefill", "decode")


class RequestDispatch:
    # The steady-decode token runs (proxy/token_runs.py): made by `Proxy`, which they report to.
    _runs: TokenRuns

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

    # -- finishing ----------------------------------------------------------------------
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
