"""The link model: delay, jitter, bandwidth, FIFO order, loss, outages, determinism."""

import math
import random
import statistics

import pytest

from cluster.link_settings import LinkSettings
from connector.link import SKIP_CHUNK, Direction, Link, LinkSpec, skip_draws


def spaced_arrivals(link: Link, n: int, gap_s: float = 1.0, nbytes: int = 0) -> list[float | None]:
    """Send n messages gap_s apart (far enough that FIFO never clamps)."""
    return [link.transit(i * gap_s, nbytes) for i in range(n)]


def delays_ms(arrivals: list[float | None], gap_s: float = 1.0) -> list[float]:
    return [(a - i * gap_s) * 1000 for i, a in enumerate(arrivals) if a is not None]


# -- LinkSpec and its validation -----------------------------------------------------


def test_default_spec_is_an_ideal_link_that_adds_nothing():
    spec = LinkSpec()
    assert spec.is_ideal
    link = Link(spec, seed=1)
    assert [link.transit(t, 10**9) for t in (0.0, 0.5, 7.25)] == [0.0, 0.5, 7.25]


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"delay_ms": -1}, "delay_ms"),
        ({"delay_ms": math.inf}, "delay_ms"),
        ({"delay_ms": "fast"}, "delay_ms"),
        ({"jitter_ms": -0.5}, "jitter_ms"),
        ({"jitter_ms": math.nan}, "jitter_ms"),
        ({"jitter_distribution": "pareto"}, "jitter_distribution"),
        ({"bandwidth_MBps": 0}, "bandwidth_MBps"),
        ({"bandwidth_MBps": -3}, "bandwidth_MBps"),
        ({"bandwidth_MBps": math.inf}, "bandwidth_MBps"),
        ({"loss": 1.0}, "loss"),
        ({"loss": -0.1}, "loss"),
        ({"loss": True}, "loss"),
        ({"outages": [(2.0, 1.0)]}, r"outages\[0\]"),
        ({"outages": [(0.0, 1.0), (-1.0, 1.0)]}, r"outages\.1"),
        ({"outages": [(1.0,)]}, r"outages\.0"),
        ({"outages": "0-1"}, "outages"),
    ],
)
def test_bad_spec_raises_value_error_naming_the_field(kwargs, field):
    """A link's settings are validated once, by the scenario schema that
    derives from `LinkSpec`'s declarations (`LinkSpec` itself trusts them)."""
    with pytest.raises(ValueError, match=rf"(?m)^(  Value error, )?{field}"):
        LinkSettings.model_validate(kwargs)


def test_settings_become_a_spec_with_outages_as_tuples_and_refuse_unknown_keys():
    spec = LinkSettings.model_validate({"delay_ms": 5, "outages": [[1, 2], [3, math.inf]]}).to_spec()
    assert spec.outages == ((1.0, 2.0), (3.0, math.inf))
    assert spec.delay_ms == 5.0 and not spec.is_ideal
    with pytest.raises(ValueError, match=r"latency_ms\n  Extra inputs are not permitted"):
        LinkSettings.model_validate({"latency_ms": 5})


def test_link_rejects_bad_arguments():
    with pytest.raises(ValueError, match="seed must be an int"):
        Link(LinkSpec(), seed=1.5)
    with pytest.raises(ValueError, match="spec must be a LinkSpec"):
        Link({"delay_ms": 1})
    link = Link(LinkSpec())
    with pytest.raises(ValueError, match="nbytes must be an int >= 0"):
        link.transit(0.0, -1)
    with pytest.raises(ValueError, match="now must be a finite time"):
        link.transit(math.nan, 1)


# -- delay and jitter ----------------------------------------------------------


def test_fixed_delay_is_added_exactly():
    link = Link(LinkSpec(delay_ms=20), seed=0)
    assert spaced_arrivals(link, 3) == [0.02, 1.02, 2.02]


