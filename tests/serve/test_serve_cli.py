"""`disagg-sim serve` and `disagg-sim tokenizer` from the command line: bad
input is one line and exit 2; a real `serve` process answers on loopback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request

import pytest

from bench.cli import main
from node.messages import MessageError, RequestMessage


@pytest.mark.parametrize(
    "argv, words",
    [
        (["serve", "--host", "not-a-host"], "--host 'not-a-host': not an IP address"),
        (["serve", "--variant", "nope"], "--variant nope: not in serve; allowed: default"),
        (["serve", "no-such-scenario"], "no-such-scenario"),
        (["serve", "v0-starvation"], "allowed: serve runs v1 nodes only"),
        (["serve", "--address", "127.0.0.1:1"], "--address 127.0.0.1:1: only the Ray runtime attaches"),
    ],
)
def test_bad_serve_input_is_one_line(argv, words, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and words in err


@pytest.mark.parametrize("runtime", ["inproc", pytest.param("ray", marks=pytest.mark.ray)])
def test_serve_process_answers_on_loopback(runtime, request):
    argv = [sys.executable, "-m", "bench.cli", "serve", "--port", "0", "--model-name", "cli-sim"]
    if runtime == "ray":
        # Attached to the session's loopback cluster (one Ray cluster per machine is enough).
        request.getfixturevalue("ray_cluster")
        from cluster.ray.env import ray

        argv += ["--runtime", "ray", "--address", ray.get_runtime_context().gcs_address]
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONUNBUFFERED="1")
    )
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert line.startswith("serving serve/default as model 'cli-sim' on http://127.0.0.1:"), line + (
            proc.stderr.read() if proc.poll() is not None and proc.stderr else ""
        )
        assert ("(Ray, " in line) == (runtime == "ray")
        url = line.split(" on ", 1)[1].split()[0]
        with urllib.request.urlopen(url + "/models", timeout=30) as resp:
            assert [m["id"] for m in json.load(resp)["data"]] == ["cli-sim"]
        body = json.dumps({"model": "cli-sim", "prompt": "a b", "max_tokens": 3}).encode()
        req = urllib.request.Request(url + "/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert json.load(resp)["usage"] == {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()  # no server left behind by a failing run
    assert proc.returncode == 130


def test_request_message_carries_sampling_fields():
    m = RequestMessage("r", 4, 8, 0.0, 0, None, False, None, 2, [7, 9])
    back = RequestMessage.from_wire(m.to_wire())
    assert back == m
    req = back.to_request(eos_token_id=2)
    assert (req.sampling_params.min_tokens, req.sampling_params.stop_token_ids) == (2, [7, 9])
    with pytest.raises(MessageError, match="stop_token_ids must be a list"):
        RequestMessage.from_wire(["req", "r", 4, 8, 0.0, 0, None, False, None, 0, ["x"]])
    with pytest.raises(MessageError, match="min_tokens"):
        RequestMessage.from_wire(["req", "r", 4, 8, 0.0, 0, None, False, None, True, None])
