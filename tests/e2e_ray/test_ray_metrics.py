"""Live observation on the Ray runtime: every node actor serves its own
Prometheus /metrics on 127.0.0.1 while the run goes on, and the driver logs
vLLM-style stats lines from the nodes during the run.

One small cascade (pre-fix guard, so zero-progress preemptions happen) is run
with metrics on ephemeral ports; a thread scrapes every endpoint while the
run is in progress, and `while_serving` scrapes them once more after every
node has reported (the endpoints are held until it returns)."""

import logging
import socket
import threading
import urllib.request
from urllib.parse import urlsplit

import pytest

from bench.observe import RayLiveObserver
from cluster.ray.runtime import run_ray

from .conftest import make_spec, workload

pytestmark = [pytest.mark.ray, pytest.mark.timeout(120)]

N = 30
DECODE = '{engine="decode-0",model_name="disagg-sim"}'
PREFILL = '{engine="prefill-0",model_name="disagg-sim"}'


def scrape(url: str) -> str:
    return urllib.request.urlopen(url, timeout=5).read().decode()


def value(body: str, series: str) -> float:
    """The sample `series` (name with labels) in a text exposition."""
    lines = [line for line in body.splitlines() if line.startswith(series + " ")]
    assert len(lines) == 1, f"{series} not exposed once in:\n{body}"
    return float(lines[0].rsplit(" ", 1)[1])


class LiveScraper(threading.Thread):
    """Scrapes every endpoint in a loop until stopped (the run is in progress meanwhile)."""

    def __init__(self, urls: dict[str, str]) -> None:
        super().__init__(daemon=True)
        self.urls = urls
        self.bodies: dict[str, list[str]] = {n: [] for n in urls}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.05):
            for name, url in self.urls.items():
                self.bodies[name].append(scrape(url))


class LineCatcher(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture(scope="module")
def observed(ray_cluster):
    spec = make_spec(
        decode={
            "count": 1,
            "engine": {
                "num_gpu_blocks": 200,
                "max_num_seqs": 128,
                "async_scheduling": True,
                "preemption_guard": "prefix",
            },
        },
        links={"kv": {"delay_ms": 1.0}},
        time_scale=0.05,
    )
    observer = RayLiveObserver(metrics_port=0, log_interval=0.5)
    seen: dict = {"urls": None, "held": None, "scraper": None}

    def on_metrics_urls(urls):
        seen["urls"] = urls
        seen["scraper"] = LiveScraper(urls)
        seen["scraper"].start()

    def while_serving(urls):
        seen["scraper"].stop.set()
        seen["scraper"].join(10)
        seen["held"] = {n: scrape(u) for n, u in urls.items()}

    catcher = LineCatcher()
    stats = logging.getLogger("disagg_sim.stats")
    stats.addHandler(catcher)
    old_level = stats.level
    stats.setLevel(logging.DEBUG)
    try:
        result = run_ray(
            spec,
            workload(N, 128, 192),
            seed=1,
            handle=ray_cluster,
            timeout_s=90,
            observer_factory=observer.factory,
            on_metrics_urls=on_metrics_urls,
            while_serving=while_serving,
        )
    finally:
        stats.removeHandler(catcher)
        stats.setLevel(old_level)
        if seen["scraper"] is not None:
            seen["scraper"].stop.set()
    return result, seen, catcher.lines


def test_every_node_serves_its_own_endpoint_on_loopback_and_it_is_closed_after_the_run(observed):
    result, seen, _ = observed
    assert result.invariant_errors == []
    urls = result.extra["metrics_urls"]
    assert urls == seen["urls"] and set(urls) == {"prefill-0", "decode-0"}
    ports = set()
    for url in urls.values():
        parts = urlsplit(url)
        assert (parts.scheme, parts.hostname, parts.path) == ("http", "127.0.0.1", "/metrics")
        ports.add(parts.port)
    assert len(ports) == 2  # one server per node
    for port in ports:  # run_ray returned: the actors closed their servers and are gone
        with socket.socket() as sock:
            sock.settimeout(2)
            assert sock.connect_ex(("127.0.0.1", port)) != 0, f"port {port} still open after the run"
    assert result.extra["observer_errors"] == []


def test_scrapes_during_the_run_see_the_decode_node_working(observed):
    _, seen, _ = observed
    live = seen["scraper"].bodies
    assert live["decode-0"] and live["prefill-0"]
    running = [value(body, "vllm:num_requests_running" + DECODE) for body in live["decode-0"]]
    assert max(running) > 0  # gauges moved while requests were decoding


def test_held_endpoints_expose_vllm_names_and_the_final_counters(observed):
    result, seen, _ = observed
    decode, prefill = seen["held"]["decode-0"], seen["held"]["prefill-0"]
    counters = result.node_counters["decode-0"]
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:num_preemptions_total",
        "vllm:time_to_first_token_seconds_count",
        "vllm:inter_token_latency_seconds_count",
        "vllm:e2e_request_latency_seconds_count",
        "vllm:request_queue_time_seconds_count",
        "disagg_sim:num_allocate_slots_calls_total",
    ):
        value(decode, name + DECODE)
        value(prefill, name + PREFILL)
    assert value(decode, "vllm:num_preemptions_total" + DECODE) == counters["num_preemptions"] > 0
    zero = value(decode, "disagg_sim:num_zero_progress_preemptions_total" + DECODE)
    assert zero == counters["num_zero_progress_preemptions"] > 0
    assert value(decode, "disagg_sim:num_allocate_slots_calls_total" + DECODE) == counters["num_allocate_slots_calls"]
    # Every request was decoded on decode-0: its latencies are there, none on the prefill node.
    for hist in ("time_to_first_token_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds"):
        assert value(decode, f"vllm:{hist}_count" + DECODE) == N
        assert value(prefill, f"vllm:{hist}_count" + PREFILL) == 0
    assert value(decode, "vllm:inter_token_latency_seconds_count" + DECODE) == N * (192 - 1)
    # The run is over: the gauges show an idle node, not its last step.
    assert value(decode, "vllm:num_requests_running" + DECODE) == 0
    assert value(decode, "vllm:kv_cache_usage_perc" + DECODE) == 0
    assert (
        value(prefill, "vllm:num_preemptions_total" + PREFILL) == result.node_counters["prefill-0"]["num_preemptions"]
    )


