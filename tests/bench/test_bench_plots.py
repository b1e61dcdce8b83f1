"""Plots land as real PNGs."""

import matplotlib.image as mpimg

from bench.plots import latencies_ms_from_results, plot_latency_cdfs, plot_latency_cdfs_ms, plot_step_timeseries
from engine.records import RequestRecord, StepRecord

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def steps(node, n, pre_every):
    return [
        StepRecord(
            node=node,
            time=0.05 * i,
            step_index=i,
            batch_size=4,
            num_scheduled_tokens=4,
            num_prefill_tokens=0,
            num_decode_tokens=4,
            num_running=4 - i % 3,
            num_waiting=i % 5,
            num_waiting_for_remote_kvs=0,
            num_free_blocks=(i * 7) % 16,
            num_deferred_blocks=0,
            num_total_blocks=16,
            batches_in_flight=2,
            num_preemptions_total=i // pre_every,
            num_zero_progress_preemptions_total=i // (2 * pre_every),
        )
        for i in range(n)
    ]


def records(scale):
    return [
        RequestRecord(
            f"r{i}",
            0.1 * i,
            16,
            4,
            token_times=[0.1 * i + scale * (1 + i % 4), 0.1 * i + 2 * scale],
            finish_time=0.1 * i + 2 * scale,
            finish_reason="length",
        )
        for i in range(30)
    ]


def assert_png(path, min_bytes=5000):
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, path
    assert len(data) > min_bytes, (path, len(data))
    img = mpimg.imread(path)
    assert img.shape[0] > 100 and img.shape[1] > 100


def test_step_timeseries_pngs(tmp_path):
    paths = plot_step_timeseries(
        {"fixed": steps("decode-0", 60, 10) + steps("prefill-0", 40, 20), "prefix": steps("decode-0", 60, 3)}, tmp_path
    )
    assert [p.name for p in paths] == ["kv_usage.png", "running_waiting.png", "preemptions.png", "deferred_frees.png"]
    for p in paths:
        assert_png(p)


def test_latency_cdf_pngs(tmp_path):
    paths = plot_latency_cdfs({"fixed": records(0.2), "prefix": records(0.5)}, tmp_path)
    assert [p.name for p in paths] == ["ttft_cdf.png", "e2el_cdf.png"]
    for p in paths:
        assert_png(p)


def test_cdfs_from_result_dicts(tmp_path):
    results = [
        {
            "variant": "fixed",
            "requests": [
                {"success": True, "ttft_ms": 10.0, "e2el_ms": 30.0},
                {"success": False, "ttft_ms": None, "e2el_ms": None},
            ],
        },
        {"variant": "fixed", "requests": [{"success": True, "ttft_ms": 12.0, "e2el_ms": 31.0}]},
    ]
    ttft, e2el = latencies_ms_from_results(results)
    assert ttft == {"fixed": [10.0, 12.0]} and e2el == {"fixed": [30.0, 31.0]}
    for p in plot_latency_cdfs_ms(ttft, e2el, tmp_path):
        assert_png(p, min_bytes=3000)
