"""docs/metrics.md is generated from the code and kept equal to it; every
metric the code produces has a definition; `schema --metrics` lists the
derived ones too."""

from __future__ import annotations

import pytest

from bench.metric_glossary import describe, documented_names, render_markdown
from tests.bench.cli_helpers import ROOT, cli


def test_metrics_doc_equals_the_code():
    done = cli("schema", "--glossary")
    assert done.returncode == 0, done.stderr
    doc = (ROOT / "docs" / "metrics.md").read_text()
    assert done.stdout == doc, "regenerate: .venv/bin/disagg-sim schema --glossary > docs/metrics.md"


def test_every_metric_of_every_builtin_scenario_is_defined():
    names = documented_names()
    assert {"p99_ttft_ms", "num_zero_progress_preemptions", "prefix_cache_hit_rate_pct", "v0_num_steps"} <= names
    assert [n for n in sorted(names) if describe(n) is None] == []


def test_an_undefined_metric_fails_the_rendering():
    with pytest.raises(KeyError, match="metrics without a glossary entry .*: brand_new_counter"):
        render_markdown(["p99_ttft_ms", "brand_new_counter"])


def test_patterns_cover_other_percentiles_and_failure_reasons():
    assert describe("p95_ttft_ms").vllm == "p95_ttft_ms"
    assert describe("p99.9_e2el_ms").unit == "ms"
    assert describe("kv_pulls_failed_checksum_mismatch").definition.endswith("`checksum_mismatch`.")


def test_schema_metrics_lists_the_derived_hit_rate():
    done = cli("schema", "--metrics", "cascade-inproc")
    assert done.returncode == 0
    assert "prefix_cache_hit_rate_pct" in done.stdout.split()
