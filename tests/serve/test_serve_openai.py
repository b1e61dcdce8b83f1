"""`disagg-sim serve` driven by the `openai` Python SDK (a client no one here
wrote) and by raw HTTP where the SDK hides the wire (SSE framing, a client
that goes away). Outcomes are exact: token counts, texts (the words of the
engine's token ids), finish reasons, error types and statuses. Every test
runs on both runtimes (`server` is parametrized: in-process, and Ray with
the front door in the proxy actor)."""

from __future__ import annotations

import http.client
import json
import time
import urllib.request

import pytest

from bench.serve.tokenizer import get_tokenizer, render_chat
from engine.sampler import DeterministicSampler

from .conftest import MODEL, serve_spec, wait_idle

openai = pytest.importorskip("openai")
TOK = get_tokenizer()


def client(srv) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.base_url + "/v1", api_key="unused", max_retries=0, timeout=60)


def last_record(srv):
    return srv.query("last_finished")


def test_completion_text_is_the_engine_tokens(server):
    r = client(server).completions.create(model=MODEL, prompt="hello world bakoti", max_tokens=12)
    rec = last_record(server)
    assert r.id == rec.request_id
    assert r.usage.prompt_tokens == 3 and r.usage.completion_tokens == 12 and r.usage.total_tokens == 15
    assert r.choices[0].finish_reason == "length"
    assert len(rec.output_token_ids) == 12
    assert r.choices[0].text == TOK.decode(rec.output_token_ids)
    assert len(r.choices[0].text.split()) == 12


def test_prompt_token_ids_are_accepted(server):
    ids = [5, 6, 7, 8, 9]
    r = client(server).completions.create(model=MODEL, prompt=ids, max_tokens=3)
    assert r.usage.prompt_tokens == 5 and r.usage.completion_tokens == 3
    assert last_record(server).prompt_len == 5


def test_chat_uses_the_template(server):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    r = client(server).chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=4)
    prompt = TOK.encode(render_chat([("system", "be brief"), ("user", "hi there")]))
    rec = last_record(server)
    assert r.usage.prompt_tokens == len(prompt) == 7
    assert r.usage.completion_tokens == 4
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == TOK.decode(rec.output_token_ids)


def test_streaming_completion_with_usage(server):
    chunks = list(
        client(server).completions.create(
            model=MODEL, prompt="a b c d", max_tokens=6, stream=True, stream_options={"include_usage": True}
        )
    )
    rec = last_record(server)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == TOK.decode(rec.output_token_ids)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    assert chunks[-1].usage.prompt_tokens == 4
    assert all(c.usage is None for c in chunks[:-1])


def test_streaming_chat(server):
    chunks = list(
        client(server).chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "x"}],
            max_completion_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    rec = last_record(server)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == TOK.decode(rec.output_token_ids)
    assert chunks[-1].usage.completion_tokens == 5


