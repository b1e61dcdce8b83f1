"""The v1 differential harness: scenarios through vLLM 0.33.0 (one subprocess for
all of them) and through our engine, compared step by step.

Used by `run_v1.py` (the `make conformance` command) and by
`test_v1_oracle.py` (pytest, marker `oracle`).
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
for path in (HERE, REPO / "tools" / "oracle", REPO):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import launch  # noqa: E402  (tools/oracle/launch.py)
from pd_generate import generate_pd_suite  # noqa: E402
from pd_handwritten import all_pd_handwritten  # noqa: E402
from v1_compare import Mismatch, compare, dump_repro, shrink  # noqa: E402
from v1_generate import generate_suite  # noqa: E402
from v1_handwritten import Expectation, all_handwritten  # noqa: E402
from v1_scenario import validate  # noqa: E402

DRIVER = "v1_driver.py"
DEFAULT_OUT = REPO / "build" / "conformance" / "v1"
# vLLM's traces of a few scenarios, replayed against our engine by the default
# suite (test_v1_harness.py) so conformance is checked even where the oracle is absent.
GOLDEN_FILE = HERE / "golden" / "v1_traces.json.gz"
# Picked from seeds 0..199 for small traces: 137 / 127 / 103 have fenced frees and
# differ under the pre-fix guard (127, 103 cascade); 81 / 117 / 72 preempt with the fence off.
GOLDEN_RANDOM_SEEDS = (137, 127, 103, 81, 117, 72)


def oracle_missing_reason() -> str | None:
    return launch.oracle_missing_reason("v1")


def oracle_skip_message() -> str | None:
    """Why an `oracle` test must skip (None: the oracle can run)."""
    reason = oracle_missing_reason()
    if reason is None:
        return None
    return (
        f"vLLM 0.33.0 oracle not built at {launch.oracle_python('v1')} ({reason}); "
        "run `make oracles` or `make conformance`"
    )


@dataclass
class HarnessResult:
    scenarios: list[dict]
    mismatches: list[Mismatch] = field(default_factory=list)
    expectation_failures: list[str] = field(default_factory=list)  # "<side> <id>: <problem>"
    oracle_seconds: float = 0.0
    ours_seconds: float = 0.0
    vllm_version: str = ""
    repro_files: list[Path] = field(default_factory=list)
    oracle_traces: list[dict] = field(default_factory=list)

    @property
    def matched(self) -> int:
        return len(self.scenarios) - len(self.mismatches)

    def classes(self) -> dict[tuple, list[Mismatch]]:
        groups: dict[tuple, list[Mismatch]] = defaultdict(list)
        for m in self.mismatches:
            groups[m.signature].append(m)
        return dict(groups)

    def coverage(self) -> dict[str, int]:
        """How many scenarios exercised each behaviour, read from vLLM's traces."""
        return coverage(self.oracle_traces)

    def mismatch_report(self) -> str | None:
        """The summary and the first mismatch of each class (None: all matched)."""
        if not self.mismatches:
            return None
        details = "\n\n".join(g[0].describe() for g in self.classes().values())
        return f"{self.summary()}\n\n{details}"

    def summary(self) -> str:
        lines = [
            f"v1 conformance against vLLM {self.vllm_version}: {len(self.scenarios)} scenarios, "
            f"{self.matched} matched, {len(self.mismatches)} mismatched "
            f"(oracle {self.oracle_seconds:.1f} s, ours {self.ours_seconds:.1f} s)",
            "  coverage (scenarios): " + ", ".join(f"{k} {v}" for k, v in self.coverage().items()),
        ]
        pd = [sc for sc in self.scenarios if "kv" in sc["config"]]
        if pd:
            failed = {m.scenario_id for m in self.mismatches}
            lines.append(
                f"  P/D: {len(pd)} scenarios with a KV connector, {sum(s['id'] in failed for s in pd)} mismatched"
            )
            for (role, policy, guard), group in sorted(pd_groups(pd).items()):
                bad = sum(s["id"] in failed for s in group)
                lines.append(
                    f"    {role:<11} {policy:<9} {guard:<6} guard: {len(group):>4} scenarios, {bad} mismatched"
                )
            by_id = {s["id"]: s for s in pd}
            pd_traces = [t for t in self.oracle_traces if t["id"] in by_id]
            lines.append(
                "  P/D coverage (scenarios): " + ", ".join(f"{k} {v}" for k, v in pd_coverage(pd_traces, by_id).items())
            )
        for sig, group in sorted(self.classes().items(), key=lambda kv: -len(kv[1])):
            ids = ", ".join(m.scenario_id for m in group[:6]) + (" ..." if len(group) > 6 else "")
            lines.append(f"  class {sig[0]} {list(sig[1])}: {len(group)} scenario(s): {ids}")
        for text in self.expectation_failures:
            lines.append(f"  expectation failed: {text}")
        for path in self.repro_files:
            lines.append(f"  minimal reproduction: {path}")
        return "\n".join(lines)


