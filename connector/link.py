"""A seeded model of one network link: delay, jitter, bandwidth, loss, outages.

This kernel has no netem, so every impairment is applied in the application.
The model here is pure and synchronous — time is a float in seconds handed in
by the caller — so the same code serves the in-process virtual-clock runtime
(which feeds it virtual time) and the gRPC interceptors in `connector/grpc/link.py`
(which feeds it wall time and sleeps until the returned arrival).

Each direction of a link is a FIFO delay line. A message of `nbytes` sent at
`now` is serialised onto the wire once the wire is free, then propagates for
a sampled delay:

    tx_start = max(wire_free, now)
    wire_free = tx_start + nbytes / bandwidth
    arrival  = max(wire_free + sampled_delay, previous_arrival)

The last clamp keeps arrivals in send order (a TCP stream never reorders), so
jitter can only bunch messages up, never swap them. This is the rule measured
in docs/platform.md, "The FIFO delay line" ("release = max(link free + bytes/bandwidth, now) +
sampled delay, never before the previous release"), written so that a message
sent to an idle wire still pays its own serialisation time.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from enum import Enum
from typing import Literal

from engine.setting import setting

JitterDistribution = Literal["normal", "uniform"]

# Bandwidth is in decimal megabytes per second: 1 MB = 10**6 bytes.
BYTES_PER_MB = 1_000_000
# Bounds of the settings below: a finite but absurd delay (1e308 ms) overflows
# the arrival arithmetic to inf, and a near-zero bandwidth parks a message for
# centuries; both would stall a run instead of being refused at load.
MAX_LINK_MS = 600_000.0  # ten minutes of one-way delay or jitter
MIN_BANDWIDTH_MBPS = 0.001  # 1 kB/s; slower would make one block take hours
MAX_BANDWIDTH_MBPS = 1e9


class Direction(str, Enum):
    """Which way a message travels. FORWARD is client → server (requests)."""

    FORWARD = "forward"
    REVERSE = "reverse"


@dataclass(frozen=True)
class LinkSpec:
    """Impairments of one link direction. The default is a perfect link.
    Each setting is declared here (engine/setting.py) and validated by the
    scenario schema (`cluster.links.*`, cluster/link_settings.py); a spec
    built by hand is trusted as given."""

    delay_ms: float = setting(0.0, doc="One-way propagation delay.", ge=0, le=MAX_LINK_MS)
    jitter_ms: float = setting(
        0.0,
        doc='Spread of the delay: for "normal" its standard deviation, for "uniform" the half-width of '
        "[delay_ms - jitter_ms, delay_ms + jitter_ms]; a sampled delay is clipped at 0.",
        ge=0,
        le=MAX_LINK_MS,
    )
    jitter_distribution: JitterDistribution = setting("normal", doc="How the delay's jitter is drawn.")
    bandwidth_MBps: float | None = setting(
        None,
        doc="Serialisation rate in decimal megabytes per second (10^6 B/s); null: unlimited.",
        ge=MIN_BANDWIDTH_MBPS,
        le=MAX_BANDWIDTH_MBPS,
    )
    loss: float = setting(0.0, doc="Chance that a message is dropped.", ge=0, lt=1)
    outages: tuple[tuple[float, float], ...] = setting(
        (),
        doc="(start_s, end_s) run seconds; end_s may be .inf (down for the rest of the run). Every message "
        "sent inside a window is dropped.",
    )

    @property
    def is_ideal(self) -> bool:
        """True when the link adds nothing: no delay, no cap, no loss, no outage."""
        return (
            self.delay_ms == 0
            and self.jitter_ms == 0
            and self.bandwidth_MBps is None
            and self.loss == 0
            and not self.outages
        )

    def in_outage(self, t: float) -> bool:
        return bool(self.outages) and any(start <= t < end for start, end in self.outages)


# Draws skipped per `getrandbits` call: a line that owes the draws of a long
# run's messages would otherwise build one integer of that many bits (10M
# draws: 80 MB) when its stream is next read.
SKIP_CHUNK = 4096


def skip_draws(rng: random.Random, n: int) -> None:
    """Move `rng` on by `n` calls of `random()` at once: each takes two
    32-bit words of the Mersenne Twister, and `getrandbits(64 * k)` takes
    2k (tests/unit/test_link.py checks the states match), in chunks of at
    most `SKIP_CHUNK` draws."""
    while n > SKIP_CHUNK:
        rng.getrandbits(64 * SKIP_CHUNK)
        n -= SKIP_CHUNK
    if n > 0:
        rng.getrandbits(64 * n)


class DelayLine:
    """One direction of a link: a FIFO wire with its own random stream."""

    def __init__(self, spec: LinkSpec, rng: random.Random) -> None:
        self.spec = spec
        self._stream = rng
        # Draws of `random()` owed to the stream: an ideal line's messages
        # draw nothing that matters, so they only count what they would have
        # taken, and the stream moves on when it is next read (`_rng`).
        self._owed = 0
        # An ideal line (the spec is frozen) is plain arithmetic: `transit` then
        # only keeps the counters and counts the draws it owes the stream.
        self._ideal = spec.is_ideal
        self._draws = 3 if spec.jitter_distribution == "normal" else 2
        self._bytes_per_s = None if spec.bandwidth_MBps is None else spec.bandwidth_MBps * BYTES_PER_MB
        self._wire_free = -math.inf
        self._last_arrival = -math.inf
        self.sent = 0
        self.lost = 0
        self.delivered_bytes = 0
        # Faults added during a run (chaos mode): (start, end, loss) windows;
        # loss 1.0 is a partition.
        self.fault_windows: list[tuple[float, float, float]] = []

    @property
    def _rng(self) -> random.Random:
        """The line's random stream, moved on by the draws owed to it first."""
        if self._owed:
            skip_draws(self._stream, self._owed)
            self._owed = 0
        return self._stream

    @property
    def is_ideal(self) -> bool:
        """`LinkSpec.is_ideal` of its (frozen) spec, worked out once."""
        return self._ideal

    def add_fault(self, start: float, end: float, loss: float = 1.0) -> None:
        """Drop messages sent in [start, end) with probability `loss` (1: all)."""
        self.fault_windows.append((start, end, loss))

    def transit(self, now: float, nbytes: int) -> float | None:
        """Arrival time of a message sent at `now`, or None when it is lost."""
        if (
            self._ideal
            and type(now) is float
            and type(nbytes) is int
            and now >= self._last_arrival
            and now >= self._wire_free
            and nbytes >= 0
            and now < math.inf
            and not self.fault_windows
        ):
            # In order, no fault window: the message arrives when sent; the
            # same counters, and the draws (none of which could change
            # anything here) owed to the stream. Inline: it runs per message.
            self._owed += self._draws
            self.sent += 1
            self.delivered_bytes += nbytes
            self._wire_free = self._last_arrival = now
            return now
        if isinstance(now, bool) or not isinstance(now, (int, float)) or not math.isfinite(now):
            raise ValueError(f"transit: now must be a finite time in seconds, got {now!r}")
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise ValueError(f"transit: nbytes must be an int >= 0, got {nbytes!r}")
        self.sent += 1
        # A fixed number of draws per message, lost or not, so the delay of
        # message k does not depend on the loss rate or on the outage windows.
        rng = self._rng  # (pays the owed draws once)
        loss_draw = rng.random()
        delay_s = self._sample_delay_ms(rng) / 1000.0
        faulted = any(start <= now < end and loss_draw < loss for start, end, loss in self.fault_windows)
        if loss_draw < self.spec.loss or self.spec.in_outage(now) or faulted:
            # Dropped before it reaches the wire (like netem's loss): it does
            # not occupy bandwidth.
            self.lost += 1
            return None
        tx_start = max(self._wire_free, now)
        self._wire_free = tx_start if self._bytes_per_s is None else tx_start + nbytes / self._bytes_per_s
        arrival = max(self._wire_free + delay_s, self._last_arrival)
        self._last_arrival = arrival
        self.delivered_bytes += nbytes
        return arrival

    def transit_ideal_run(self, times: list[float], sizes: list[int]) -> bool:
        """`transit(t, n)` for each (t, n) at once, when that is plain
        arithmetic: an ideal line with no fault window, sent in time order
        no earlier than anything before. Every message then arrives when it
        is sent; the counters and the random stream (a fixed number of
        draws per message) end where message-by-message sending leaves
        them. False (nothing done) when the shortcut does not apply."""
        if not times or not self._ideal or self.fault_windows:
            return False
        if times[0] < self._wire_free or times[0] < self._last_arrival or times != sorted(times):
            return False
        self._owed += len(times) * self._draws
        self.sent += len(times)
        self.delivered_bytes += sum(sizes)
        self._wire_free = self._last_arrival = times[-1]
        return True

    def _sample_delay_ms(self, rng: random.Random) -> float:
        spec = self.spec
        if spec.jitter_ms == 0:
            # The draws a jittered sample takes, so later messages see the
            # same stream; the sample itself is the delay.
            rng.random()
            if spec.jitter_distribution == "normal":
                rng.random()
            return max(0.0, spec.delay_ms)
        if spec.jitter_distribution == "normal":
            # One uniform pair through Box-Muller keeps the draw count fixed.
            u1 = 1.0 - rng.random()  # (0, 1]: log is finite
            u2 = rng.random()
            z = math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)
            sample = spec.delay_ms + spec.jitter_ms * z
        else:
            sample = spec.delay_ms + spec.jitter_ms * (2.0 * rng.random() - 1.0)
        return max(0.0, sample)


