"""The client's token records of requests in steady decode, kept as runs
(issue 15; docs/fast-paths.md).

In steady decode a node's outputs reach the proxy as one batch per step
naming every running request (`SteadyTokens`, or a forward's steps at once),
and each request named gets one token. Writing each request's token and
arrival time into its record at every receipt costs a pass over the batch
per step. Instead, per node, the receipt times go into one list, and a
request named in consecutive receipts has an *open run*: where in that list
its tokens start and which output index is its first. Only a request that
joins or leaves the batch costs anything at a receipt; its record is written
(`close`) when it leaves the batch, when anything else reads or changes its
record (the proxy's other paths close it first: `InProcCluster._proxy_receive`,
`_finish`, `_send`, `_node_gone`), and at the end of the run. The records
then hold exactly what writing each receipt at once leaves.

A request in an open run is one the proxy would record tokens for: its record
exists and is not finished, and it is routed to that node. Everything that
could change that closes the run first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.records import RequestRecord, TokenIds

if TYPE_CHECKING:
    from node.role import NodeRole

    from .cluster import InProcCluster


class _NodeRuns:
    __slots__ = ("times", "open", "synced")

    def __init__(self) -> None:
        self.times: list[float] = []  # every steady receipt's time, in order
        # request id -> (its record, index into `times` of its run's first token, its first output index)
        self.open: dict[str, tuple[RequestRecord, int, int]] = {}
        # The ids of the last receipt if the open runs are exactly those and
        # none opened or closed since: the same ids again need no set compare.
        self.synced: list[str] | None = None


class SteadyTokenRuns:
    def __init__(self, cluster: InProcCluster) -> None:
        self.cluster = cluster
        self._nodes: dict[str, _NodeRuns] = {}
        self._node_of_run: dict[str, _NodeRuns] = {}  # request id -> the node its open run is on

    def receive(
        self,
        node: NodeRole,
        ids: list[str],
        times: list[float],
        finishing: dict[str, int] | None = None,
    ) -> None:
        """One token per request named and per time in `times`, except that
        a request in `finishing` gets only the first `finishing[id]` here (its
        last token comes with its finish)."""
        runs = self._nodes.get(node.name)
        if runs is None:
            runs = self._nodes[node.name] = _NodeRuns()
        base = len(runs.times)
        open_ = runs.open
        if ids != runs.synced:
            k = len(open_)
            if len(ids) >= k and ids[:k] == list(open_):
                # The usual change: the open runs (in batch order) lead the
                # batch, requests appended since join at its end.
                for rid in ids[k:]:
                    self._join(node, runs, rid, base, len(times), finishing)
                runs.synced = ids if len(open_) == len(ids) else None
            else:
                named = set(ids)
                for rid in open_.keys() - named:
                    self._close(runs, rid, base)  # not in this batch: its run ended at the last receipt
                for rid in ids:  # in batch order, which the open runs keep
                    if rid not in open_:
                        self._join(node, runs, rid, base, len(times), finishing)
                runs.synced = ids if open_.keys() == named else None
        runs.times.extend(times)
        if finishing:
            for rid, n in finishing.items():
                if rid in open_:
                    self._close(runs, rid, base + n)

    def _join(
        self,
        node: NodeRole,
        runs: _NodeRuns,
        rid: str,
        base: int,
        m: int,
        finishing: dict[str, int] | None,
    ) -> None:
        """What the proxy checks of a request's outputs (`_proxy_receive`)
        before it records them, once, when a request joins the batch."""
        cluster = self.cluster
        rec = cluster.records.get(rid)
        if rec is None or rec.finish_reason is not None:
            return
        n = m if finishing is None else finishing.get(rid, m)
        if cluster._node_of.get(rid) is not node:
            cluster.events_rejected += n
            return
        if rec.first_scheduled_time is None:
            rec.first_scheduled_time = node.core.first_scheduled_time(rid)
        if n == 0:
            return
        # The run's first token is the record's next one, as the plain path
        # appends it. (Not the node's output index: a request re-routed after
        # its node died starts over on the new node, whose prompt then holds
        # the tokens delivered so far; the record's positions are those of
        # the original prompt.)
        runs.open[rid] = (rec, base, len(rec.output_token_ids))
        self._node_of_run[rid] = runs

    def _close(self, runs: _NodeRuns, rid: str, end: int) -> None:
        rec, start, first = runs.open.pop(rid)
        runs.synced = None
        del self._node_of_run[rid]
        n = end - start
        if n <= 0:
            return
        out = rec.output_token_ids
        if type(out) is not TokenIds:
            out = rec.output_token_ids = TokenIds(out)
        out.add_run(self.cluster._sampler.token_at, rid, rec.prompt_len, first, n)
        rec.token_times.extend(runs.times[start:end])

    def close(self, rid: str) -> None:
        """Write the request's open run, if it has one, into its record."""
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