def test_normal_jitter_centres_on_the_delay():
    link = Link(LinkSpec(delay_ms=20, jitter_ms=5, jitter_distribution="normal"), seed=7)
    d = delays_ms(spaced_arrivals(link, 20_000))
    assert statistics.median(d) == pytest.approx(20, abs=0.2)
    assert statistics.fmean(d) == pytest.approx(20, abs=0.2)
    assert statistics.stdev(d) == pytest.approx(5, abs=0.2)
    assert min(d) >= 0


def test_uniform_jitter_stays_within_its_band():
    link = Link(LinkSpec(delay_ms=20, jitter_ms=5, jitter_distribution="uniform"), seed=7)
    d = delays_ms(spaced_arrivals(link, 20_000))
    assert 15 <= min(d) < 15.1 and 24.9 < max(d) <= 25
    assert statistics.median(d) == pytest.approx(20, abs=0.2)
    # uniform on [15, 25]: standard deviation 10 / sqrt(12)
    assert statistics.stdev(d) == pytest.approx(10 / math.sqrt(12), abs=0.1)


def test_jitter_larger_than_the_delay_is_clipped_at_zero_never_negative():
    link = Link(LinkSpec(delay_ms=1, jitter_ms=10), seed=3)
    d = delays_ms(spaced_arrivals(link, 2_000))
    assert min(d) == 0.0
    assert sum(1 for x in d if x == 0.0) > 500  # about 46 % fall below zero


# -- bandwidth -----------------------------------------------------------------


def test_64_MB_at_50_MBps_takes_exactly_1_28_s():
    link = Link(LinkSpec(bandwidth_MBps=50), seed=0)
    assert link.transit(0.0, 64_000_000) == 1.28


def test_chunks_queue_behind_each_other_on_the_wire():
    link = Link(LinkSpec(bandwidth_MBps=50), seed=0)
    arrivals = [link.transit(0.0, 256_000) for _ in range(250)]  # 64 MB in 256 kB chunks
    assert arrivals[0] == pytest.approx(0.00512, rel=1e-12)
    assert arrivals[-1] == pytest.approx(1.28, rel=1e-12)
    assert arrivals == sorted(arrivals)


def test_bandwidth_and_delay_add_and_an_idle_wire_still_charges_serialisation():
    link = Link(LinkSpec(delay_ms=10, bandwidth_MBps=1), seed=0)
    assert link.transit(5.0, 500_000) == pytest.approx(5.0 + 0.5 + 0.01)
    # the wire has been idle since 5.5: a message sent at 9.0 starts at once
    assert link.transit(9.0, 100_000) == pytest.approx(9.0 + 0.1 + 0.01)
    # sent at 9.05 while the previous one still serialises until 9.1
    assert link.transit(9.05, 100_000) == pytest.approx(9.1 + 0.1 + 0.01)


# -- FIFO ----------------------------------------------------------------------


def test_jitter_never_reorders_messages():
    link = Link(LinkSpec(delay_ms=10, jitter_ms=20), seed=11)
    arrivals = [link.transit(i * 0.001, 100) for i in range(5_000)]
    assert arrivals == sorted(arrivals)
    # the order was actually at stake: without the clamp some would overtake
    clamped = sum(1 for a, b in zip(arrivals, arrivals[1:]) if a == b)
    assert clamped > 500


# -- loss and outages ----------------------------------------------------------


def test_loss_rate_matches_the_probability():
    link = Link(LinkSpec(loss=0.1), seed=5)
    arrivals = [link.transit(float(i), 1) for i in range(100_000)]
    lost = sum(a is None for a in arrivals)
    assert lost / len(arrivals) == pytest.approx(0.1, abs=0.005)
    assert (link.forward.sent, link.forward.lost) == (100_000, lost)


def test_the_delay_of_each_message_does_not_depend_on_the_loss_rate():
    lossless = spaced_arrivals(Link(LinkSpec(delay_ms=20, jitter_ms=5), seed=9), 2_000)
    lossy = spaced_arrivals(Link(LinkSpec(delay_ms=20, jitter_ms=5, loss=0.3), seed=9), 2_000)
    delivered = [(i, a) for i, a in enumerate(lossy) if a is not None]
    assert 1_300 < len(delivered) < 1_500
    assert all(lossless[i] == a for i, a in delivered)


