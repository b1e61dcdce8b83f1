"""Serve soak: `disagg-sim serve` (a separate process, with an API key) under
random clients for `--minutes`: completions and chats (streamed or not),
clients that leave mid-stream, bad requests (broken or hostile JSON, no
or a wrong key), slowloris connections that never finish their headers,
scrapes of /metrics. Samples the server's RSS every 10 s (with
`--runtime ray`, of its whole process tree: the Ray cluster and its actors).

Passes when, after the warm-up (the first sixth), RSS stays within 10 % of
its first sample there, every slowloris connection was closed by the server,
no request got an answer it should not have, and once the clients stop no
request is running or waiting on any node.

    .venv/bin/python -m benchmarks.serve_soak --minutes 30 --record

Not part of the test suite (it takes as long as it is told).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import aiohttp

from benchmarks.results_md import record_entry

KEY = "soak-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
WORDS = "the a cat sat on mat of an old red house by river".split()


def tree_rss_mib(root: int, whole_tree: bool) -> float:
    """RSS of `root` (and of every process under it)."""
    pids = {root}
    if whole_tree:
        children: dict[int, list[int]] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    stat = Path(f"/proc/{entry}/stat").read_text()
                except OSError:
                    continue
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry))
        todo = [root]
        while todo:
            for child in children.get(todo.pop(), []):
                if child not in pids:
                    pids.add(child)
                    todo.append(child)
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024


def start_server(runtime: str, time_scale: float) -> tuple[subprocess.Popen, int]:
    cmd = [sys.executable, "-m", "bench.cli", "serve", "--runtime", runtime, "--port", "0", "--api-key", KEY]
    cmd += ["--time-scale", str(time_scale)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + 300
    for line in proc.stdout:
        found = re.search(r"http://127\.0\.0\.1:(\d+)/v1", line)
        if found:
            return proc, int(found.group(1))
        if time.monotonic() > deadline:
            break
    proc.kill()
    raise RuntimeError(f"the server did not start: {cmd}")


def prompt(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 300)))


BAD_BODIES = [
    b"{not json",
    b'{"prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}",
    b'{"prompt": "x", "max_tokens": ' + b"9" * 5000 + b"}",
    b'{"prompt": "x", "' + b"y" * 100_000 + b'": 1}',
    b'{"prompt": "x", "stream": true, "stream_options": {"include_usage": "yes"}}',
    b'{"prompt": "x", "n": 3}',
]


class Clients:
    def __init__(self, base: str, port: int, seed: int) -> None:
        self.base = base
        self.port = port
        self.rng = random.Random(seed)
        self.outcomes: Counter[str] = Counter()
        self.unexpected: list[str] = []

    def bad(self, what: str) -> None:
        self.outcomes["unexpected"] += 1
        if len(self.unexpected) < 20:
            self.unexpected.append(what[:200])

    async def completion(self, session: aiohttp.ClientSession, leave_after: int | None) -> None:
        rng = self.rng
        chat = rng.random() < 0.3
        stream = leave_after is not None or rng.random() < 0.6
        body: dict = {"max_tokens": rng.randint(1, 200 if leave_after else 96), "stream": stream}
        if rng.random() < 0.3:
            body["ignore_eos"] = True
        if chat:
            body["messages"] = [{"role": "user", "content": prompt(rng)}]
        else:
            body["prompt"] = prompt(rng)
        path = "/v1/chat/completions" if chat else "/v1/completions"
        async with session.post(self.base + path, json=body, headers=AUTH) as resp:
            if resp.status == 429:
                self.outcomes["busy_429"] += 1
                return
            if resp.status != 200:
                self.bad(f"{path} {resp.status} {await resp.text()}")
                return
            if not stream:
                reply = await resp.json()
                ok = reply["choices"][0]["finish_reason"] in ("stop", "length")
                self.outcomes["completed" if ok else "unexpected"] += 1
                return
            chunks = 0
            async for line in resp.content:
                if line.startswith(b"data: "):
                    chunks += 1
                    if leave_after is not None and chunks >= leave_after:
                        resp.close()  # the client goes away mid-stream
                        self.outcomes["left_mid_stream"] += 1
                        return
                    if line.startswith(b"data: [DONE]"):
                        self.outcomes["completed"] += 1
                        return
            self.outcomes["completed_short"] += 1  # fewer chunks than it would have left after

    async def hostile(self, session: aiohttp.ClientSession) -> None:
        rng = self.rng
        if rng.random() < 0.3:
            headers = rng.choice([{}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic soak-key"}])
            async with session.post(self.base + "/v1/completions", json={"prompt": "x"}, headers=headers) as resp:
                ok = resp.status == 401 and await resp.json() == {"error": "Unauthorized"}
        else:
            body = rng.choice(BAD_BODIES)
            headers = {**AUTH, "Content-Type": "application/json"}
            async with session.post(self.base + "/v1/completions", data=body, headers=headers) as resp:
                reply = await resp.json(content_type=None)
                ok = resp.status == 400 and reply["error"]["code"] == 400
        if ok:
            self.outcomes["refused_as_it_should"] += 1
        else:
            self.bad("hostile request answered otherwise")

    async def slowloris(self) -> None:
        """Headers never finished: the server must close the connection (10 s)."""
        loop = asyncio.get_running_loop()
        sock = socket.create_connection(("127.0.0.1", self.port))
        sock.setblocking(False)
        try:
            await loop.sock_sendall(sock, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
            began = time.monotonic()
            try:
                while True:
                    got = await asyncio.wait_for(loop.sock_recv(sock, 4096), 30.0)
                    if not got:
                        break
            except TimeoutError:
                self.bad("a slowloris connection stayed open 30 s")
                return
            except ConnectionError:
                pass
            self.outcomes["slowloris_closed"] += 1
            self.outcomes["slowloris_closed_s_total"] += round(time.monotonic() - began)
        finally:
            sock.close()

    async def worker(self, session: aiohttp.ClientSession, stop_at: float) -> None:
        rng = self.rng
        while time.monotonic() < stop_at:
            r = rng.random()
            try:
                if r < 0.62:
                    await self.completion(session, None)
                elif r < 0.80:
                    await self.completion(session, rng.randint(1, 20))
                elif r < 0.92:
                    await self.hostile(session)
                elif r < 0.95:
                    await self.slowloris()
                else:
                    path = rng.choice(["/metrics", "/health", "/v1/models"])
                    async with session.get(self.base + path, headers=AUTH) as resp:
                        await resp.read()
                        self.outcomes["scrape_ok" if resp.status == 200 else "unexpected"] += 1
            except (aiohttp.ClientError, OSError, TimeoutError) as err:
                self.bad(f"client error {type(err).__name__}: {err}")
            await asyncio.sleep(rng.random() * 0.2)


def running_and_waiting(metrics: str) -> float:
    total = 0.0
    for line in metrics.splitlines():
        if line.startswith(("vllm:num_requests_running{", "vllm:num_requests_waiting{")):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def soak(args: argparse.Namespace, proc: subprocess.Popen, port: int) -> dict:
    base = f"http://127.0.0.1:{port}"
    clients = Clients(base, port, args.seed)
    start = time.monotonic()
    stop_at = start + args.minutes * 60
    samples: list[tuple[float, float]] = []

    async def sample() -> None:
        while time.monotonic() < stop_at:
            samples.append((time.monotonic() - start, tree_rss_mib(proc.pid, args.runtime == "ray")))
            await asyncio.sleep(10)

    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        sampler = asyncio.ensure_future(sample())
        await asyncio.gather(*(clients.worker(session, stop_at) for _ in range(args.clients)))
        await sampler
        await asyncio.sleep(5)  # aborts and last steps settle
        async with session.get(base + "/metrics") as resp:
            metrics = await resp.text()
    samples.append((time.monotonic() - start, tree_rss_mib(proc.pid, args.runtime == "ray")))
    warm = [rss for t, rss in samples if t >= args.minutes * 60 / 6]
    aborts = sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("vllm:request_success_total{") and 'finished_reason="abort"' in line
    )
    closed = clients.outcomes["slowloris_closed"]
    outcomes = dict(clients.outcomes)
    outcomes["slowloris_mean_s"] = round(outcomes.pop("slowloris_closed_s_total", 0) / max(1, closed), 1)
    return {
        "runtime": args.runtime,
        "minutes": round((time.monotonic() - start) / 60, 2),
        "clients": args.clients,
        "outcomes": outcomes,
        "unexpected": clients.unexpected,
        "aborts_counted": aborts,
        "running_or_waiting_at_end": running_and_waiting(metrics),
        "rss_mib_start": round(samples[0][1], 1),
        "rss_mib_after_warmup_first": round(warm[0], 1),
        "rss_mib_after_warmup_min": round(min(warm), 1),
        "rss_mib_after_warmup_max": round(max(warm), 1),
        "rss_mib_last": round(samples[-1][1], 1),
        "rss_growth_after_warmup": round(max(warm) / warm[0] - 1, 4),
        "rss_samples": [(round(t), round(r, 1)) for t, r in samples],
    }


def record(summary: dict) -> None:
    o = summary["outcomes"]
    passed = (
        summary["rss_growth_after_warmup"] <= 0.10
        and summary["running_or_waiting_at_end"] == 0
        and o.get("unexpected", 0) == 0
    )
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    s = summary
    verdict = "Passed" if passed else "FAILED"
    row = [
        o.get("completed", 0) + o.get("completed_short", 0),
        o.get("left_mid_stream", 0),
        o.get("refused_as_it_should", 0),
        o.get("busy_429", 0),
        f"{o.get('slowloris_closed', 0):,} ({o['slowloris_mean_s']})",
        o.get("scrape_ok", 0),
        o.get("unexpected", 0),
        int(s["aborts_counted"]),
    ]
    cells = " | ".join(f"{c:,}" if isinstance(c, int) else c for c in row)
    entry = (
        f"### {stamp} — {s['minutes']:g} minutes, {s['runtime']}, {s['clients']} clients\n\n"
        f"2-core box shared with other agents. {verdict}: RSS {s['rss_mib_start']} MiB at start; after the\n"
        f"warm-up (first sixth) {s['rss_mib_after_warmup_first']} MiB, then "
        f"{s['rss_mib_after_warmup_min']}–{s['rss_mib_after_warmup_max']} MiB\n"
        f"(growth {s['rss_growth_after_warmup']:.1%}; limit 10 %); "
        f"{s['running_or_waiting_at_end']:g} requests running or waiting at the end.\n\n"
        "| completed | left mid-stream | refused as they should be (400/401) | 429 "
        "| slowloris closed (mean s) | scrapes | unexpected | aborts in /metrics |\n"
        "|---:|---:|---:|---:|---:|---:|---:|---:|\n"
        f"| {cells} |\n"
    )
    intro = (
        "`disagg-sim serve` (the default `serve` scenario, an API key) in its own process under random\n"
        "clients: completions and chats, streamed or not; clients leaving mid-stream; bad bodies and\n"
        "missing keys; slowloris connections; scrapes. RSS sampled every 10 s. Command:\n"
        "`.venv/bin/python -m benchmarks.serve_soak --minutes 30 --record`."
    )
    record_entry("## Serve soak (benchmarks/serve_soak.py)", entry, intro)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--clients", type=int, default=12)
    parser.add_argument("--runtime", choices=["inproc", "ray"], default="inproc")
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="write the summary here too")
    parser.add_argument("--record", action="store_true", help="add the result to benchmarks/RESULTS.md")
    args = parser.parse_args()
    proc, port = start_server(args.runtime, args.time_scale)
    try:
        summary = asyncio.run(soak(args, proc, port))
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    print(json.dumps({k: v for k, v in summary.items() if k != "rss_samples"}, indent=2))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    if args.record:
        record(summary)


if __name__ == "__main__":
    main()
