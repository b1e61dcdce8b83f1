"""From the CLI: `serve` with stdout not a terminal says what it starts (on
stderr, so stdout's first line is still the URL) and then, as requests are
served, plain lines of what it has served."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import urllib.request

import pytest


def _lines(stream, into: queue.Queue) -> None:
    for line in stream:
        into.put(line.rstrip("\n"))


def _next_matching(lines: queue.Queue, prefix: str, timeout: float = 60) -> str:
    while True:
        line = lines.get(timeout=timeout)
        if line.startswith(prefix):
            return line


@pytest.mark.parametrize("runtime", ["inproc", pytest.param("ray", marks=pytest.mark.ray)])
def test_no_tty_serve_says_what_it_starts_and_what_it_served(runtime, request):
    argv = [sys.executable, "-m", "bench.cli", "serve", "--port", "0", "--model-name", "m"]
    expected_start = ["starting: serve/default in-process (its nodes, the tokenizer, the front door) ..."]
    if runtime == "ray":
        request.getfixturevalue("ray_cluster")
        from cluster.ray.env import ray

        address = ray.get_runtime_context().gcs_address
        argv += ["--runtime", "ray", "--address", address]
        expected_start = [
            f"starting: serve/default on Ray: attaching to the cluster at {address} ...",
            "starting: serve/default on Ray: the node actors and the proxy actor with the front door ...",
        ]
    env = dict(os.environ, PYTHONUNBUFFERED="1", DISAGG_SIM_PROGRESS_S="0.2")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    out: queue.Queue = queue.Queue()
    threading.Thread(target=_lines, args=(proc.stdout, out), daemon=True).start()
    try:
        ready = out.get(timeout=120)
        assert ready.startswith("serving serve/default as model 'm' on http://127.0.0.1:"), ready
        url = ready.split(" on ", 1)[1].split()[0]
        for n in (1, 2):
            body = json.dumps({"model": "m", "prompt": "a b c", "max_tokens": 4}).encode()
            req = urllib.request.Request(url + "/completions", body, {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=30) as resp:
                assert json.load(resp)["usage"]["completion_tokens"] == 4
            line = _next_matching(out, f"served: {n} finished")
            assert line == f"served: {n} finished, 0 in flight, 0 refused (429), 0 aborted by their client"
        try:  # nothing new for five intervals: nothing said
            extra = out.get(timeout=1.0)
        except queue.Empty:
            extra = None
        assert extra is None
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()  # no server left behind by a failing run
    err = proc.stderr.read().splitlines() if proc.stderr else []
    assert err[: len(expected_start)] == expected_start, err
    assert proc.returncode == 130
