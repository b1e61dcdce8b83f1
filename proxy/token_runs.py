"""The proxy's tokens of requests in steady decode, kept as runs (the
bulk-token interface: `Proxy.on_steady_tokens`; docs/fast-paths.md).

In steady decode a node's outputs reach the proxy as one batch per step
naming every running request (`SteadyTokens`, or a fast-forward's steps at
once), and each request named gets one token. Handing each request's token
to the client at every receipt costs a pass over the batch per step.
Instead, per node, the receipt times go into one list, and a request named
in consecutive receipts has an *open run*: where in that list its tokens
start. Only a request that joins or leaves the batch costs anything at a
receipt; its run goes to the client (`ClientPort.token_run`) when it leaves
the batch, when anything else concerns the request (the proxy closes it
first: any other event of it, a finish, a routing, its node's death), and
at the end of a run. The client then holds exactly what handing each
receipt over at once leaves.

The client's time of a token is not the receipt's: the node's API server
streams each receipt's tokens after the receipts before it
(`OutputStream`, engine/front_end.py). That depends only on the receipts
before, so it is computed at each receipt, in time order, into a second
list beside the receipt times: one call per receipt, as the eager path
makes. A receipt's outputs that come as separate events at the same time
(a finish, events after a `SteadyTokens`) count in its batch
(`event_tokens`); the stream keeps that batch's time for them
(`OutputStream.pending`).

A request in an open run is one the proxy would pass tokens on for: it is in
flight and routed to that node. Everything that could change that closes
the run first.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from engine.front_end import OutputStream

from .client import ClientPort
from .requests import ProxiedRequest

# The node's first scheduled time of a request it names (None: not known).
FirstScheduled = Callable[[str], float | None]


class RunsHost(Protocol):
    """What the runs read and tell of the proxy that keeps them (`Proxy`)."""

    @property
    def requests(self) -> Mapping[str, ProxiedRequest]: ...  # in flight

    @property
    def client(self) -> ClientPort: ...

    def reject_events(self, n: int) -> None:
        """`n` outputs named a request not routed to the node that sent them."""
        ...

    def first_scheduled(self, req: ProxiedRequest, time: float | None) -> None: ...

    def mark_scheduled(self, req: ProxiedRequest, is_prefill: bool, time: float | None) -> None: ...

    def first_token(self, req: ProxiedRequest, now: float, seen: float) -> None: ...

    def output_stream(self, node: str) -> OutputStream: ...


class _NodeRuns:
    __slots__ = ("times", "seen", "stream", "open", "synced")

    def __init__(self, stream: OutputStream) -> None:
        self.times: list[float] = []  # every steady receipt's time, in order
        # When the client sees each receipt's tokens (the same list with no API server).
        self.seen: list[float] = self.times if stream.is_off else []
        self.stream = stream
        # request id -> (the request, index into `times` of its run's first token)
        self.open: dict[str, tuple[ProxiedRequest, int]] = {}
        # The ids of the last receipt if the open runs are exactly those and
        # none opened or closed since: the same ids again need no set compare.
        self.synced: list[str] | None = None


class TokenRuns:
    def __init__(self, proxy: RunsHost) -> None:
        self.proxy = proxy
        self._nodes: dict[str, _NodeRuns] = {}
        self._node_of_run: dict[str, _NodeRuns] = {}  # request id -> the node its open run is on

    def receive(
        self,
        node: str,
        ids: list[str],
        times: list[float],
        finishing: dict[str, int] | None,
        first_scheduled: FirstScheduled,
        event_tokens: dict[int, int] | None = None,
    ) -> None:
        """One token per request named and per time in `times`, except that
        a request in `finishing` gets only the first `finishing[id]` here (its
        last token comes with its finish); `event_tokens[i]`: tokens the
        node's receipt at `times[i]` brings as events besides."""
        runs = self._nodes.get(node)
        if runs is None:
            runs = self._nodes[node] = _NodeRuns(self.proxy.output_stream(node))
        base = len(runs.times)
        open_ = runs.open
        if ids != runs.synced:
            k = len(open_)
            if len(ids) >= k and ids[:k] == list(open_):
                # The usual change: the open runs (in batch order) lead the
                # batch, requests appended since join at its end.
                for rid in ids[k:]:
                    self._join(node, runs, rid, base, len(times), finishing, first_scheduled)
                runs.synced = ids if len(open_) == len(ids) else None
            else:
                named = set(ids)
                for rid in open_.keys() - named:
                    self._close(runs, rid, base)  # not in this batch: its run ended at the last receipt
                for rid in ids:  # in batch order, which the open runs keep
                    if rid not in open_:
                        self._join(node, runs, rid, base, len(times), finishing, first_scheduled)
                runs.synced = ids if open_.keys() == named else None
        runs.times.extend(times)
        if runs.seen is not runs.times:
            runs.seen.extend(_visible(runs.stream, len(ids), times, finishing, event_tokens))
        if finishing:
            for rid, n in finishing.items():
                if rid in open_:
                    self._close(runs, rid, base + n)

    def _join(
        self,
        node: str,
        runs: _NodeRuns,
        rid: str,
        base: int,
        m: int,
        finishing: dict[str, int] | None,
        first_scheduled: FirstScheduled,
    ) -> None:
        """What the proxy checks of a request's outputs (`Proxy.on_node_events`)
        before it passes them on, once, when a request joins the batch."""
        proxy = self.proxy
        req = proxy.requests.get(rid)
        if req is None or req.done:
            return
        n = m if finishing is None else finishing.get(rid, m)
        if req.node != node:
            proxy.reject_events(n)
            return
        if not req.sched_sent:
            proxy.first_scheduled(req, first_scheduled(rid))
        if not req.delivered:
            proxy.mark_scheduled(req, False, first_scheduled(rid))
        if n == 0:
            return
        runs.open[rid] = (req, base)
        self._node_of_run[rid] = runs

    def _close(self, runs: _NodeRuns, rid: str, end: int) -> None:
        req, start = runs.open.pop(rid)
        runs.synced = None
        del self._node_of_run[rid]
        if end <= start:
            return
        # The run's first token is the client's next one. (Not the node's
        # output index: a request re-routed after its node died starts over
        # on the new node, whose prompt then holds the tokens delivered so
        # far; the client's positions are those of the original prompt.)
        first = req.delivered
        if not first:
            self.proxy.first_token(req, runs.times[start], runs.seen[start])
        req.delivered += end - start
        seen = runs.seen[start:end]
        if seen[0] < req.seen:  # re-routed from a node whose API server was behind
            seen = [t if t > req.seen else req.seen for t in seen]
        req.seen = seen[-1]
        self.proxy.client.token_run(rid, first, seen)

    def close(self, rid: str) -> None:
        """Hand the request's open run, if it has one, to the client."""
        runs = self._node_of_run.get(rid)
        if runs is not None:
            self._close(runs, rid, len(runs.times))

    def close_node(self, name: str) -> None:
        runs = self._nodes.get(name)
        if runs is not None:
            for rid in list(runs.open):
                self._close(runs, rid, len(runs.times))

    def close_all(self) -> None:
        for name in list(self._nodes):
            self.close_node(name)

    def has_open(self) -> bool:
        return bool(self._node_of_run)


def _visible(
    stream: OutputStream,
    batch: int,
    times: list[float],
    finishing: dict[str, int] | None,
    event_tokens: dict[int, int] | None,
) -> list[float]:
    """The client's time of each receipt's tokens: receipt `i` holds a token
    of each of the `batch` requests named but those with `finishing[id] <= i`
    (at `finishing[id]` a request's last token comes in an event, after it
    none), and `event_tokens[i]` more (those events' tokens)."""
    if not finishing and not event_tokens:
        return stream.batches_visible_at(times, [batch] * len(times))
    leaving: dict[int, int] = {}
    for n in (finishing or {}).values():
        leaving[n] = leaving.get(n, 0) + 1
    events = event_tokens or {}
    sizes = []
    for i in range(len(times)):
        batch -= leaving.get(i, 0)
        sizes.append(batch + events.get(i, 0))
    out = stream.batches_visible_at(times, sizes)
    for i, extra in events.items():
        if extra:
            stream.pending[times[i]] = out[i]  # its events reach `Proxy.on_node_events` at `times[i]`
    return out
