"""Step-by-step comparison of two v1 traces (vLLM's and ours), the mismatch report,
and a small shrinker that turns a failing scenario into a minimal reproduction.

A trace (v1_play.py) is a list of records, one per schedule/update/abort/add;
the first record that differs is the mismatch. Every key is compared exactly,
except those listed in DELIBERATE_DEVIATIONS (documented in docs/deviations.md).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

# key -> reason; keys here are dropped from records before comparing. Keep in
# sync with docs/deviations.md. Empty: every recorded observation must match.
DELIBERATE_DEVIATIONS: dict[str, str] = {}

# Recorded for diagnosis only, never compared.
NOT_COMPARED = {"traceback"}


@dataclass
class Mismatch:
    scenario_id: str
    where: str  # "error", "record 17 (schedule step 8, action 12)", "final"
    keys: list[str]  # differing keys
    oracle: object
    ours: object
    context: list[dict] = field(default_factory=list)  # the records just before, equal on both sides

    @property
    def signature(self) -> tuple:
        """Two mismatches with the same signature are probably the same defect."""
        kind = self.where.split(" ")[0]
        if kind == "record" and isinstance(self.oracle, dict):
            kind = self.oracle.get("op", kind)
        return kind, tuple(self.keys)

    def describe(self, max_context: int = 2) -> str:
        lines = [f"[{self.scenario_id}] mismatch at {self.where}; differing keys: {', '.join(self.keys)}"]
        for rec in self.context[-max_context:]:
            lines.append(f"    before: {json.dumps(_brief(rec), sort_keys=True)}")
        if isinstance(self.oracle, dict) and isinstance(self.ours, dict) and self.keys:
            for key in self.keys:
                lines.append(f"    {key}: vllm={json.dumps(self.oracle.get(key), sort_keys=True)}")
                lines.append(f"    {' ' * len(key)}  ours={json.dumps(self.ours.get(key), sort_keys=True)}")
        else:
            lines.append(f"    vllm: {json.dumps(self.oracle, sort_keys=True)[:1500]}")
            lines.append(f"    ours: {json.dumps(self.ours, sort_keys=True)[:1500]}")
        return "\n".join(lines)


def _brief(rec: dict) -> dict:
    return {k: v for k, v in rec.items() if k not in ("computed", "status", "traceback")}


def _clean(rec: dict) -> dict:
    return {k: v for k, v in rec.items() if k not in DELIBERATE_DEVIATIONS and k not in NOT_COMPARED}


def _diff_keys(a: dict, b: dict) -> list[str]:
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def _error_view(err: dict | None) -> dict | None:
    return (
        None if err is None else {"action_index": err["action_index"], "type": err["type"], "message": err["message"]}
    )


def compare(oracle: dict, ours: dict) -> Mismatch | None:
    """The first difference between the two traces of one scenario, or None."""
    sid = oracle["id"]
    o_recs, u_recs = oracle["records"], ours["records"]
    for i in range(max(len(o_recs), len(u_recs))):
        o = _clean(o_recs[i]) if i < len(o_recs) else None
        u = _clean(u_recs[i]) if i < len(u_recs) else None
        if o == u:
            continue
        ref = o or u
        where = f"record {i} ({ref.get('op')}"
        if "step" in ref:
            where += f" step {ref['step']}"
        where += f", action {ref.get('action_index')})"
        if o is None or u is None:
            # One side stopped early: its error (if any) is the explanation.
            keys = ["<missing record>"]
            return Mismatch(
                sid,
                where,
                keys,
                o if o is not None else _error_view(oracle["error"]),
                u if u is not None else _error_view(ours["error"]),
                o_recs[max(0, i - 3) : i],
            )
        return Mismatch(sid, where, _diff_keys(o, u), o, u, o_recs[max(0, i - 3) : i])
    if _error_view(oracle["error"]) != _error_view(ours["error"]):
        return Mismatch(sid, "error", ["error"], oracle["error"], ours["error"], o_recs[-3:])
    if oracle["final"] != ours["final"]:
        o_fin, u_fin = oracle["final"], ours["final"]
        keys = sorted(r for r in set(o_fin) | set(u_fin) if o_fin.get(r) != u_fin.get(r))
        return Mismatch(sid, "final", keys, o_fin, u_fin)
    return None


def dump_repro(mismatch: Mismatch, scenario: dict, out_dir: Path) -> Path:
    """Writes the (ideally shrunk) scenario and both sides' differing records."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{scenario['id']}.repro.json"
    doc = {
        "scenario": scenario,
        "mismatch": {
            "where": mismatch.where,
            "keys": mismatch.keys,
            "vllm": mismatch.oracle,
            "ours": mismatch.ours,
            "context": mismatch.context,
        },
        "replay": "python tests/conformance/run_v1.py --scenario " + str(path),
    }
    path.write_text(json.dumps(doc, indent=1, sort_keys=True))
    return path