class Link:
    """A two-way link: one delay line per direction, each with its own seeded stream.

    `reverse_spec` makes the link asymmetric; by default both directions share
    `spec`. Same (spec, seed) → the same sequence of drops and arrival times.
    """

    def __init__(self, spec: LinkSpec, seed: int = 0, reverse_spec: LinkSpec | None = None) -> None:
        if not isinstance(spec, LinkSpec):
            raise ValueError(f"Link: spec must be a LinkSpec, got {type(spec).__name__}")
        if reverse_spec is not None and not isinstance(reverse_spec, LinkSpec):
            raise ValueError(f"Link: reverse_spec must be a LinkSpec or None, got {type(reverse_spec).__name__}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"Link: seed must be an int, got {seed!r}")
        self.seed = seed
        # String seeds go through SHA-512 in `random`, so streams are stable
        # across processes (unlike hash()) and independent per direction.
        self.forward = DelayLine(spec, random.Random(f"disagg-link/{seed}/forward"))
        self.reverse = DelayLine(reverse_spec or spec, random.Random(f"disagg-link/{seed}/reverse"))

    def line(self, direction: Direction | str) -> DelayLine:
        if direction is Direction.FORWARD:  # the usual calls: no enum lookup per message
            return self.forward
        if direction is Direction.REVERSE:
            return self.reverse
        return self.forward if Direction(direction) is Direction.FORWARD else self.reverse

    def transit(self, now: float, nbytes: int, direction: Direction | str = Direction.FORWARD) -> float | None:
        """Arrival time of `nbytes` sent at `now` in `direction`; None when lost."""
        return self.line(direction).transit(now, nbytes)

    @property
    def is_ideal(self) -> bool:
        return self.forward.spec.is_ideal and self.reverse.spec.is_ideal


# A reliable stream's retransmission timer: Linux's minimum RTO (200 ms),
# doubling per retransmission of the same message; capped at 2 s (not TCP's
# 120 s, so a simulated partition heals within seconds of its end), and
# given up after 15 retransmissions (tcp_retries2): after ~25 s of
# unbroken loss the connection is broken.
RTO_INITIAL_S = 0.2
RTO_MAX_S = 2.0
MAX_RETRANSMISSIONS = 15


class ReliableLine:
    """A reliable, ordered stream (TCP) over one lossy `DelayLine`.

    A message the line drops is sent again after a retransmission timeout,
    so loss shows up as delay, never as a gap; and nothing sent after it is
    delivered before it (head-of-line blocking), so loss never reorders.
    `transit` returns None only when the connection breaks: the message was
    dropped `MAX_RETRANSMISSIONS` times over (a long outage), as TCP gives up.
    """

    def __init__(self, line: DelayLine, rto_initial_s: float = RTO_INITIAL_S) -> None:
        self.line = line
        self.rto_initial_s = rto_initial_s
        self._last = -math.inf
        self.retransmissions = 0

    def transit(self, now: float, nbytes: int) -> float | None:
        arrival = self.line.transit(now, nbytes)
        if arrival is None:
            arrival = self._retransmit(now, nbytes)
            if arrival is None:
                return None
        if arrival < self._last:
            arrival = self._last
        self._last = arrival
        return arrival

    def _retransmit(self, now: float, nbytes: int) -> float | None:
        """The send at `now` was dropped: TCP sends again after its
        retransmission timeout, doubling it each time, up to
        `MAX_RETRANSMISSIONS` times; None when they are all dropped."""
        self.retransmissions += 1
        t, rto = now + self.rto_initial_s, min(self.rto_initial_s * 2, RTO_MAX_S)
        for _ in range(MAX_RETRANSMISSIONS):
            arrival = self.line.transit(t, nbytes)
            if arrival is not None:
                return arrival
            self.retransmissions += 1
            t, rto = t + rto, min(rto * 2, RTO_MAX_S)
        return None

    def transit_all(self, times: list[float], sizes: list[int]) -> list[float | None]:
        """`transit` of each (t, n) in turn; in bulk on an ideal line
        (`DelayLine.transit_ideal_run`), where every message arrives when sent."""
        if times and times[0] >= self._last and self.line.transit_ideal_run(times, sizes):
            self._last = times[-1]
            return list(times)
        return [self.transit(t, n) for t, n in zip(times, sizes)]
