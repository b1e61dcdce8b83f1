"""Live observation on the Ray runtime: the driver serves one Prometheus
/metrics per node name on 127.0.0.1 for a whole `run`, fed with the node
actors' expositions while each run goes on, and logs vLLM-style stats lines
from the nodes during the run.

One small cascade (pre-fix guard, so zero-progress preemptions happen) is run
with metrics on ephemeral ports; a thread scrapes every endpoint while the
run is in progress, and once more after `run_ray` returned (its actors are
gone, the endpoints are not). A second, short run of another variant lands on
the same endpoints under its own label."""

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
DECODE = '{engine="decode-0",model_name="disagg-sim",variant="prefix"}'
PREFILL = '{engine="prefill-0",model_name="disagg-sim",variant="prefix"}'


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
    # Short: the prefill node works for well under a second of the run.
    observer = RayLiveObserver(["prefill-0", "decode-0"], metrics_port=0, log_interval=0.1)
    urls = dict(observer.urls)
    scraper = LiveScraper(urls)
    catcher = LineCatcher()
    stats = logging.getLogger("disagg_sim.stats")
    stats.addHandler(catcher)
    old_level = stats.level
    stats.setLevel(logging.DEBUG)
    try:
        observer.begin_run("prefix")
        scraper.start()
        result = run_ray(
            spec, workload(N, 128, 192), seed=1, handle=ray_cluster, timeout_s=90, **observer.run_ray_kwargs()
        )
        scraper.stop.set()
        scraper.join(10)
        held = {n: scrape(u) for n, u in urls.items()}  # the run's actors are gone
        observer.begin_run("fixed")
        second = run_ray(
            spec, workload(4, 32, 8), seed=2, handle=ray_cluster, timeout_s=60, **observer.run_ray_kwargs()
        )
        after_second = {n: scrape(u) for n, u in urls.items()}
    finally:
        stats.removeHandler(catcher)
        stats.setLevel(old_level)
        scraper.stop.set()
        observer.close()
    seen = {"urls": urls, "scraper": scraper, "held": held, "second": (second, after_second)}
    return result, seen, catcher.lines


def test_one_endpoint_per_node_name_on_loopback_outlives_the_runs_and_closes_with_the_observer(observed):
    result, seen, _ = observed
    assert result.invariant_errors == []
    urls = seen["urls"]
    assert set(urls) == {"prefill-0", "decode-0"}
    ports = set()
    for url in urls.values():
        parts = urlsplit(url)
        assert (parts.scheme, parts.hostname, parts.path) == ("http", "127.0.0.1", "/metrics")
        ports.add(parts.port)
    assert len(ports) == 2  # one server per node name
    for port in ports:  # the observer closed: so did its servers
        with socket.socket() as sock:
            sock.settimeout(2)
            assert sock.connect_ex(("127.0.0.1", port)) != 0, f"port {port} still open after close"
    assert result.extra["observer_errors"] == []


def test_a_later_run_of_another_variant_lands_on_the_same_endpoints_under_its_label(observed):
    _, seen, _ = observed
    second, bodies = seen["second"]
    assert second.invariant_errors == []
    fixed = DECODE.replace('variant="prefix"', 'variant="fixed"')
    assert value(bodies["decode-0"], "vllm:e2e_request_latency_seconds_count" + fixed) == 4
    assert value(bodies["decode-0"], "vllm:e2e_request_latency_seconds_count" + DECODE) == N  # still there
    for body in bodies.values():  # one family per name, as the text format requires
        types = [line for line in body.splitlines() if line.startswith("# TYPE ")]
        assert len(types) == len(set(types))


def test_scrapes_during_the_run_see_the_decode_node_working(observed):
    _, seen, _ = observed
    # Empty until the driver relayed the run's first exposition.
    live = {name: [body for body in bodies if body] for name, bodies in seen["scraper"].bodies.items()}
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
    result, _, caught = observed
    lines = result.extra["stats_lines"]
    # The handler also caught the second ("fixed") run's lines, if it lasted
    # long enough to log any: this result is the first run's.
    logged = [line for line in caught if line.startswith("[prefix/")]
    assert [line for _, line in lines] == logged
    assert all(line.startswith(("[prefix/", "[fixed/")) for line in caught)
    decode = [line for line in logged if line.startswith("[prefix/decode-0] Engine 001: ")]
    assert decode and any(line.startswith("[prefix/prefill-0] Engine 000: ") for line in logged)
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


def _two_free_ports() -> int:
    """A port p with p and p + 1 both free just now (the observer binds
    base + index; an ephemeral port's neighbour may belong to a Ray or gRPC
    process of this session)."""
    for _ in range(50):
        with socket.socket() as first, socket.socket() as second:
            first.bind(("127.0.0.1", 0))
            base = first.getsockname()[1]
            try:
                second.bind(("127.0.0.1", base + 1))
            except (OSError, OverflowError):  # taken, or past 65535
                continue
            return base
    raise RuntimeError("no two adjacent free ports on 127.0.0.1")


def test_the_runner_side_observer_binds_port_plus_index_and_refuses_bad_settings():
    base = _two_free_ports()
    observer = RayLiveObserver(["prefill-0", "decode-0"], metrics_port=base, log_interval=None)
    try:
        assert observer.urls == {
            "prefill-0": f"http://127.0.0.1:{base}/metrics",
            "decode-0": f"http://127.0.0.1:{base + 1}/metrics",
        }
        assert set(observer.run_ray_kwargs()) == {"observer_factory", "on_exposition"}
        observer.begin_run("fixed")
        node = observer.factory("decode-0", 1)  # what an actor builds
        node.sync_counters({"num_preemptions": 3})
        observer.on_exposition("decode-0", node.exposition())
        body = scrape(observer.urls["decode-0"])
        assert 'vllm:num_preemptions_total{engine="decode-0",model_name="disagg-sim",variant="fixed"} 3.0' in body
    finally:
        observer.close()
    with pytest.raises(ValueError, match="metrics_port=70000 is invalid"):
        RayLiveObserver(["decode-0"], metrics_port=70000)
    with pytest.raises(ValueError, match="log_interval=0 is invalid"):
        RayLiveObserver(["decode-0"], log_interval=0)
