"""Results that describe themselves and can be re-run; compare of labelled
result sets with a JSON summary; the table, plots and report; the docs
reference kept equal to the code; regression tests for step durations and
per-node retry counts."""

import io
import json
from pathlib import Path

import yaml
from rich.console import Console

from bench.cli import main
from bench.compare import format_compare_table, summarize
from bench.observe import LiveObserver
from bench.schema_doc import reference
from cluster.inproc import run_inproc
from cluster.spec import ClusterSpec
from engine.records import WorkloadRequest

ROOT = Path(__file__).resolve().parents[2]
TINY = {
    "name": "tiny",
    "runtime": "inproc",
    "cluster": {
        "decode": {"count": 1, "engine": {"num_gpu_blocks": 100, "async_scheduling": True, "max_model_len": 1024}},
        "links": {"kv": {"delay_ms": 1.0, "outages": [[0.05, 0.08]]}},
    },
    "workload": {"num_requests": 8, "prompt_len": 64, "output_len": 96, "arrival": {"kind": "all_at_once"}},
    "variants": [
        {"name": "prefix", "set": {"cluster.decode.engine.preemption_guard": "prefix"}},
        {"name": "fixed", "set": {"cluster.decode.engine.preemption_guard": "fixed"}},
    ],
    "repeats": 2,
    "seed": 7,
    "thresholds": ["num_zero_progress_preemptions[fixed] == 0", "failed[fixed] == 0"],
    "report": {"baseline": "fixed"},
}
# Keys that legitimately differ between a run and its re-run.
VOLATILE = {"provenance", "extra", "step_trace"}


def write(tmp_path: Path, data: dict) -> Path:
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


