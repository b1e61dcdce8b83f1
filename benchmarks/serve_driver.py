"""What `disagg-sim serve`'s in-process driver costs per event batch, on top
of the cluster's own events: waking the HTTP handlers whose request changed.

`PacedCluster.advance` runs the events due, then wakes the handlers of the
requests those events touched (`InProcCluster.touched`). Before, it checked
every request in flight after every batch; `RescanDriver` below is that
rule, kept here as the baseline. Both drive the same cluster with the same
requests; the figure is `advance()` minus the cluster's events
(`loop.advance_to`), summed over 300 batches of 10 ms modelled time.

Cases: many requests in flight of which few run (a long queue: 2,000 in
flight, `max_num_seqs` 16), and all of them decoding (400 in flight,
`max_num_seqs` 1024). The wall clock is not used: each batch moves the
driver's start so that `virtual_now()` is the batch's time. The cluster
fills `touched` inside its events (one set update per batch of node events)
for both drivers alike, so that cost is in neither figure. Noisy on a
shared 2-core machine: compare the two columns of one entry.

    .venv/bin/python -m benchmarks.serve_driver [--repeats 3] [--record]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from datetime import UTC, datetime

from bench.serve.driver import PacedCluster
from bench.serve.protocol import parse_request
from bench.serve.tokenizer import get_tokenizer
from cluster.spec import ClusterSpec

BATCHES, BATCH_S = 300, 0.01
CASES = {"long queue": (2000, 16), "all decoding": (400, 1024)}  # (in flight, max_num_seqs)


class RescanDriver(PacedCluster):
    """The old rule: after every batch, look at every request in flight."""

    def advance(self) -> None:
        self.cluster.loop.advance_to(self.virtual_now())
        self._touched.clear()
        for stream in list(self._streams.values()):
            rec = stream.record
            if len(rec.output_token_ids) != stream.seen or rec.finish_reason is not None:
                stream.changed.set()


def spec(max_num_seqs: int) -> ClusterSpec:
    engine = {"num_gpu_blocks": 20000, "max_model_len": 4096, "max_num_seqs": max_num_seqs}
    return ClusterSpec.model_validate(
        {
            "prefill": {"count": 1, "engine": {"num_gpu_blocks": 20000, "max_model_len": 4096}},
            "decode": {"count": 1, "engine": {**engine, "async_scheduling": True}},
            "links": {"kv": {"delay_ms": 1.0}},
            "cost_model": "synthetic-8b",
        }
    )


def measure(cls: type[PacedCluster], in_flight: int, max_num_seqs: int) -> float:
    """Seconds of driver overhead over `BATCHES` batches."""
    driver = cls(spec(max_num_seqs), max_pending=in_flight)
    tok = get_tokenizer()
    body = {"prompt": "a b c d", "max_tokens": 400}
    streams = [driver.submit(parse_request(body, "completions", tok, "m", 4096)) for _ in range(in_flight)]
    loop = driver.cluster.loop
    events_s = [0.0]
    advance_to = loop.advance_to

    def timed(t: float) -> None:
        t0 = time.perf_counter()
        advance_to(t)
        events_s[0] += time.perf_counter() - t0

    loop.advance_to = timed  # type: ignore[method-assign]
    total = 0.0
    for i in range(1, BATCHES + 1):
        driver._start -= i * BATCH_S - driver.virtual_now()  # virtual time = this batch's
        t0 = time.perf_counter()
        driver.advance()
        total += time.perf_counter() - t0
        for s in streams:  # the handlers took what they were woken for
            s.changed.clear()
            s.seen = len(s.record.output_token_ids)
    return total - events_s[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--record", action="store_true", help="add the figures to benchmarks/RESULTS.md")
    args = p.parse_args()
    rows = []
    for case, (n, seqs) in CASES.items():
        got = {}
        for name, cls in (("rescan (before)", RescanDriver), ("touched (now)", PacedCluster)):
            got[name] = statistics.median(measure(cls, n, seqs) for _ in range(args.repeats))
        rows.append((case, n, seqs, got["rescan (before)"], got["touched (now)"]))
        print(f"{case}: rescan {got['rescan (before)'] * 1e3:.1f} ms, touched {got['touched (now)'] * 1e3:.1f} ms")
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    lines = [
        f"### {datetime.now(UTC):%Y-%m-%d %H:%M} UTC — driver overhead per event batch, median of {args.repeats}",
        "",
        f"`advance()` minus the cluster's events, summed over {BATCHES} batches of {BATCH_S * 1e3:.0f} ms "
        f"modelled time; 1P1D, `synthetic-8b`, 4-token prompts, 400-token outputs; load average {load}. "
        "Both drivers run on the same cluster code (which fills `touched` inside its events either way).",
        "",
        "| case | in flight | decode `max_num_seqs` | rescan every request (before) | touched requests only (now) |",
        "|---|---:|---:|---:|---:|",
    ]
    for case, n, seqs, old, new in rows:
        lines.append(
            f"| {case} | {n} | {seqs} | {old * 1e3:.1f} ms ({old / BATCHES * 1e6:.0f} µs/batch) "
            f"| {new * 1e3:.1f} ms ({new / BATCHES * 1e6:.0f} µs/batch) |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.record:
        from benchmarks.results_md import record_entry

        record_entry("## Serve driver overhead (benchmarks/serve_driver.py)", text)


if __name__ == "__main__":
    main()
