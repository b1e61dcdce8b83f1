"""The API-server model (engine/front_end.py): one FIFO server for request
work and token streaming, IPC as a latency, presets and their errors."""

import pytest

from cluster.spec import ClusterSpec
from engine.front_end import (
    DEFAULT_FRONT_END,
    FrontEnd,
    FrontEndParams,
    checked_front_end,
    front_end_params,
    shipped_front_ends,
)


def _fe(**kw) -> FrontEnd:
    return FrontEnd(FrontEndParams(**kw))


def test_requests_at_once_are_tokenized_one_after_another():
    fe = _fe(request_ms=10.0, prompt_token_us=2.0, ipc_ms=1.0)
    # 1,000 tokens: 10 ms + 2 ms of work each, then 1 ms to the engine core.
    assert [round(fe.request_ready_at(0.0, 1000), 9) for _ in range(3)] == [0.013, 0.025, 0.037]
    # A request arriving after the server went idle waits for nothing.
    assert fe.request_ready_at(1.0, 0) == pytest.approx(1.011)
    assert fe.busy_s == pytest.approx(3 * 0.012 + 0.010)


def test_tokens_queue_behind_the_request_work_handed_in_before_them():
    fe = _fe(request_ms=20.0, output_token_us=500.0, ipc_ms=1.0)
    ready = [fe.request_ready_at(0.0, 8) for _ in range(2)]
    assert ready == pytest.approx([0.021, 0.041])
    # The engine emits the first request's first token at 30 ms: it crosses (1 ms), then waits
    # for the second request's tokenization to finish (40 ms), then 0.5 ms of streaming.
    assert fe.tokens_visible_at(0.030, 1) == pytest.approx(0.0405)
    # Two tokens of one step at 50 ms: 1 ms across, 1 ms of streaming.
    assert fe.tokens_visible_at(0.050, 2) == pytest.approx(0.052)


def test_off_changes_nothing():
    fe = FrontEnd(front_end_params("off"))
    assert fe.params.is_off
    assert fe.request_ready_at(1.5, 10_000) == 1.5 and fe.tokens_visible_at(2.5, 3) == 2.5


def test_presets_cite_a_source_and_overrides_apply():
    presets = shipped_front_ends()
    assert {"off", DEFAULT_FRONT_END} <= set(presets)
    for name, p in presets.items():
        assert p["source"], name
    assert front_end_params(DEFAULT_FRONT_END, request_ms=3.0).request_ms == 3.0
    spec = ClusterSpec.model_validate({"front_end": {"request_ms": 3.0}})
    assert spec.front_end.params() == front_end_params(DEFAULT_FRONT_END, request_ms=3.0)
    assert ClusterSpec.model_validate({}).front_end.preset == DEFAULT_FRONT_END


@pytest.mark.parametrize(
    ("doc", "fragment"),
    [
        ({"preset": "vllm-9"}, "preset='vllm-9' is unknown; allowed: ['off'"),
        ({"request_ms": -1}, "request_ms"),
        ({"tokenize_us": 1}, "tokenize_us"),
    ],
)
def test_bad_front_end_settings_name_the_field(doc, fragment):
    with pytest.raises(ValueError, match=fragment.replace("[", r"\[").replace("(", r"\(")):
        ClusterSpec.model_validate({"front_end": doc})
    with pytest.raises(ValueError, match=r"front_end.output_token_us=-2 is invalid; allowed: >= 0"):
        checked_front_end({"output_token_us": -2})  # a preset's or a fitted file's terms


def test_a_nodes_output_batches_are_streamed_in_turn():
    stream = _fe(request_ms=50.0, output_token_us=500.0, ipc_ms=1.0).output_stream()
    # A batch of 4 tokens at 10 ms: 1 ms across, then 2 ms of streaming; every token seen at its end.
    assert stream.batch_visible_at(0.010, 4) == pytest.approx(0.013)
    # The next batch crosses by 12 ms but waits for the first: 13 ms + 1 ms.
    assert stream.batch_visible_at(0.011, 2) == pytest.approx(0.014)
    # An empty batch streams nothing and holds nothing up.
    assert stream.batch_visible_at(0.012, 0) == 0.012
    # After the server went idle, a batch waits only for its own crossing.
    assert stream.batch_visible_at(0.100, 1) == pytest.approx(0.1015)
    # The request side is another queue: its 50 ms per request delay no stream.
    other = _fe(request_ms=50.0, output_token_us=500.0, ipc_ms=1.0)
    other.request_ready_at(0.0, 10)
    assert other.output_stream().batch_visible_at(0.010, 4) == pytest.approx(0.013)


def test_an_off_stream_shows_tokens_when_they_reach_the_proxy():
    stream = FrontEnd(front_end_params("off", request_ms=5.0)).output_stream()
    assert stream.is_off and stream.batch_visible_at(2.5, 3) == 2.5


def test_batches_at_once_are_the_batches_one_by_one():
    times, sizes = [0.010, 0.011, 0.012, 0.100], [4, 2, 0, 1]
    one = _fe(output_token_us=500.0, ipc_ms=1.0).output_stream()
    bulk = _fe(output_token_us=500.0, ipc_ms=1.0).output_stream()
    assert bulk.batches_visible_at(times, sizes) == [one.batch_visible_at(t, n) for t, n in zip(times, sizes)]
    assert bulk.batch_visible_at(0.1, 3) == one.batch_visible_at(0.1, 3)  # and leave the server in the same state
