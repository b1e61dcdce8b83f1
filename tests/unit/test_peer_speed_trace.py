"""benchmarks/peer_speed.py's export of a workload to the mocker's Mooncake
JSONL trace, and the engine settings it hands the mocker (the mocker itself
is a benchmark-only install: not needed here)."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.peer_speed import ENGINE, export_mooncake, mocker_kwargs


def test_each_request_is_one_line_with_its_own_block_ids(tmp_path: Path) -> None:
    rows = [["0", 0.0, 16, 5], ["1", 0.25, 17, 1], ["2", 1.5, 1, 300]]
    path = tmp_path / "t.jsonl"
    export_mooncake(rows, path)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines == [
        {"timestamp": 0.0, "input_length": 16, "output_length": 5, "hash_ids": [0]},
        {"timestamp": 250.0, "input_length": 17, "output_length": 1, "hash_ids": [1, 2]},
        {"timestamp": 1500.0, "input_length": 1, "output_length": 300, "hash_ids": [3]},
    ]


def test_the_mocker_gets_our_limits_caching_and_topology() -> None:
    agg_on = mocker_kwargs("agg on")
    assert agg_on == {"extra_engine_args": {"engine": dict(ENGINE, enable_prefix_caching=True)}}
    assert mocker_kwargs("agg off")["extra_engine_args"]["engine"]["enable_prefix_caching"] is False
    pd = mocker_kwargs("1P1D off")
    assert pd["num_prefill_workers"] == pd["num_decode_workers"] == 1
    assert pd["prefill_engine_args"]["engine"] == dict(ENGINE, enable_prefix_caching=False, worker_type="prefill")
    assert pd["decode_engine_args"]["engine"] == dict(ENGINE, enable_prefix_caching=False, worker_type="decode")
    assert ENGINE == {"num_gpu_blocks": 7424, "block_size": 16, "max_num_seqs": 128, "max_num_batched_tokens": 4096}
