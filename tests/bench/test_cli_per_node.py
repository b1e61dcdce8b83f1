"""From the CLI: per-node figures — `--by-node` columns, thresholds on
`metric[variant@node]`, checked before anything runs — and step panels that
leave out a node whose lines are all flat."""

from __future__ import annotations

import yaml

from engine.records import StepRecord
from tests.bench.cli_helpers import cli, tiny_results
from tests.bench.test_cli_progress import TINY


def test_compare_by_node_shows_a_column_per_node(tmp_path):
    res = tiny_results(tmp_path)
    done = cli("compare", str(res), "--by-node", "--baseline", "fixed", "--metric", "num_preemptions", columns=200)
    assert done.returncode == 0, done.stderr
    header = [line for line in done.stdout.splitlines() if "@decode-0" in line][0]
    assert header.count("@decode-0") == 2 and header.count("@decode-1") == 2
    row = [line for line in done.stdout.splitlines() if line.startswith("│ num_preemptions")][0]
    cells = [c.strip() for c in row.split("│")[2:-1]]
    # fixed: 2, 4 -> decode-0 2, 3 and decode-1 0, 1; prefix: 40, 60 -> 27, 40 and 13, 20.
    assert cells == [
        "3 ± 1.414",
        "2.5 ± 0.7071",
        "0.5 ± 0.7071",
        "50 ± 14.14 (×16.67)",
        "33.5 ± 9.192 (×13.4)",
        "16.5 ± 4.95 (×33)",
    ]


def test_thresholds_on_one_node(tmp_path):
    res = str(tiny_results(tmp_path))
    ok = cli("compare", res, "--threshold", "num_preemptions[prefix@decode-1] == 16.5", "--format", "json")
    assert ok.returncode == 0, ok.stderr
    bad = cli("compare", res, "--threshold", "num_preemptions[prefix@decode-2] > 0")
    assert bad.returncode == 2
    assert bad.stderr == (
        "error: unknown node 'decode-2' of variant 'prefix'; did you mean decode-0?; known: decode-0, decode-1\n"
    )


def test_a_scenario_threshold_naming_an_unknown_node_is_refused_before_running(tmp_path):
    doc = dict(TINY, thresholds=["num_preemptions[fixed@decode-0] == 0", "num_preemptions[fixed@decode-7] == 0"])
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(doc))
    done = cli("validate", str(path))
    assert done.returncode == 2
    assert (
        "names node 'decode-7' of variant 'fixed'; did you mean decode-0?; allowed: prefill-0, decode-0" in done.stderr
    )
    doc["thresholds"] = doc["thresholds"][:1]
    path.write_text(yaml.safe_dump(doc))
    assert cli("validate", str(path)).returncode == 0


def _steps(node: str, preemptions: list[int]) -> list[StepRecord]:
    return [
        StepRecord(
            node=node, time=float(i), step_index=i, batch_size=1, num_scheduled_tokens=1, num_prefill_tokens=0,
            num_decode_tokens=1, num_running=1, num_waiting=0, num_waiting_for_remote_kvs=0, num_free_blocks=1,
            num_deferred_blocks=0, num_total_blocks=2, batches_in_flight=1, num_preemptions_total=p,
            num_zero_progress_preemptions_total=0,
        )
        for i, p in enumerate(preemptions)
    ]  # fmt: skip


def test_a_flat_node_panel_is_left_out():
    from bench.plots import _flat, _StepsByNode

    split = _StepsByNode.of({"fixed": [_steps("prefill-0", [0, 0, 0]) + _steps("decode-0", [0, 1, 3])]})
    preemptions = [("", lambda s: s.num_preemptions_total, "-")]
    assert _flat(split, "prefill-0", preemptions)
    assert not _flat(split, "decode-0", preemptions)