def test_messages_sent_inside_an_outage_are_dropped():
    link = Link(LinkSpec(delay_ms=5, outages=[(1.0, 2.0), (3.0, math.inf)]), seed=0)
    sent_at = [0.5, 0.999, 1.0, 1.5, 1.999, 2.0, 2.5, 3.0, 100.0]
    got = [link.transit(t, 0) for t in sent_at]
    assert got == pytest.approx([0.505, 1.004, None, None, None, 2.005, 2.505, None, None])


def test_a_dropped_message_does_not_occupy_the_wire():
    link = Link(LinkSpec(bandwidth_MBps=1, outages=[(1.0, 2.0)]), seed=0)
    assert link.transit(1.5, 1_000_000) is None
    assert link.transit(2.0, 1_000_000) == pytest.approx(3.0)


# -- determinism and directions ------------------------------------------------


def sample_sequence(seed: int) -> list:
    link = Link(LinkSpec(delay_ms=10, jitter_ms=3, bandwidth_MBps=100, loss=0.2), seed=seed)
    out = []
    for i in range(500):
        out.append(link.transit(i * 0.002, 10_000, Direction.FORWARD))
        out.append(link.transit(i * 0.002, 50_000, "reverse"))
    return out


def test_same_seed_gives_the_same_sequence_and_another_seed_does_not():
    assert sample_sequence(42) == sample_sequence(42)
    assert sample_sequence(42) != sample_sequence(43)


def test_directions_have_independent_streams_and_optionally_their_own_spec():
    link = Link(LinkSpec(delay_ms=10), seed=1, reverse_spec=LinkSpec(delay_ms=30))
    assert link.transit(0.0, 0, Direction.FORWARD) == pytest.approx(0.010)
    assert link.transit(0.0, 0, Direction.REVERSE) == pytest.approx(0.030)
    # traffic one way does not shift the random stream of the other way
    a = Link(LinkSpec(delay_ms=10, jitter_ms=5), seed=2)
    b = Link(LinkSpec(delay_ms=10, jitter_ms=5), seed=2)
    for i in range(100):
        a.transit(float(i), 0, Direction.FORWARD)
    assert [a.transit(float(i), 0, "reverse") for i in range(50)] == [
        b.transit(float(i), 0, "reverse") for i in range(50)
    ]
    with pytest.raises(ValueError):
        link.transit(0.0, 0, "sideways")


# A line's random stream and the draws it owes it (`DelayLine._rng` settles
# them): compared by the next draw, not by state.
STREAM = ("_stream", "_owed")


@pytest.mark.parametrize("distribution", ["normal", "uniform"])
def test_transit_all_in_bulk_on_an_ideal_line_leaves_what_message_by_message_leaves(distribution):
    from connector.link import ReliableLine

    spec = LinkSpec(jitter_distribution=distribution)
    bulk, single = (ReliableLine(Link(spec, seed=3).reverse) for _ in range(2))
    times, sizes = [0.5, 0.5, 0.75, 1.0], [10, 20, 30, 40]
    assert bulk.transit_all(times, sizes) == times
    assert [single.transit(t, n) for t, n in zip(times, sizes)] == times
    for a, b in ((bulk, single), (bulk.line, single.line)):
        assert {k: v for k, v in vars(a).items() if k not in ("line",) + STREAM} == {
            k: v for k, v in vars(b).items() if k not in ("line",) + STREAM
        }
    assert bulk.line._rng.random() == single.line._rng.random()  # the same draws were made


def test_transit_all_sends_one_by_one_where_the_bulk_path_does_not_apply():
    from connector.link import ReliableLine

    delayed = ReliableLine(Link(LinkSpec(delay_ms=5.0), seed=1).forward)
    assert delayed.transit_all([1.0, 2.0], [1, 1]) == pytest.approx([1.005, 2.005])
    faulted = ReliableLine(Link(LinkSpec(), seed=1).forward)
    faulted.line.add_fault(0.0, 10.0, loss=1.0)  # a partition: resent until it heals
    assert faulted.transit_all([1.0], [1]) == [10.0]
    out_of_order = ReliableLine(Link(LinkSpec(), seed=1).forward)
    assert out_of_order.transit_all([2.0, 1.0], [1, 1]) == [2.0, 2.0]  # FIFO: the second waits for the first


