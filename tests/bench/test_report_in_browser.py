"""From the CLI to a real browser: `run` writes report.html, headless
Chromium renders it with no network, and the page logs nothing to its
console (no error, no warning), shows every figure it holds as a drawn
plotly chart, and its tables are HTML tables.

`make test` installs Debian's chromium (the Makefile's `browser` target);
the test skips, saying why, only where no browser could be installed."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from tests.bench.cli_helpers import cli

BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def _browser() -> str:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    pytest.skip(
        "no headless browser (chromium): `make test` installs Debian's chromium with apt-get when it runs as "
        "root; elsewhere install it to run this test"
    )


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "out"
    done = cli("run", "cascade-inproc", "--repeats", "1", "--out", str(out))
    assert done.returncode == 0, done.stderr
    return out


def _render(browser: str, page) -> tuple[str, list[str]]:
    done = subprocess.run(
        [
            browser, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
            "--virtual-time-budget=10000", "--dump-dom", page.as_uri(),
        ],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
    return done.stdout, console


def test_report_renders_without_console_messages_and_with_every_plot(report):
    browser = _browser()
    page = report / "report.html"
    source = page.read_text()
    assert "<pre" not in source  # tables are HTML, not box-drawing text
    assert "https://" not in re.sub(r"<script>.*?</script>", "", source, flags=re.S)  # nothing fetched
    figures = re.findall(r'id="(figure-\d+)"', source)
    dom, console = _render(browser, page)
    assert console == []
    for fig in figures:
        div = dom[dom.index(f'id="{fig}"') :]
        assert "js-plotly-plot" in div[:400] and "main-svg" in div[:20000], fig
    # What is plotted: the four step figures, the integrity counters
    # (fence-off's corruptions, the cascade's zero-progress preemptions), both CDFs.
    expected = (
        "KV cache usage",
        "Running (solid) and waiting",
        "Cumulative preemptions",
        "Deferred-free blocks",
        "Integrity: KV corruptions",
        "Time to first token",
        "End-to-end latency",
    )
    assert len(figures) == len(expected)
    for title in expected:
        assert f'"title":{{"text":"{title}' in source, title
    results = [json.loads(p.read_text()) for p in report.glob("*__r0.json")]
    assert sum(r["kv_corruptions_detected"] > 0 for r in results) == 1


def test_report_tables_hold_every_variant_and_threshold(report):
    source = (report / "report.html").read_text()
    table = source[source.index('<table class="results">') :]
    head = table[: table.index("</thead>")]
    for variant in ("prefix", "fixed", "fence-off"):
        assert f"<th>{variant}" in head
    assert '<td class="metric">num_zero_progress_preemptions</td>' in table
    assert source.count('<td class="pass">PASS</td>') == 6


def test_compare_page_shows_two_result_sets_side_by_side(tmp_path):
    from tests.bench.cli_helpers import tiny_results

    browser = _browser()
    page = tmp_path / "compare.html"
    sets = [f"base={tiny_results(tmp_path, name='a')}", f"cand={tiny_results(tmp_path, name='b')}"]
    metrics = ("num_preemptions", "num_zero_progress_preemptions", "mean_ttft_ms")
    args = [a for m in metrics for a in ("--metric", m)]
    done = cli("compare", *sets, *args, "--threshold", "num_preemptions[cand/prefix] > 1", "--html", str(page))
    assert done.returncode == 0, done.stderr
    source = page.read_text()
    assert "<pre" not in source and '<td class="pass">PASS</td>' in source
    for variant in ("base/fixed", "base/prefix", "cand/fixed", "cand/prefix"):
        assert f"<th>{variant}" in source
    dom, console = _render(browser, page)
    assert console == []
    figures = re.findall(r'id="(figure-\d+)"', source)
    assert len(figures) == len(metrics)
    for fig, metric in zip(figures, metrics, strict=True):
        div = dom[dom.index(f'id="{fig}"') :]
        assert "main-svg" in div[:20000], fig
        assert f'"title":{{"text":"{metric}"' in source
