"""Live observation during an in-process run: a scraped /metrics per node and
vLLM-style log lines."""

import urllib.request

from bench.observe import LiveObserver
from cluster.inproc import InProcCluster
from cluster.spec import ClusterSpec
from engine.records import WorkloadRequest


def test_scraped_metrics_and_log_lines_from_a_cascade_run():
    spec = ClusterSpec.model_validate(
        {
            "prefill": {"count": 1},
            "decode": {
                "count": 1,
                "engine": {"num_gpu_blocks": 200, "async_scheduling": True, "preemption_guard": "prefix"},
            },
        }
    )
    observer = LiveObserver(["prefill-0", "decode-0"], metrics_port=0, log_interval=1.0)
    try:
        cluster = InProcCluster(spec, seed=0, observer=observer)
        cluster.submit([WorkloadRequest(f"r{i}", 0.0, 128, 128) for i in range(30)])
        result = cluster.run()
        observer.sync_counters(result.node_counters)
        body = urllib.request.urlopen(observer.urls["decode-0"], timeout=5).read().decode()
    finally:
        observer.close()
    zero = result.node_counters["decode-0"]["num_zero_progress_preemptions"]
    assert zero > 0
    assert 'vllm:num_preemptions_total{engine="decode-0",model_name="disagg-sim"}' in body
    line = next(ln for ln in body.splitlines() if ln.startswith("disagg_sim:num_zero_progress_preemptions_total{"))
    assert float(line.split()[-1]) == zero
    assert 'vllm:time_to_first_token_seconds_count{engine="decode-0",model_name="disagg-sim"} 30.0' in body
    assert any("Running:" in ln and "GPU KV cache usage" in ln for ln in observer.log_lines)
