"""`num_gpu_blocks: auto` against published vLLM start-up logs.

Each point of tests/data/kv_sizing_published.yaml is re-sized with
RooflineCostModel.num_gpu_blocks and held to its regime's stated tolerance;
the docs table (docs/cost-model.md, "KV cache size and KV handoff bytes") is
this module's `table()` — print it with
`.venv/bin/python tests/unit/test_kv_sizing_published.py`.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import yaml

from engine.model_shape import get_gpu, get_model
from engine.roofline import GiB, RooflineCostModel

ROOT = Path(__file__).resolve().parents[2]
DATA = yaml.safe_load((ROOT / "tests/data/kv_sizing_published.yaml").read_text(encoding="utf-8"))
REGIMES: dict[str, dict] = DATA["regimes"]
POINTS: list[dict] = DATA["points"]
MODELLED = "v0.17-v0.20"  # the regime the formula's terms come from
DOCS = ROOT / "docs/cost-model.md"


@dataclass(frozen=True)
class Row:
    id: str
    regime: str
    published_blocks: int
    predicted_blocks: int
    block_GiB: float
    published_activation_GiB: float | None
    predicted_activation_GiB: float

    @property
    def error_pct(self) -> float:
        return 100.0 * (self.predicted_blocks - self.published_blocks) / self.published_blocks

    @property
    def delta_GiB(self) -> float:
        return (self.predicted_blocks - self.published_blocks) * self.block_GiB

    @property
    def published_GiB(self) -> float:
        return self.published_blocks * self.block_GiB


def cost_model(p: dict) -> RooflineCostModel:
    gpu = get_gpu(p["gpu"])
    if "gpu_memory_GiB" in p:  # the card's total as its log reports it
        gpu = replace(gpu, memory_GB=p["gpu_memory_GiB"] * GiB / 1e9)
    model = get_model(p["model_config"] if "model_config" in p else p["model"])
    return RooflineCostModel(name=p["id"], model=model, gpu=gpu, tp=p.get("tp", 1), pp=p.get("pp", 1))


def evaluate(p: dict) -> Row:
    m = cost_model(p)
    block_bytes = p["block_size"] * m.kv_bytes_per_token_per_gpu()
    pub = p["published"]
    if "tokens" in pub:
        published = pub["tokens"] // p["block_size"]
    elif "blocks" in pub:
        published = pub["blocks"]
    else:
        published = int(pub["kv_cache_GiB"] * GiB // block_bytes)
    # vLLM takes its CUDA-graph estimate from the budget since 0.21 only.
    cudagraph = {} if p["cudagraph_in_budget"] else {"cudagraph_GiB": 0.0}
    predicted = m.num_gpu_blocks(
        p["gpu_memory_utilization"], p["block_size"], p["max_num_batched_tokens"], p["max_num_seqs"], **cudagraph
    )
    act = m.profile_activation_bytes(p["max_num_batched_tokens"], p["max_num_seqs"]) / GiB
    return Row(p["id"], p["regime"], published, predicted, block_bytes / GiB, pub.get("activation_GiB"), act)


ROWS = {p["id"]: evaluate(p) for p in POINTS}


def table() -> str:
    """The docs table: every point, its published and predicted pool, the error."""
    lines = [
        "| point | vLLM | util | published blocks (GiB) | predicted blocks (GiB) | error "
        "| activation published / ours (GiB) |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in POINTS:
        r = ROWS[p["id"]]
        act = f"{r.published_activation_GiB:.2f} / " if r.published_activation_GiB is not None else "– / "
        kind = " derived" if "derived" in p["published"] else ""
        lines.append(
            f"| {r.id} | {p['vllm'].split(' ')[0]} | {p['gpu_memory_utilization']} "
            f"| {r.published_blocks:,} ({r.published_GiB:.2f}{kind}) "
            f"| {r.predicted_blocks:,} ({r.published_GiB + r.delta_GiB:.2f}) "
            f"| {r.error_pct:+.1f} % ({r.delta_GiB:+.2f} GiB) | {act}{r.predicted_activation_GiB:.2f} |"
        )
    return "\n".join(lines)


def test_points_state_their_settings_and_sources():
    assert len(POINTS) >= 8
    assert len({p["id"] for p in POINTS}) == len(POINTS)
    for p in POINTS:
        assert p["regime"] in REGIMES, p["id"]
        assert p["source"] and all(u.startswith("https://") for u in p["source"]), p["id"]
        assert p["quote"], p["id"]
        assert {"tokens", "blocks", "kv_cache_GiB"} & set(p["published"]), p["id"]
    for name, regime in REGIMES.items():
        assert regime["why"] and "tolerance_GiB" in regime, name


@pytest.mark.parametrize("point", POINTS, ids=[p["id"] for p in POINTS])
def test_each_point_within_its_regime_tolerance(point):
    r, tol = ROWS[point["id"]], REGIMES[point["regime"]]
    assert abs(r.delta_GiB) <= tol["tolerance_GiB"], (r, tol["why"])
    if "tolerance_pct" in tol:
        assert abs(r.error_pct) <= tol["tolerance_pct"], (r, tol["why"])


def test_modelled_regime_is_close_and_older_versions_reserved_more():
    modelled = [r for r in ROWS.values() if r.regime == MODELLED]
    assert len(modelled) >= 5
    assert statistics.median(abs(r.error_pct) for r in modelled) <= 0.5
    # Every older version held back more than today's profile does: we over-predict them.
    assert all(r.delta_GiB > 0 for r in ROWS.values() if r.regime != MODELLED)


def test_activation_peak_matches_the_published_torch_peak():
    for r in ROWS.values():
        if r.regime == MODELLED and r.published_activation_GiB is not None:
            assert abs(r.predicted_activation_GiB - r.published_activation_GiB) <= 0.4, r


def test_docs_table_is_current():
    assert table() in DOCS.read_text(encoding="utf-8"), "re-run this module as a script and paste its table"


if __name__ == "__main__":
    print(table())
