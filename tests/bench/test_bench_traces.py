"""Trace replay: good fixtures parse exactly; malformed lines name file and line."""

from pathlib import Path

import pytest

from bench.traces import TraceError, load_trace

DATA = Path(__file__).resolve().parents[1] / "data"


def test_mooncake_fixture():
    reqs = load_trace(DATA / "mooncake_small.jsonl")
    assert [(r.request_id, r.arrival_time, r.prompt_len, r.output_len) for r in reqs] == [
        ("trace-0", 0.0, 6955, 52),
        ("trace-1", 1.5, 6472, 26),
        ("trace-2", 1.5, 512, 1),
        ("trace-3", 3.25, 100, 300),
    ]
    assert reqs[0].hash_ids[:3] == (46, 47, 48) and reqs[3].hash_ids == ()


def test_time_scale_and_max_requests():
    reqs = load_trace(DATA / "mooncake_small.jsonl", time_scale=2.0, max_requests=2)
    assert [r.arrival_time for r in reqs] == [0.0, 3.0]


def test_csv_fixture_sorted_stably_with_priority():
    reqs = load_trace(DATA / "trace_small.csv", time_scale=0.5)
    assert [(r.request_id, r.arrival_time, r.prompt_len, r.output_len, r.priority) for r in reqs] == [
        ("trace-0", 0.0, 128, 16, 0),
        ("trace-1", 0.125, 256, 32, 1),
        ("trace-2", 0.125, 64, 8, 0),
        ("trace-3", 0.75, 1024, 128, 2),
    ]


def test_csv_sorts_by_arrival(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("prompt_len,arrival_time,output_len,request_id\n5,2.0,1,late\n7,1.0,2,early\n")
    assert [r.request_id for r in load_trace(p)] == ["early", "late"]


def test_mooncake_bad_json_names_line():
    with pytest.raises(TraceError, match=r"mooncake_bad_json\.jsonl:3: invalid JSON \(Expecting ',' delimiter"):
        load_trace(DATA / "mooncake_bad_json.jsonl")


def test_mooncake_missing_key_names_line():
    with pytest.raises(TraceError, match=r"mooncake_missing_key\.jsonl:2: missing key\(s\) input_length"):
        load_trace(DATA / "mooncake_missing_key.jsonl")


def test_csv_bad_value_names_line():
    with pytest.raises(TraceError, match=r"trace_bad_value\.csv:3: prompt_len 'abc' is not an integer"):
        load_trace(DATA / "trace_bad_value.csv")


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"timestamp": -5, "input_length": 1, "output_length": 1}', "timestamp must be a finite number >= 0"),
        (
            '{"timestamp": 5, "input_length": 0, "output_length": 1}',
            "input_length must be an integer in \\[1, 10,000,000\\], got 0",
        ),
        ('{"timestamp": 5, "input_length": 2.5, "output_length": 1}', "input_length must be an integer, got 2.5"),
        ('{"timestamp": 5, "input_length": 2, "output_length": true}', "output_length must be an integer, got True"),
        ('{"timestamp": 5, "input_length": 2, "output_length": 1, "hash_ids": "x"}', "hash_ids must be a list"),
        ("[1, 2]", "expected a JSON object, got list"),
    ],
)
def test_mooncake_value_errors(tmp_path, line, message):
    p = tmp_path / "t.jsonl"
    p.write_text('{"timestamp": 0, "input_length": 1, "output_length": 1}\n' + line + "\n")
    with pytest.raises(TraceError, match=f"t.jsonl:2: {message}"):
        load_trace(p)


def test_csv_header_and_shape_errors(tmp_path):
    p = tmp_path / "h.csv"
    p.write_text("time,prompt_len,output_len\n0,1,1\n")
    with pytest.raises(TraceError, match="h.csv:1: header lacks column\\(s\\) arrival_time; required"):
        load_trace(p)
    p.write_text("arrival_time,prompt_len,output_len\n0,1,1\n0,1\n")
    with pytest.raises(TraceError, match="h.csv:3: expected 3 columns like the header, got 2"):
        load_trace(p)
    p.write_text("arrival_time,prompt_len,output_len,request_id\n0,1,1,a\n0,1,1,a\n")
    with pytest.raises(TraceError, match="h.csv:3: duplicate request_id 'a'"):
        load_trace(p)


def test_argument_and_file_errors(tmp_path):
    with pytest.raises(TraceError, match="time_scale must be a finite number > 0"):
        load_trace(DATA / "trace_small.csv", time_scale=0)
    with pytest.raises(TraceError, match="cannot infer trace format from suffix '.txt'"):
        load_trace(tmp_path / "x.txt")
    with pytest.raises(TraceError, match="trace file not found"):
        load_trace(tmp_path / "missing.csv")
    empty = tmp_path / "e.jsonl"
    empty.write_text("\n")
    with pytest.raises(TraceError, match="trace has no requests"):
        load_trace(empty)
