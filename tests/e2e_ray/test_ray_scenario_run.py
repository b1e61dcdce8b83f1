"""`disagg-sim run` on Ray, end to end through the runner: two variants of a
small scenario on the session's loopback cluster, with live metrics.

- One /metrics endpoint per node name for the whole run: a thread scrapes
  the driver's endpoints while both runs go on and sees each variant's
  series land on the same URL.
- The table, thresholds and results are in model time (wall / time_scale);
  the results JSON says so and keeps the wall clock's figures.
"""

from __future__ import annotations

import threading
import urllib.request

import pytest
import yaml
from rich.console import Console

from bench.runner import run_scenario
from bench.scenario import load_scenario

pytestmark = [pytest.mark.ray, pytest.mark.timeout(180)]

TIME_SCALE = 0.5
SCENARIO = {
    "name": "tiny-ray",
    "runtime": "ray",
    "cluster": {
        "decode": {"count": 1, "engine": {"num_gpu_blocks": 100, "async_scheduling": True, "max_model_len": 1024}},
        "links": {"kv": {"delay_ms": 1.0}},
        "time_scale": TIME_SCALE,
    },
    "workload": {"num_requests": 6, "prompt_len": 64, "output_len": 24, "arrival": {"kind": "all_at_once"}},
    "variants": [
        {"name": "prefix", "set": {"cluster.decode.engine.preemption_guard": "prefix"}},
        {"name": "fixed", "set": {"cluster.decode.engine.preemption_guard": "fixed"}},
    ],
    "repeats": 1,
    "seed": 3,
    "thresholds": ["failed[fixed] == 0", "completed[prefix] == 6"],
}


class Scraper(threading.Thread):
    def __init__(self, console_text) -> None:
        super().__init__(daemon=True)
        self.console_text = console_text
        self.bodies: list[tuple[str, str]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        urls: list[str] = []
        while not self.stop.wait(0.1):
            if not urls:  # printed once the endpoints are bound, before the first run
                text = self.console_text()
                urls = [w for w in text.split() if w.startswith("http://127.0.0.1:") and w.endswith("/metrics")]
                continue
            for url in urls:
                try:
                    self.bodies.append((url, urllib.request.urlopen(url, timeout=5).read().decode()))
                except OSError:
                    return  # the run ended and closed its endpoints


@pytest.fixture(scope="module")
def outcome(ray_cluster, tmp_path_factory):
    path = tmp_path_factory.mktemp("s") / "tiny-ray.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    console = Console(record=True, width=200)
    scraper = Scraper(lambda: console.export_text(clear=False))
    scraper.start()
    try:
        result = run_scenario(
            load_scenario(path),
            out_dir=tmp_path_factory.mktemp("o"),
            console=console,
            metrics_port=0,
            ray_handle=ray_cluster,
        )
    finally:
        scraper.stop.set()
        scraper.join(10)
    return result, console.export_text(), scraper.bodies


def test_the_runs_pass_their_thresholds_without_invariant_errors(outcome):
    result, _, _ = outcome
    assert result.invariant_errors == []
    assert result.exit_code == 0


def test_results_are_in_model_time_and_keep_the_wall_clock_figures(outcome):
    result, text, _ = outcome
    assert "latencies and throughputs are model time (wall / time_scale)" in text
    for r in result.results:
        assert r["clock"] == "wall" and r["latency_clock"] == "model (wall / time_scale)"
        wall = r["wall_clock"]
        assert wall["time_scale"] == TIME_SCALE
        assert r["median_ttft_ms"] == pytest.approx(wall["median_ttft_ms"] / TIME_SCALE)
        assert r["output_throughput"] == pytest.approx(wall["output_throughput"] * TIME_SCALE)
        assert r["duration"] == pytest.approx(wall["duration"] / TIME_SCALE)


def test_one_endpoint_per_node_name_serves_both_variants(outcome):
    _, _, bodies = outcome
    decode = [(url, body) for url, body in bodies if 'engine="decode-0"' in body]
    assert len({url for url, _ in decode}) == 1  # the same URL across both runs
    seen = {
        variant
        for _, body in decode
        for variant in ("prefix", "fixed")
        if f'vllm:num_requests_running{{engine="decode-0",model_name="disagg-sim",variant="{variant}"}}' in body
    }
    assert seen == {"prefix", "fixed"}