def pd_groups(scenarios: list[dict]) -> dict[tuple[str, str, str], list[dict]]:
    """P/D scenarios by (role, load-failure policy, preemption guard)."""
    groups: dict[tuple[str, str, str], list[dict]] = defaultdict(list)
    for s in scenarios:
        cfg = s["config"]
        guard = "prefix" if cfg["prefix_guard"] else "fixed"
        groups[(cfg["kv"]["role"], cfg["kv"]["load_failure_policy"], guard)].append(s)
    return dict(groups)


def pd_coverage(traces: list[dict], scenarios: dict[str, dict]) -> dict[str, int]:
    """How many P/D scenarios exercised each connector path (vLLM's traces)."""
    keys = [
        "remote_load",
        "load_after_local_hit",
        "late_load",
        "invalid_blocks",
        "failed_recving",
        "load_error_finish",
        "abort_while_loading",
        "abort_while_held",
        "held_for_send",
        "preempted_after_load",
        "fence_on",
    ]
    counts = dict.fromkeys(keys, 0)
    for trace in traces:
        scenario = scenarios[trace["id"]]
        bs = scenario["config"]["block_size"]
        prompt = {r["id"]: r["prompt_len"] for r in scenario["requests"]}
        hit = dict.fromkeys(keys, False)
        loaded: dict[str, int] = {}  # request -> step its load was announced
        status: dict[str, str] = {}
        held: set[str] = set()
        for r in trace["records"]:
            if r["op"] == "abort":
                hit["abort_while_loading"] |= any(status.get(i) == "WAITING_FOR_REMOTE_KVS" for i in r["ids"])
                hit["abort_while_held"] |= any(i in held for i in r["ids"])
            for rid, blocks in r.get("kv_recv", {}).items():
                loaded[rid] = r["step"]
                hit["load_after_local_hit"] |= len(blocks) < -(-prompt[rid] // bs)
            hit["held_for_send"] |= bool(r.get("kv_send"))
            out = r.get("kv_output")
            if out:
                hit["late_load"] |= any(r["step"] > loaded.get(i, r["step"]) for i in out["finished_recving"])
                hit["invalid_blocks"] |= bool(out["invalid_block_ids"])
                hit["failed_recving"] |= bool(out["failed_recving"])
            hit["preempted_after_load"] |= any(i in loaded for i in r.get("preempted", ()))
            status.update(r.get("status", {}))
            held = set(r.get("held", held))
        hit["remote_load"] = bool(loaded)
        hit["load_error_finish"] = any(f["status"] == "FINISHED_ERROR" for f in trace["final"].values())
        hit["fence_on"] = scenario["config"]["force_defer_block_free"]
        for key, value in hit.items():
            counts[key] += int(value)
    return counts


def _prefix_hits(schedule_records: list[dict]) -> dict[int, list[str]]:
    """Per step, the requests admitted with tokens already computed (a prefix
    hit): not running before the step, and computed beyond what it scheduled."""
    out: dict[int, list[str]] = {}
    running_before: set[str] = set()
    for r in schedule_records:
        admitted = [
            rid for rid, n in r["scheduled"].items() if rid not in running_before and r["computed"].get(rid, 0) - n > 0
        ]
        if admitted:
            out[r["step"]] = admitted
        running_before = set(r["running"])
    return out


def coverage(traces: list[dict]) -> dict[str, int]:
    counts = dict.fromkeys(
        [
            "schedule_steps",
            "preemption",
            "multi_victim_step",
            "deferred_free",
            "empty_step_while_running",
            "prefill_chunks",
            "stop",
            "length_cap",
            "abort",
            "unfinished_at_cap",
            "prefix_hit",
            "hit_after_preemption",
            "cache_eviction",
        ],
        0,
    )
    for trace in traces:
        sch = [r for r in trace["records"] if r["op"] == "schedule"]
        hits = _prefix_hits(sch)
        preempted_before: set[str] = set()
        hit_after_preemption = False
        for r in sch:
            hit_after_preemption |= any(rid in preempted_before for rid in hits.get(r["step"], ()))
            preempted_before.update(r["preempted"])
        cached = [r["cached_hashes"] for r in trace["records"] if "cached_hashes" in r]
        counts["schedule_steps"] += len(sch)
        hit = {
            "preemption": any(r["preempted"] for r in sch),
            "multi_victim_step": any(len(r["preempted"]) > 1 for r in sch),
            "deferred_free": any(r.get("deferred_frees") for r in trace["records"]),
            # Ran nothing and preempted nothing while requests were running (fenced retry stop, async guard).
            "empty_step_while_running": any(not r["scheduled"] and not r["preempted"] and r["running"] for r in sch),
            "prefill_chunks": any(r["prefill_chunks"] for r in sch),
            "stop": any(f["status"] == "FINISHED_STOPPED" for f in trace["final"].values()),
            "length_cap": any(f["status"] == "FINISHED_LENGTH_CAPPED" for f in trace["final"].values()),
            "abort": any(f["status"] == "FINISHED_ABORTED" for f in trace["final"].values()),
            "unfinished_at_cap": any(not f["status"].startswith("FINISHED") for f in trace["final"].values()),
            "prefix_hit": bool(hits),
            "hit_after_preemption": hit_after_preemption,
            "cache_eviction": any(b < a for a, b in zip(cached, cached[1:])),
        }
        for key, value in hit.items():
            counts[key] += int(value)
    return counts


def default_scenarios(
    count: int = 200,
    first_seed: int = 0,
    prefix_twins: bool = True,
    handwritten: bool = True,
    caching_count: int = 0,
    pd_count: int = 0,
) -> tuple[list[dict], dict[str, Expectation]]:
    scenarios: list[dict] = []
    expectations: dict[str, Expectation] = {}
    if handwritten:
        for scenario, expect in all_handwritten() + all_pd_handwritten():
            scenarios.append(validate(scenario))
            expectations[scenario["id"]] = expect
    scenarios += generate_suite(count, first_seed, prefix_twins, caching_count)
    scenarios += generate_pd_suite(pd_count, first_seed)
    return scenarios, expectations


def run_harness(
    scenarios: list[dict],
    expectations: dict[str, Expectation] | None = None,
    shrink_mismatches: bool = False,
    out_dir: Path | None = None,
    shrink_budget: int = 400,
) -> HarnessResult:
    """Replays every scenario on both sides and compares. With `shrink_mismatches`
    the first scenario of each mismatch class is shrunk (through a long-lived
    oracle session) and dumped, with both sides' records, under `out_dir`."""
    from v1_ours import run_ours  # imports engine/; kept here so the module loads without it

    expectations = expectations or {}
    for s in scenarios:
        validate(s)
    result = HarnessResult(scenarios=scenarios)

    t0 = time.perf_counter()
    answer = launch.run_driver(DRIVER, {"scenarios": scenarios})
    result.oracle_seconds = time.perf_counter() - t0
    result.vllm_version = answer["vllm_version"]
    oracle_traces = answer["traces"]
    result.oracle_traces = oracle_traces

    t0 = time.perf_counter()
    our_traces = run_ours(scenarios)
    result.ours_seconds = time.perf_counter() - t0

    for scenario, o_trace, u_trace in zip(scenarios, oracle_traces, our_traces):
        expect = expectations.get(scenario["id"])
        if expect is not None:
            for side, trace in (("vllm", o_trace), ("ours", u_trace)):
                try:
                    problems = expect(trace)
                except Exception as exc:  # a trace too short or malformed for the check
                    problems = [f"the check raised {type(exc).__name__}: {exc} (trace error: {trace['error']})"]
                for problem in problems:
                    result.expectation_failures.append(f"{side} {scenario['id']}: {problem}")
        mismatch = compare(o_trace, u_trace)
        if mismatch is not None:
            result.mismatches.append(mismatch)

    if result.mismatches and (shrink_mismatches or out_dir is not None):
        out = out_dir or DEFAULT_OUT
        by_id = {s["id"]: s for s in scenarios}
        firsts = [group[0] for group in result.classes().values()]
        session = launch.OracleSession(DRIVER) if shrink_mismatches else None
        try:
            for m in firsts:
                scenario = by_id[m.scenario_id]
                if session is not None:
                    scenario, m = _shrink_one(session, scenario, m, shrink_budget)
                result.repro_files.append(dump_repro(m, scenario, out))
        finally:
            if session is not None:
                session.close()
    return result


def _shrink_one(session, scenario: dict, mismatch: Mismatch, budget: int) -> tuple[dict, Mismatch]:
    from v1_ours import run_ours

    def replay(candidate: dict) -> Mismatch | None:
        o_trace = session.ask(candidate)
        if "invalid" in o_trace:
            return None
        return compare(o_trace, run_ours([candidate])[0])

    small, _ = shrink(scenario, replay, mismatch.signature, budget)
    small_mismatch = replay(small)
    if small_mismatch is None or small_mismatch.signature != mismatch.signature:
        return scenario, mismatch  # shrinking drifted; keep the original
    return small, small_mismatch


def golden_scenarios() -> list[dict]:
    """All hand-written scenarios plus a few random ones rich in preemption and
    deferred frees (and their pre-fix twins when the fence is on)."""
    from v1_generate import generate, with_prefix_guard

    scenarios = [validate(s) for s, _ in all_handwritten()]
    for seed in GOLDEN_RANDOM_SEEDS:
        s = generate(seed)
        scenarios.append(s)
        if s["config"]["force_defer_block_free"]:
            scenarios.append(with_prefix_guard(s))
    return scenarios


def record_golden(path: Path = GOLDEN_FILE) -> Path:
    import gzip
    import json

    scenarios = golden_scenarios()
    answer = launch.run_driver(DRIVER, {"scenarios": scenarios})
    traces = []
    for t in answer["traces"]:
        if t["error"] is not None:
            raise RuntimeError(f"vLLM failed on golden scenario {t['id']}: {t['error']['message']}")
        traces.append(t)
    path.parent.mkdir(parents=True, exist_ok=True)
    # One scenario/trace per line: compact, and a re-recording diffs line by line.
    lines = [
        "{",
        f'"vllm_version": {json.dumps(answer["vllm_version"])},',
        '"note": "recorded by python tests/conformance/run_v1.py --record-golden; do not edit",',
        '"cases": [',
        ",\n".join(json.dumps({"scenario": s, "trace": t}, sort_keys=True) for s, t in zip(scenarios, traces)),
        "]}",
    ]
    # mtime=0: re-recording identical traces gives an identical file.
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode(), mtime=0))
    return path


def load_golden(path: Path = GOLDEN_FILE) -> dict:
    import gzip
    import json

    return json.loads(gzip.decompress(path.read_bytes()))