def test_sse_wire_ends_with_done(server):
    body = json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 2, "stream": True}).encode()
    req = urllib.request.Request(server.base_url + "/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        events = [line for line in resp.read().decode().split("\n\n") if line]
    assert events[-1] == "data: [DONE]"
    assert all(e.startswith("data: ") for e in events)
    assert len(events) == 4  # two tokens, the finish chunk, [DONE]


@pytest.mark.parametrize("kind", ["completions", "chat/completions"])
def test_no_chunk_leaves_before_its_stamped_time(server, kind):
    """A record stamps each token with when its client sees it (the engine's
    emit time plus the API server's token side: 20 ms of IPC and 0.1 ms a
    token, engine/front_end.py, later than the simulation produces it). A
    real client on loopback reads every chunk no earlier than that time on
    the run's clock (the server's monotonic clock, which the client shares),
    and the finish chunk no earlier than the finish. Causality only: a
    loaded machine makes chunks later, never earlier."""
    chat = kind != "completions"
    fields = {"messages": [{"role": "user", "content": "a b c"}]} if chat else {"prompt": "a b c"}
    body = json.dumps({"model": MODEL, "max_tokens": 24, "ignore_eos": True, "stream": True, **fields})
    host, port = server.base_url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request("POST", f"/v1/{kind}", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    received: list[tuple[float, dict]] = []  # (time.monotonic() at read, chunk)
    for line in resp:
        if line.startswith(b"data: {"):
            received.append((time.monotonic(), json.loads(line[6:])))
    conn.close()
    rec = last_record(server)
    origin, scale = server.query("clock_origin")
    assert received[0][1]["id"] == rec.request_id

    def delta(chunk: dict) -> str | None:
        choice = chunk["choices"][0]
        return (choice["delta"].get("content") if chat else choice["text"]) or None

    token_chunks = [(at, c) for at, c in received if c["choices"][0]["finish_reason"] is None and delta(c)]
    stamps = [t for tok, t in zip(rec.output_token_ids, rec.token_times) if TOK.token_text(tok)]
    assert len(token_chunks) == len(stamps) == 24
    due = [origin + t * scale for t in stamps]  # time.monotonic() at each stamp
    early = [(i, d - at) for i, ((at, _), d) in enumerate(zip(token_chunks, due)) if at < d]
    assert not early, f"chunks read before their stamped time (index, seconds early): {early}"
    if chat:  # the role rides the first token: not before it either
        assert received[0][1]["choices"][0]["delta"].get("role") == "assistant"
        assert received[0][0] >= due[0]
    finish_at, finish = received[-1]
    assert finish["choices"][0]["finish_reason"] == "length"
    assert finish_at >= origin + rec.finish_time * scale


def test_stop_token_ids_and_min_tokens(server):
    c = client(server)
    n = server.query("counts")["num_submitted"]
    sampler = DeterministicSampler(0)
    third = sampler.token_at(f"cmpl-{n:08d}", 1 + 2)  # prompt of one token; the third output
    r = c.completions.create(model=MODEL, prompt="x", max_tokens=20, extra_body={"stop_token_ids": [third]})
    assert (r.choices[0].finish_reason, r.usage.completion_tokens) == ("stop", 3)
    first = sampler.token_at(f"cmpl-{n + 1:08d}", 1)
    r = c.completions.create(
        model=MODEL, prompt="x", max_tokens=8, extra_body={"stop_token_ids": [first], "min_tokens": 2}
    )
    assert (r.choices[0].finish_reason, r.usage.completion_tokens) == ("length", 8)  # below min_tokens: no stop


@pytest.mark.parametrize(
    "kwargs, status, words",
    [
        ({"n": 2}, 400, "allowed: n=1"),
        ({"logprobs": 2}, 400, "supported: max_tokens"),
        ({"extra_body": {"guided_json": {}}}, 400, "guided_json is not supported"),
        ({"max_tokens": 5000}, 400, "maximum context length is 4096"),
        ({"max_tokens": 0}, 400, "max_tokens=0 is invalid"),
        ({"model": "other"}, 404, "does not exist"),
    ],
)
def test_bad_requests_raise_the_sdk_errors(server, kwargs, status, words):
    args = {"model": MODEL, "prompt": "x", "max_tokens": 2, **kwargs}
    with pytest.raises(openai.APIStatusError) as err:
        client(server).completions.create(**args)
    assert err.value.status_code == status
    assert isinstance(err.value, openai.BadRequestError if status == 400 else openai.NotFoundError)
    assert words in err.value.message
    assert err.value.body["type"] in ("invalid_request_error", "not_found_error")


def test_chat_errors(server):
    with pytest.raises(openai.BadRequestError, match="role is invalid"):
        client(server).chat.completions.create(model=MODEL, messages=[{"role": "tool", "content": "x"}])


def test_models_health_metrics(server):
    models = client(server).models.list()
    assert [m.id for m in models.data] == [MODEL]
    with urllib.request.urlopen(server.base_url + "/health", timeout=30) as resp:
        assert resp.status == 200
    with urllib.request.urlopen(server.base_url + "/metrics", timeout=30) as resp:
        text = resp.read().decode()
    assert 'vllm:num_requests_running{engine="decode-0",model_name="sim-test"}' in text
    assert text.count("# TYPE vllm:num_requests_running gauge") == 1
    assert "vllm:time_to_first_token_seconds_bucket" in text


def test_client_disconnect_mid_stream_aborts_the_request(server):
    before = server.query("counts")
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    body = json.dumps({"model": MODEL, "prompt": "a b c", "max_tokens": 3000, "stream": True})
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    seen = b""
    while seen.count(b"\n\n") < 3:  # three tokens in: the request is decoding
        seen += resp.read1(4096)
    conn.sock.close()  # the client goes away
    conn.close()
    assert wait_idle(server) == []  # no request in any scheduler, every block pool fully free
    after = server.query("counts")
    assert after["requests_aborted"] - before["requests_aborted"] == 1  # by the proxy
    assert after["client_aborts"] - before["client_aborts"] == 1  # by the front door
    assert after["in_flight"] == 0
    rec = last_record(server)
    assert rec.finish_reason == "abort" and 3 <= len(rec.output_token_ids) < 3000
    # The decode node's engine aborted it (the abort reached the node that had it).
    decode = server.query("engine_state")["decode-0"]["counters"]
    assert decode["requests_aborted"] >= 1


def test_client_leaving_during_the_prefill_frees_the_prompt_without_a_hold_timeout(server):
    before = server.query("counts")
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    prompt = list(range(5, 3005))  # 3,000 tokens: the prefill node works on it a while
    body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 50})  # not streamed
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    conn.sock.close()  # the client goes away without waiting for anything
    conn.close()
    deadline = time.monotonic() + 60
    while server.query("counts")["client_aborts"] == before["client_aborts"] and time.monotonic() < deadline:
        time.sleep(0.02)  # until the server noticed (no outcome depends on how long it takes)
    assert wait_idle(server) == []
    after = server.query("counts")
    assert after["client_aborts"] - before["client_aborts"] == 1
    assert after["requests_aborted"] - before["requests_aborted"] == 1
    rec = last_record(server)
    assert (rec.prompt_len, rec.finish_reason) == (3000, "abort")
    state = server.query("engine_state")
    # Wherever the abort found it (prefilling, or its prompt held for a pull),
    # the prompt's blocks were freed by the abort or a release, not by the hold timeout.
    assert state["prefill-0"]["counters"]["kv_hold_timeouts"] == 0