def test_a_result_alone_reruns_its_scenario_exactly(tmp_path, capsys):
    path = write(tmp_path, TINY)
    out = tmp_path / "first"
    assert main(["run", str(path), "--out", str(out), "--set", "cluster.links.kv.jitter_ms=0.3"]) == 0
    first = json.loads((out / "tiny__prefix__r1.json").read_text())
    prov = first["provenance"]
    assert prov["tool"] == "disagg-sim" and prov["version"] and set(prov["git"]) == {"commit", "dirty"}
    assert {"ray", "grpcio", "pydantic", "numpy"} <= set(prov["libraries"])
    assert {"hostname", "system", "arch", "cpus"} <= set(prov["machine"]) and prov["python"]
    config = first["scenario_config"]
    assert config["overrides"] == {"cluster.links.kv.jitter_ms": 0.3}
    assert config["variant_set"] == {"cluster.decode.engine.preemption_guard": "prefix"}
    assert config["resolved_cluster"]["decode"]["engine"]["preemption_guard"] == "prefix"
    assert config["resolved_cluster"]["links"]["kv"]["jitter_ms"] == 0.3
    assert first["seed"] == 8 and first["repeat"] == 1
    # The scenario file is gone: the result alone is enough. It re-runs that run
    # alone (its variant, its repeat and so its seed); --only re-runs its scenario's.
    path.unlink()
    capsys.readouterr()
    again, whole = tmp_path / "again", tmp_path / "whole"
    assert main(["run", str(out / "tiny__prefix__r1.json"), "--out", str(again)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(f"re-running prefix r1 from {out / 'tiny__prefix__r1.json'} (--only or --repeats: ")
    assert "tiny: 1 variant(s) × 1 repeat(s) on inproc" in printed
    assert sorted(p.name for p in again.glob("*__r*")) == ["tiny__prefix__r1.json", "tiny__prefix__r1.steps.jsonl"]
    only = ["--only", "prefix", "--only", "fixed"]
    assert main(["run", str(out / "tiny__prefix__r1.json"), *only, "--out", str(whole)]) == 0
    assert len(list(whole.glob("*__r*.json"))) == 4
    for f in sorted(out.glob("*__r*.json")):
        for rerun in (again, whole) if f.name == "tiny__prefix__r1.json" else (whole,):
            a = json.loads(f.read_text())
            b = json.loads((rerun / f.name).read_text())
            assert {k: v for k, v in a.items() if k not in VOLATILE} == {
                k: v for k, v in b.items() if k not in VOLATILE
            }
            assert (out / a["step_trace"]).read_text() == (rerun / b["step_trace"]).read_text()
    edited = tmp_path / "edited__prefix__r1.json"
    edited.write_text(json.dumps({**first, "repeat": 5}))
    assert main(["run", str(edited), "--out", str(tmp_path / "never")]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {edited}: repeat 5 is not one of its scenario's 2; allowed: 0 to 1\n"


def test_fresh_directory_per_run_and_report(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    path = write(tmp_path, TINY)
    assert main(["run", str(path), "--only", "fixed"]) == 0
    assert main(["run", str(path), "--only", "fixed"]) == 0
    dirs = sorted((tmp_path / "results").iterdir())
    assert len(dirs) == 2 and all(d.name.startswith("tiny-") for d in dirs)
    d = dirs[0]
    plots = sorted(p.name for p in (d / "plots").glob("*.png"))
    assert plots == [
        "deferred_frees.png",
        "e2el_cdf.png",
        "kv_usage.png",
        "preemptions.png",
        "running_waiting.png",
        "ttft_cdf.png",
    ]
    html = (d / "report.html").read_text()
    assert "all 2 threshold(s) passed (exit 0)" in html  # only thresholds on the variants run
    assert '"title":{"text":"KV cache usage' in html and "num_zero_progress_preemptions" in html
    # Two result sets side by side, with labels, and a summary for CI.
    summary = tmp_path / "summary.json"
    code = main(
        [
            "compare",
            f"base={dirs[0]}",
            f"cand={dirs[1]}",
            "--threshold",
            "num_preemptions[cand/fixed] <= num_preemptions[base/fixed]",
            "--json",
            str(summary),
        ]
    )
    assert code == 0
    doc = json.loads(summary.read_text())
    assert doc["baseline_of"] == {"cand/fixed": "base/fixed"}
    assert doc["variants"]["cand/fixed"]["completed"] == {"mean": 8.0, "std": 0.0, "n": 2, "ratio": 1.0}
    assert doc["thresholds"][0]["passed"] is True and doc["exit_code"] == 0


def test_the_table_never_cuts_metric_names():
    results = []
    for v in ("a-long-variant-name", "another-long-variant-name", "third"):
        results.append(
            {
                "variant": v,
                "repeat": 0,
                "num_zero_progress_preemptions": 123456.789,
                "max_num_waiting_for_remote_kvs": 9.5,
            }
        )
    base, metrics, table = summarize(
        results, metrics=["num_zero_progress_preemptions", "max_num_waiting_for_remote_kvs"]
    )
    buf = io.StringIO()
    Console(file=buf, width=60).print(format_compare_table(base, metrics, table))
    text = buf.getvalue()
    assert "num_zero_progress_preemptions" in text and "max_num_waiting_for_remote_kvs" in text
    assert "…" not in text


def test_reference_in_docs_is_generated_from_the_code():
    doc = (ROOT / "docs" / "scenario-reference.md").read_text()
    assert doc == reference(), "regenerate: .venv/bin/disagg-sim schema > docs/scenario-reference.md"


def test_schema_and_version_commands(capsys):
    try:
        main(["--version"])
    except SystemExit as exc:
        assert exc.code == 0
    assert capsys.readouterr().out.startswith("disagg-sim ")
    assert main(["schema", "--metrics", "cascade-inproc"]) == 0
    names = capsys.readouterr().out.split()
    assert "num_zero_progress_preemptions" in names and "p99_ttft_ms" in names and "kv_pulls_failed_rejected" in names


def _workload(n=6):
    return [WorkloadRequest(f"r{i}", 0.0, 48, 24) for i in range(n)]


def test_inproc_step_records_carry_their_modelled_duration():
    # The API server off: six requests at once reach the engine together.
    spec = ClusterSpec.model_validate(
        {"prefill": {"count": 0}, "decode": {"engine": {"num_gpu_blocks": 64}}, "front_end": {"preset": "off"}}
    )
    run = run_inproc(spec, _workload())
    scheduled = [s for s in run.steps if s.num_scheduled_tokens > 0]
    assert scheduled and all(s.duration > 0 for s in scheduled)
    cost = spec.cost()
    first = scheduled[0]  # the first step: six 48-token prefills, no context before
    assert first.num_prefill_tokens == 6 * 48
    assert (
        first.duration
        == cost.base_ms / 1000 + (cost.prefill_ms_per_token * 288 + cost.context_ms_per_ktoken * 288 / 1000) / 1000
    )


def test_transport_retries_are_counted_once_per_decode_node():
    spec = ClusterSpec.model_validate(
        {
            "prefill": {"count": 1},
            "decode": {"count": 2, "engine": {"num_gpu_blocks": 256}},
            "links": {"kv": {"loss": 0.4, "delay_ms": 1.0}},
            "kv_pull_timeout_s": 0.05,
            "kv_pull_backoff_initial_s": 0.01,
            "kv_pull_backoff_max_s": 0.02,
        }
    )
    run = run_inproc(spec, _workload(20), seed=3)
    per_node = [run.node_counters[n].get("transport_retries", 0) for n in ("decode-0", "decode-1")]
    assert sum(per_node) > 0
    assert run.counters()["transport_retries"] == sum(per_node) == run.extra["kv_pulls"]["retries"]
    # Each node's retries are its own attempts beyond one per pull.
    for n in ("decode-0", "decode-1"):
        c = run.node_counters[n]
        assert c["transport_retries"] == c["kv_pull_attempts"] - c["kv_pulls_started"]


def test_metrics_series_carry_the_variant_and_one_server_serves_every_run():
    obs = LiveObserver(["decode-0"], metrics_port=0, labels=("variant",))
    try:
        url = obs.urls["decode-0"]
        for variant in ("prefix", "fixed"):
            obs.begin_run(variant=variant)
            obs.sync_counters({"decode-0": {"num_preemptions": 3}})
            assert obs.urls["decode-0"] == url  # the same endpoint
        text = obs.nodes["decode-0"].exporter.render().decode()
        assert 'vllm:num_preemptions_total{engine="decode-0",model_name="disagg-sim",variant="prefix"} 3.0' in text
        assert 'vllm:num_preemptions_total{engine="decode-0",model_name="disagg-sim",variant="fixed"} 3.0' in text
        assert 'variant=""' not in text
    finally:
        obs.close()


def test_time_scale_in_process_is_named_not_ignored_silently(tmp_path, capsys):
    path = write(tmp_path, TINY)
    out_dir = str(tmp_path / "o")
    code = main(
        ["run", str(path), "--out", out_dir, "--only", "fixed", "--repeats", "1", "--set", "cluster.time_scale=0.5"]
    )
    assert code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert (
        "note: cluster.time_scale=0.5 is a Ray setting (wall seconds slept per modelled second); in-process runs "
        "use the virtual clock and ignore it (use --pace to watch a run in real time)"
    ) in out
