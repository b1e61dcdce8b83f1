"""`disagg-sim validate-cost`: re-simulate the published points, write
results.json and docs/validation.md (docs/validation.md says how)."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

from bench.errors import InputError, did_you_mean
from engine.roofline import RooflineParams

from .dataset import DATASET, Point, load_points
from .fit import FITTED, fit, load_fitted, save_fitted
from .report import METRICS, render
from .simulate import simulate

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "validation.md"
RESULTS = Path(__file__).resolve().parent / "results.json"


def predict(points: list[Point], fitted: dict[str, RooflineParams], log=print) -> dict[str, dict]:
    """Every point simulated with its GPU's fitted factors and with the defaults."""
    out: dict[str, dict] = {}
    for p in points:
        if p.gpu not in fitted:
            raise InputError(f"{p.id}: no fitted factors for gpu {p.gpu!r}; allowed: {sorted(fitted)} (or run --fit)")
        out[p.id] = {
            "fitted": asdict(simulate(p, fitted[p.gpu])),
            "defaults": asdict(simulate(p, RooflineParams())),
        }
        r = out[p.id]["fitted"]
        errs = "  ".join(
            f"{label} {100 * (r[key] - getattr(p.published, key)) / getattr(p.published, key):+.0f}%"
            for key, label in METRICS
        )
        log(f"{p.id}: {errs}")
    return out


def select(points: list[Point], only: list[str] | None) -> list[Point]:
    if not only:
        return points
    ids = [p.id for p in points]
    for name in only:
        if name not in ids:
            raise InputError(f"--only {name!r}: no such point{did_you_mean(name, ids)}; allowed: an id of {DATASET}")
    return [p for p in points if p.id in only]


def write_results(results: dict[str, dict], path: Path) -> None:
    path.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def load_results(path: Path = RESULTS) -> dict[str, dict]:
    return json.loads(path.read_text(encoding="utf-8"))


def add_validate_cost_parser(sub) -> None:
    v = sub.add_parser(
        "validate-cost",
        help="re-simulate published vLLM measurements (bench/validation/published.yaml); write docs/validation.md",
    )
    v.add_argument(
        "--only",
        action="append",
        metavar="ID",
        help="only this point (repeatable); writes nothing unless --out/--results are given",
    )
    v.add_argument(
        "--render-only",
        action="store_true",
        help="rewrite the Markdown from the stored predictions (bench/validation/results.json); simulate nothing",
    )
    v.add_argument("--fit", action="store_true", help="refit the per-GPU efficiency factors first (slow: minutes)")
    v.add_argument("--dataset", type=Path, default=DATASET, help="the points file (default: the shipped one)")
    v.add_argument("--fitted", type=Path, default=FITTED, help="the per-GPU factors file (default: the shipped one)")
    v.add_argument("--out", type=Path, help=f"the Markdown to write (default: {DOC.relative_to(ROOT)})")
    v.add_argument("--results", type=Path, help=f"the predictions JSON to write (default: {RESULTS.relative_to(ROOT)})")
    v.set_defaults(func=cmd_validate_cost)


def cmd_validate_cost(args) -> int:
    if not args.dataset.exists():
        raise InputError(f"--dataset {args.dataset}: no such file; allowed: a published-points YAML")
    all_points = load_points(args.dataset)
    points = select(all_points, args.only)
    if args.fit:
        fitted_raw = fit(all_points, log=lambda s: print(s, file=sys.stderr))
        save_fitted(fitted_raw, all_points, args.fitted)
    if not args.fitted.exists():
        raise InputError(f"--fitted {args.fitted}: no such file; allowed: a fitted-factors JSON (or --fit)")
    fitted = load_fitted(args.fitted)
    if args.render_only:
        stored = load_results(args.results or RESULTS)
        missing = [p.id for p in points if p.id not in stored]
        if missing:
            raise InputError(f"--render-only: no stored predictions for {missing}; allowed: run without --render-only")
        results = {p.id: stored[p.id] for p in points}
    else:
        results = predict(points, fitted, log=lambda s: print(s, file=sys.stderr))
    doc = render(points, fitted, results)
    out = args.out if args.out is not None else (None if args.only else DOC)
    # --render-only reads the predictions; it has nothing new to store.
    res_path = None if args.render_only else (args.results or (None if args.only else RESULTS))
    if res_path is not None:
        write_results(results, res_path)
        print(f"wrote {res_path}")
    if out is not None:
        out.write_text(doc, encoding="utf-8")
        print(f"wrote {out}")
    # The medians table, for the terminal.
    start = doc.index("## Median absolute error")
    print(doc[start : doc.index("## Every point")].rstrip())
    return 0
