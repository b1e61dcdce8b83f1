"""KV handoff throughput: KVPuller end to end vs raw gRPC streaming of the same bytes.

    .venv/bin/python -m benchmarks.kv_handoff            # prints, appends to RESULTS.md
    .venv/bin/python -m benchmarks.kv_handoff --no-record --blocks 16 --repeats 3

The producer runs in a child process (as a prefill node would), the consumer
in this one; both on 127.0.0.1. Two paths move the same bytes — a request of
`--blocks` Llama-3-8B fp16 blocks (16 tokens x 128 KiB = 2 MiB each):

- raw: one server-streaming RPC with a generic handler, the bytes pre-cut
  into 256 KiB messages, no protobuf, no checksums, nothing written: the
  ceiling gRPC itself gives on this machine;
- puller: KVPuller.pull() — PullBlocks with 256 KiB chunks, CRC-32 on both
  sides, reassembly, every block written to a sink, then ReportDone.

The two paths alternate, `--repeats` times each; the median of each is
reported. Target: puller >= 50 % of raw.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import platform
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path

import grpc

from connector.grpc import KVHandoffServer, KVPuller, PullerConfig
from connector.grpc.wire import KiB, channel_options, server_options, tune_malloc_for_bulk_transfer
from connector.payload import LLAMA3_8B_FP16_BYTES_PER_TOKEN, block_payload
from connector.transport import InMemoryBlockSource

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
RAW_METHOD = "/bench.Raw/Stream"
MESSAGE_BYTES = 256 * KiB
TOKENS_PER_BLOCK = 16
REQUEST_ID = "bench-req"


def make_blocks(num_blocks: int) -> dict[int, bytes]:
    return {
        i: block_payload(REQUEST_ID, i, TOKENS_PER_BLOCK, LLAMA3_8B_FP16_BYTES_PER_TOKEN) for i in range(num_blocks)
    }


# -- producer process ----------------------------------------------------------


async def _serve(num_blocks: int, conn) -> None:
    blocks = make_blocks(num_blocks)
    source = InMemoryBlockSource()
    source.add(REQUEST_ID, blocks)
    joined = b"".join(blocks.values())
    messages = [joined[i : i + MESSAGE_BYTES] for i in range(0, len(joined), MESSAGE_BYTES)]

    async def raw_stream(request: bytes, context):
        for message in messages:
            yield message

    raw = grpc.aio.server(options=server_options())
    raw.add_generic_rpc_handlers(
        [
            grpc.method_handlers_generic_handler(
                "bench.Raw", {"Stream": grpc.unary_stream_rpc_method_handler(raw_stream)}
            )
        ]
    )
    raw_port = raw.add_insecure_port("127.0.0.1:0")
    await raw.start()
    kv = KVHandoffServer(source, default_chunk_bytes=MESSAGE_BYTES)
    kv_address = await kv.start()
    conn.send((f"127.0.0.1:{raw_port}", kv_address))
    # Serve until the parent says stop (or goes away).
    await asyncio.get_running_loop().run_in_executor(None, conn.recv)
    await kv.stop(grace=0)
    await raw.stop(grace=0)


def producer_main(num_blocks: int, conn, tune_malloc: bool) -> None:
    if tune_malloc:
        tune_malloc_for_bulk_transfer()
    try:
        asyncio.run(_serve(num_blocks, conn))
    except EOFError:
        pass


# -- consumer side -------------------------------------------------------------


class DiscardingSink:
    """Counts what it is given; keeps nothing (the store is not under test)."""

    def __init__(self) -> None:
        self.bytes = 0

    def write_block(self, local_block_id, request_id, block_index, data) -> None:
        self.bytes += len(data)


async def _raw_once(channel: grpc.aio.Channel, expected: int) -> float:
    stream = channel.unary_stream(RAW_METHOD)
    started = time.perf_counter()
    received = 0
    async for message in stream(b""):
        received += len(message)
    elapsed = time.perf_counter() - started
    assert received == expected, (received, expected)
    return elapsed


async def _puller_once(puller: KVPuller, sink: DiscardingSink, address: str, n: int, expected: int) -> float:
    sink.bytes = 0
    started = time.perf_counter()
    result = await puller.pull(REQUEST_ID, address, list(range(n)), list(range(n)))
    elapsed = time.perf_counter() - started
    assert result.ok and result.done_reported, result
    assert sink.bytes == result.num_bytes == expected, (sink.bytes, expected)
    return elapsed


async def measure(raw_address: str, kv_address: str, num_blocks: int, repeats: int) -> dict:
    total = num_blocks * TOKENS_PER_BLOCK * LLAMA3_8B_FP16_BYTES_PER_TOKEN
    sink = DiscardingSink()
    config = PullerConfig(attempt_timeout_s=60, deadline_s=120, max_chunk_bytes=MESSAGE_BYTES)
    raw_times, pull_times = [], []
    async with grpc.aio.insecure_channel(raw_address, options=channel_options()) as channel:
        async with KVPuller(sink, config) as puller:
            await _raw_once(channel, total)  # warm-up: connections, allocator
            await _puller_once(puller, sink, kv_address, num_blocks, total)
            for _ in range(repeats):
                raw_times.append(await _raw_once(channel, total))
                pull_times.append(await _puller_once(puller, sink, kv_address, num_blocks, total))
    raw_mbps = total / statistics.median(raw_times) / 1e6
    pull_mbps = total / statistics.median(pull_times) / 1e6
    return {
        "bytes_per_pull": total,
        "repeats": repeats,
        "raw_MBps": raw_mbps,
        "puller_MBps": pull_mbps,
        "ratio": pull_mbps / raw_mbps,
        "raw_runs_MBps": [total / t / 1e6 for t in raw_times],
        "puller_runs_MBps": [total / t / 1e6 for t in pull_times],
    }


def run(num_blocks: int = 64, repeats: int = 5, tune_malloc: bool = True) -> dict:
    """Both processes get the same allocator setting, so both paths do too."""
    tuned = tune_malloc and tune_malloc_for_bulk_transfer()
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    producer = ctx.Process(target=producer_main, args=(num_blocks, child, tuned), daemon=True)
    producer.start()
    try:
        if not parent.poll(120):
            raise RuntimeError("producer process did not come up within 120 s")
        raw_address, kv_address = parent.recv()
        figures = asyncio.run(measure(raw_address, kv_address, num_blocks, repeats))
        return {**figures, "malloc_tuned": tuned}
    finally:
        parent.send("stop")
        producer.join(10)
        if producer.is_alive():
            producer.terminate()
            producer.join(5)


def format_report(figures: dict) -> str:
    runs = lambda key: ", ".join(f"{x:.0f}" for x in figures[key])  # noqa: E731
    verdict = "meets" if figures["ratio"] >= 0.5 else "MISSES"
    return "\n".join(
        [
            f"### {datetime.now(UTC):%Y-%m-%d %H:%M} UTC — "
            f"{figures['bytes_per_pull'] / 1e6:.1f} MB per pull, median of {figures['repeats']}",
            "",
            f"Machine: {platform.machine()}, {mp.cpu_count()} CPUs, Python {platform.python_version()}, "
            f"grpcio {grpc.__version__}, load average {os.getloadavg()[0]:.1f} at the end; "
            "producer and consumer in separate processes on 127.0.0.1; "
            f"glibc malloc tuned for bulk transfer: {'yes' if figures['malloc_tuned'] else 'no'}.",
            "",
            "| path | MB/s (median) | runs (MB/s) |",
            "|---|---:|---|",
            f"| raw gRPC stream, 256 KiB messages | {figures['raw_MBps']:.0f} | {runs('raw_runs_MBps')} |",
            f"| KVPuller.pull (256 KiB chunks, CRC-32, sink, ReportDone) | {figures['puller_MBps']:.0f} "
            f"| {runs('puller_runs_MBps')} |",
            "",
            f"Ratio puller / raw: **{figures['ratio']:.0%}** ({verdict} the >= 50 % target).",
            "",
        ]
    )


SECTION = "## KV handoff throughput (benchmarks/kv_handoff.py)"


def record(report: str, path: Path = RESULTS) -> None:
    """First in this benchmark's section (created if missing)."""
    from benchmarks.results_md import record_entry

    record_entry(SECTION, report, intro=__doc__.strip().splitlines()[0], path=path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, default=64, help="2 MiB blocks per pull (default 64 = 134 MB)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-record", action="store_true", help=f"do not append to {RESULTS.name}")
    parser.add_argument(
        "--no-malloc-tuning",
        action="store_true",
        help="leave glibc's mmap/trim thresholds alone (see tune_malloc_for_bulk_transfer)",
    )
    args = parser.parse_args()
    if args.blocks < 1 or args.repeats < 1:
        parser.error("--blocks and --repeats must be >= 1")
    figures = run(args.blocks, args.repeats, tune_malloc=not args.no_malloc_tuning)
    report = format_report(figures)
    print(report)
    if not args.no_record:
        record(report)
        print(f"appended to {RESULTS}")


if __name__ == "__main__":
    main()