def test_full_queue_answers_429(server):
    server.query("set_max_pending", 1)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        body = json.dumps({"model": MODEL, "prompt": "a", "max_tokens": 3000, "stream": True})
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read1(16)  # the first request is in flight
        before = server.query("counts")["rejected_full"]
        with pytest.raises(openai.RateLimitError, match="limit"):
            client(server).completions.create(model=MODEL, prompt="b", max_tokens=2)
        conn.close()
        assert server.query("counts")["rejected_full"] == before + 1
    finally:
        server.query("set_max_pending", 512)
    assert wait_idle(server) == []


def test_ignore_eos(start):
    spec = serve_spec(sampler={"stop_probability": 0.2})
    c = client(start(spec))
    sampler = DeterministicSampler(0, stop_probability=0.2)
    eos_at = next(i for i in range(200) if sampler.token_at("cmpl-00000000", 1 + i) == sampler.eos_token_id)
    r = c.completions.create(model=MODEL, prompt="x", max_tokens=200)
    assert (r.choices[0].finish_reason, r.usage.completion_tokens) == ("stop", eos_at + 1)
    r = c.completions.create(model=MODEL, prompt="x", max_tokens=200, extra_body={"ignore_eos": True})
    assert (r.choices[0].finish_reason, r.usage.completion_tokens) == ("length", 200)


def test_metrics_count_tokens_reasons_and_kv_transfers(start):
    srv = start()
    client(srv).completions.create(model=MODEL, prompt="a b c", max_tokens=12)
    assert wait_idle(srv) == []
    with urllib.request.urlopen(srv.base_url + "/metrics", timeout=30) as resp:
        lines = resp.read().decode().splitlines()
    labels = 'engine="decode-0",model_name="sim-test"'
    want = {
        f"vllm:prompt_tokens_total{{{labels}}} 3.0",
        f"vllm:generation_tokens_total{{{labels}}} 12.0",
        'vllm:request_success_total{engine="decode-0",finished_reason="length",model_name="sim-test"} 1.0',
        f"vllm:request_prompt_tokens_count{{{labels}}} 1.0",
        f"vllm:request_generation_tokens_sum{{{labels}}} 12.0",
        f"vllm:request_prefill_time_seconds_count{{{labels}}} 1.0",
        f"vllm:request_decode_time_seconds_count{{{labels}}} 1.0",
        f"vllm:nixl_xfer_time_seconds_count{{{labels}}} 1.0",
        f"vllm:nixl_num_failed_transfers_total{{{labels}}} 0.0",
        f"disagg_sim:kv_pulls_completed_total{{{labels}}} 1.0",
        f"disagg_sim:kv_blocks_pulled_total{{{labels}}} 1.0",
    }
    assert want <= set(lines), sorted(want - set(lines))
    steps = [x for x in lines if x.startswith('vllm:iteration_tokens_total_count{engine="prefill-0"')]
    assert steps == ['vllm:iteration_tokens_total_count{engine="prefill-0",model_name="sim-test"} 1.0']


def test_grafana_dashboard_names_only_exported_metrics(server):
    import re
    from pathlib import Path

    dashboard = json.loads((Path(__file__).parents[2] / "docs/grafana/disagg-sim-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {m.removesuffix("_bucket") for e in exprs for m in re.findall(r"((?:vllm|disagg_sim):[a-z0-9_]+)", e)}
    with urllib.request.urlopen(server.base_url + "/metrics", timeout=30) as resp:
        exported = {line.split()[2] for line in resp.read().decode().splitlines() if line.startswith("# TYPE")}
    counters = {n + "_total" for n in exported}
    assert used <= exported | counters, sorted(used - exported - counters)
    assert len(used) >= 20
