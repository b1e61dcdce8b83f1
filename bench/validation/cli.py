"""`disagg-sim validate-cost`: re-simulate the published points, write
results.json and docs/validation.md (docs/validation.md says how)."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

from bench.commands.parsing import console
from bench.errors import InputError, did_you_mean
from bench.progress import ItemProgress

from .dataset import DATASET, INDEPENDENT, Point, load_all
from .fit import FITTED, Fitted, Runs, fit, fit_fixed, load_fitted, save_fitted
from .report import METRICS, point_errors, render
from .roles import is_pd
from .simulate import skip_reason

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "validation.md"
RESULTS = Path(__file__).resolve().parent / "results.json"


def split(points: list[Point]) -> tuple[list[Point], list[tuple[Point, str]]]:
    """(re-simulated points, [(skipped point, why)])."""
    sim, skipped = [], []
    for p in points:
        why = skip_reason(p)
        if why is None:
            sim.append(p)
        else:
            skipped.append((p, why))
    return sim, skipped


def fit_all(
    points: list[Point], runs: Runs, log=print, start: Fitted | None = None
) -> tuple[Fitted, dict[str, Fitted]]:
    """In-sample on every point (its walks from the defaults, or once from `start`, a stored in-sample fit),
    and one fit per source without it (leave-one-source-out), its walks from the in-sample values
    (fit.warm_start: what the remaining points do not identify dropped)."""
    log("== in-sample fit" + ("" if start is None else " from the stored one"))
    in_sample = fit(points, runs, log, start=start)
    held_out = {}
    for lab in sorted({p.lab for p in points}):
        if not any(p.lab == lab and not is_pd(p) for p in points):
            # Only P/D points, which no fit uses: the fit without them is the in-sample one.
            held_out[lab] = in_sample
            continue
        log(f"== fit without {lab}")
        held_out[lab] = fit([p for p in points if p.lab != lab], runs, log, start=in_sample)
    return in_sample, held_out


def refit_fixed(
    points: list[Point], stored: dict, runs: Runs, log=print, host: bool = True
) -> tuple[Fitted, dict[str, Fitted]]:
    """The stored fits with only the small steps' fixed times refitted (fit.fit_fixed; `host` False: the
    per-layer ones only), in-sample and per held-out source: minutes where --fit takes tens of them."""
    log("== in-sample: fixed times")
    in_sample = fit_fixed(points, stored["in_sample"], runs, log, host)
    held_out = {}
    for lab in sorted({p.lab for p in points}):
        if not any(p.lab == lab and not is_pd(p) for p in points):
            held_out[lab] = in_sample
            continue
        log(f"== without {lab}: fixed times")
        held_out[lab] = fit_fixed([p for p in points if p.lab != lab], stored["held_out"][lab], runs, log, host)
    return in_sample, held_out


def predict(
    points: list[Point],
    in_sample: Fitted,
    held_out: dict[str, Fitted],
    runs: Runs,
    log=print,
    progress: ItemProgress | None = None,
) -> dict[str, dict]:
    """Each point's predictions; its held-out errors logged, or reported to
    `progress` (a line per point as it starts and ends, and within it)."""
    out: dict[str, dict] = {}
    for p in points:
        if p.lab not in held_out:
            raise InputError(f"{p.id}: no leave-one-source-out fit for source {p.lab!r}; allowed: run with --fit")
        if progress is not None:
            progress.start(p.id)
        out[p.id] = {
            "in_sample": asdict(runs.predict(p, in_sample)),
            "held_out": asdict(runs.predict(p, held_out[p.lab])),
        }
        e = point_errors(p, out[p.id]["held_out"])
        errors = "  ".join(f"{label} {e[key]:+.0f}%" for key, label in METRICS if key in e)
        if progress is not None:
            progress.finish(f"held-out error {errors}")
        else:
            log(f"{p.id}: {errors}")
    return out


def select(points: list[Point], only: list[str] | None) -> list[Point]:
    if not only:
        return points
    ids = [p.id for p in points]
    for name in only:
        if name not in ids:
            raise InputError(
                f"--only {name!r}: no such re-simulated point{did_you_mean(name, ids)}; allowed: an id of "
                f"{DATASET.name} or {INDEPENDENT.name} that is not skipped"
            )
    return [p for p in points if p.id in only]


def write_results(results: dict[str, dict], path: Path) -> None:
    path.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def load_results(path: Path = RESULTS) -> dict[str, dict]:
    return json.loads(path.read_text(encoding="utf-8"))


def add_validate_cost_parser(sub) -> None:
    v = sub.add_parser(
        "validate-cost",
        help="re-simulate published vLLM measurements (bench/validation/*.yaml); write docs/validation.md",
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
    v.add_argument(
        "--fit",
        action="store_true",
        help="refit first, in-sample and leave-one-source-out (slow: tens of minutes)",
    )
    v.add_argument(
        "--fit-from-stored",
        action="store_true",
        help="refit as --fit, but the in-sample walks once from the stored in-sample values (--fitted) instead "
        "of twice from the defaults: about half the time",
    )
    v.add_argument(
        "--fit-fixed",
        action="store_true",
        help="refit only the small steps' terms (weight reads' efficiency, host per step, MoE layer) "
        "from the stored fit (minutes)",
    )
    v.add_argument(
        "--fit-layers",
        action="store_true",
        help="refit only the fixed time per MoE layer from the stored fit (the all-reduce keeps its cited time): "
        "only MoE points' runs change",
    )
    v.add_argument(
        "--dataset",
        type=Path,
        action="append",
        help="a points file (repeatable; default: published.yaml and independent.yaml)",
    )
    v.add_argument("--fitted", type=Path, default=FITTED, help="the fitted-parameters file (default: the shipped one)")
    v.add_argument("--out", type=Path, help=f"the Markdown to write (default: {DOC.relative_to(ROOT)})")
    v.add_argument("--results", type=Path, help=f"the predictions JSON to write (default: {RESULTS.relative_to(ROOT)})")
    v.set_defaults(func=cmd_validate_cost)


def cmd_validate_cost(args) -> int:
    paths = args.dataset or [DATASET, INDEPENDENT]
    for path in paths:
        if not path.exists():
            raise InputError(f"--dataset {path}: no such file; allowed: a published-points YAML")
    every, skipped = split(load_all(paths))
    points = select(every, args.only)
    log = lambda s: print(s, file=sys.stderr)  # noqa: E731
    runs = Runs(log)
    if (args.fit_from_stored or not args.fit) and not args.fitted.exists():  # only --fit alone makes it
        raise InputError(f"--fitted {args.fitted}: no such file; allowed: a fitted-parameters JSON (or --fit)")
    if args.fit or args.fit_from_stored:
        start = load_fitted(args.fitted)["in_sample"] if args.fit_from_stored else None
        in_sample, held_out = fit_all(every, runs, log, start)
        save_fitted(in_sample, held_out, args.fitted)
    if (args.fit_fixed or args.fit_layers) and not (args.fit or args.fit_from_stored):
        save_fitted(*refit_fixed(every, load_fitted(args.fitted), runs, log, host=args.fit_fixed), args.fitted)
    stored = load_fitted(args.fitted)
    in_sample, held_out = stored["in_sample"], stored["held_out"]
    if args.render_only:
        kept = load_results(args.results or RESULTS)
        missing = [p.id for p in points if p.id not in kept]
        if missing:
            raise InputError(f"--render-only: no stored predictions for {missing}; allowed: run without --render-only")
        results = {p.id: kept[p.id] for p in points}
    else:
        with ItemProgress(console(), "validate-cost", len(points), "point") as progress:
            runs.within = progress.within
            results = predict(points, in_sample, held_out, runs, log, progress)
        runs.within = None
    doc = render(points, [] if args.only else skipped, in_sample, held_out, results)
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
