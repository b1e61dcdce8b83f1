"""The shadow-KV decodes a steady cohort owes (engine/steady_shadow.py): a
member's owed steps go to the store as one decode, from where its decodes
were issued up to, with the end times of the first and last owed step."""

from __future__ import annotations

from types import SimpleNamespace

from engine.steady_shadow import ShadowLag


class _Store:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def decode_later(self, *args) -> None:
        self.calls.append(args)


def _member(rid: str, offset: int, at: int) -> SimpleNamespace:
    return SimpleNamespace(request_id=rid, steady_offset=offset, steady_shadow_at=at)


def test_owed_steps_go_as_one_decode_from_where_the_last_one_ended():
    store = _Store()
    tables = {"a": SimpleNamespace(block_ids=[3, 4])}
    lag = ShadowLag(store, tables)  # type: ignore[arg-type]
    r = _member("a", offset=20, at=5)  # 25 computed at step 5
    lag.steps_done(6, [1.0, 2.0, 3.0])
    lag.steps_done(9, [4.5])
    lag.catch_up(r, 9)
    assert store.calls == [("a", [3, 4], 25, 4, 1.0, 4.5)] and r.steady_shadow_at == 9
    lag.catch_up(r, 9)  # nothing owed
    assert len(store.calls) == 1


def test_pruning_keeps_the_end_times_a_member_still_needs():
    lag = ShadowLag(_Store(), {})  # type: ignore[arg-type]
    lag.steps_done(1, [float(t) for t in range(5000)])
    behind = _member("b", offset=0, at=4000)
    lag.prune([behind, _member("c", offset=0, at=4990)])
    assert min(lag.step_ends) == 4001 and max(lag.step_ends) == 5000
    lag.prune([behind])  # under the threshold now: kept as is
    assert len(lag.step_ends) == 1000