def test_stats_lines_in_vllm_style_are_logged_by_the_driver_during_the_run(observed):
    result, _, logged = observed
    lines = result.extra["stats_lines"]
    assert [line for _, line in lines] == logged
    decode = [line for line in logged if line.startswith("[decode-0] Engine 001: ")]
    assert decode and any(line.startswith("[prefill-0] Engine 000: ") for line in logged)
    assert all(
        "Avg prompt throughput" in line
        and "Running: " in line
        and "Waiting: " in line
        and "GPU KV cache usage: " in line
        for line in decode
    )
    assert any("Preemptions: " in line for line in decode)
    last_finish = max(r.finish_time for r in result.requests)
    assert min(t for t, _ in lines) < last_finish  # relayed live, not only at the end


def test_the_runner_side_observer_announces_urls_and_holds_inside_the_run():
    announced: list[str] = []
    observer = RayLiveObserver(metrics_port=9100, log_interval=None, hold_s=0.0, announce=announced.append)
    kwargs = observer.run_ray_kwargs()
    assert set(kwargs) == {"observer_factory", "on_metrics_urls", "while_serving"}
    assert kwargs["observer_factory"].keywords["metrics_port"] == 9100
    kwargs["on_metrics_urls"]({"decode-0": "http://127.0.0.1:9101/metrics"})
    kwargs["while_serving"]({"decode-0": "http://127.0.0.1:9101/metrics"})  # hold 0: returns at once
    assert announced == ["metrics: decode-0 http://127.0.0.1:9101/metrics"]
    assert observer.urls == {"decode-0": "http://127.0.0.1:9101/metrics"}
    with pytest.raises(ValueError, match="metrics_port=70000 is invalid"):
        RayLiveObserver(metrics_port=70000)
    with pytest.raises(ValueError, match="log_interval=0 is invalid"):
        RayLiveObserver(log_interval=0)