# -- shrinker ------------------------------------------------------------------


def _without_request(scenario: dict, rid: str) -> dict:
    s = json.loads(json.dumps(scenario))
    s["requests"] = [r for r in s["requests"] if r["id"] != rid]
    actions = []
    for act in s["actions"]:
        if act["op"] in ("add", "abort"):
            act["ids"] = [x for x in act["ids"] if x != rid]
            if not act["ids"]:
                continue
        if act["op"] == "set_priority":
            act["priorities"].pop(rid, None)
            if not act["priorities"]:
                continue
        actions.append(act)
    s["actions"] = actions
    return s


def _without_action(scenario: dict, index: int) -> dict:
    s = json.loads(json.dumps(scenario))
    del s["actions"][index]
    return s


def _with_drain_steps(scenario: dict, index: int, steps: int) -> dict:
    s = json.loads(json.dumps(scenario))
    s["actions"][index]["max_steps"] = steps
    return s


def shrink(
    scenario: dict,
    still_fails: Callable[[dict], Mismatch | None],
    signature: tuple,
    budget: int = 400,
) -> tuple[dict, int]:
    """Greedy: drop whole requests, then single actions, then trim drain step
    caps, keeping a candidate when the mismatch keeps its signature. Returns the
    smallest scenario found and the number of replays spent."""
    spent = 0

    def keeps(candidate: dict) -> bool:
        nonlocal spent
        if spent >= budget:
            return False
        spent += 1
        m = still_fails(candidate)
        return m is not None and m.signature == signature

    current = scenario
    # Cut everything after the failing action first (cheap, usually big).
    m = still_fails(current)
    spent += 1
    if m is not None and m.where.startswith("record"):
        last = m.oracle.get("action_index") if isinstance(m.oracle, dict) else None
        if isinstance(last, int):
            cut = json.loads(json.dumps(current))
            cut["actions"] = cut["actions"][: last + 1]
            if keeps(cut):
                current = cut
    changed = True
    while changed and spent < budget:
        changed = False
        for req in list(current["requests"]):
            cand = _without_request(current, req["id"])
            if cand["requests"] and keeps(cand):
                current, changed = cand, True
        i = len(current["actions"]) - 1
        while i >= 0 and spent < budget:
            if i < len(current["actions"]):
                cand = _without_action(current, i)
                if keeps(cand):
                    current, changed = cand, True
            i -= 1
        for i, act in enumerate(current["actions"]):
            if act["op"] == "drain" and act["max_steps"] > 1:
                lo, hi = 1, act["max_steps"]
                while lo < hi and spent < budget:  # smallest cap that still fails
                    mid = (lo + hi) // 2
                    if keeps(_with_drain_steps(current, i, mid)):
                        hi = mid
                    else:
                        lo = mid + 1
                if hi < act["max_steps"]:
                    current, changed = _with_drain_steps(current, i, hi), True
    current = dict(current, id=scenario["id"] + "-min")
    return current, spent