@pytest.mark.parametrize("distribution, draws", [("normal", 3), ("uniform", 2)])
def test_a_link_without_jitter_takes_the_draws_a_jittered_one_takes(distribution, draws):
    import random

    line = Link(LinkSpec(delay_ms=2.0, jitter_distribution=distribution), seed=4).forward
    assert [line.transit(t, 10) for t in (0.0, 1.0, 2.0)] == [0.002, 1.002, 2.002]
    reference = random.Random("disagg-link/4/forward")
    for _ in range(3 * draws):
        reference.random()
    assert line._rng.random() == reference.random()


@pytest.mark.parametrize("distribution", ["normal", "uniform"])
def test_transit_on_an_ideal_line_takes_the_arithmetic_and_leaves_what_the_general_path_leaves(distribution):
    spec = LinkSpec(jitter_distribution=distribution)
    fast, general = Link(spec, seed=5).forward, Link(spec, seed=5).forward
    general._ideal = False  # the general path, draw by draw
    sends = [(0.25, 10), (0.25, 0), (1, 64), (0.5, 8), (2.0, 3)]  # an int time, then one before the last arrival
    assert [fast.transit(t, n) for t, n in sends] == [general.transit(t, n) for t, n in sends]
    assert {k: v for k, v in vars(fast).items() if k not in STREAM} == {
        k: v for k, v in vars(general).items() if k not in STREAM
    } | {"_ideal": True}
    assert fast._rng.random() == general._rng.random()
    with pytest.raises(ValueError, match="nbytes"):
        fast.transit(3.0, -1)


@pytest.mark.parametrize("n", [0, 1, 2, 7, 1000, SKIP_CHUNK, SKIP_CHUNK + 1, 3 * SKIP_CHUNK + 5])
def test_skip_draws_leaves_the_stream_where_that_many_random_calls_do(n):
    one_by_one, skipped = random.Random("link"), random.Random("link")
    for _ in range(n):
        one_by_one.random()
    skip_draws(skipped, n)
    assert one_by_one.getstate() == skipped.getstate()


def test_an_ideal_line_owes_its_draws_and_pays_them_before_the_stream_is_read():
    import random

    spec = LinkSpec()
    line = Link(spec, seed=6).forward
    for t in (0.0, 1.0, 2.0):
        line.transit(t, 10)
    assert line._owed == 3 * line._draws  # nothing drawn yet
    line.add_fault(5.0, 6.0, loss=1.0)  # from now on the general path draws
    assert line.transit(3.0, 10) == 3.0
    assert line._owed == 0
    reference = random.Random("disagg-link/6/forward")
    for _ in range(4 * line._draws):
        reference.random()
    assert line._rng.random() == reference.random()


def test_a_dropped_send_is_resent_with_a_doubling_timeout_until_the_connection_breaks():
    from connector.link import MAX_RETRANSMISSIONS, RTO_INITIAL_S, RTO_MAX_S, ReliableLine

    healed = ReliableLine(Link(LinkSpec(), seed=1).forward)
    healed.line.add_fault(0.0, 1.0, loss=1.0)
    expected, t, rto = 0, 0.5, RTO_INITIAL_S
    while t < 1.0:
        expected, t, rto = expected + 1, t + rto, min(rto * 2, RTO_MAX_S)
    assert healed.transit(0.5, 1) == t
    assert healed.retransmissions == expected
    broken = ReliableLine(Link(LinkSpec(), seed=1).forward)
    broken.line.add_fault(0.0, 1e9, loss=1.0)
    assert broken.transit(0.0, 1) is None
    assert broken.retransmissions == MAX_RETRANSMISSIONS + 1
