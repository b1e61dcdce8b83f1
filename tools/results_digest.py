"""Digest and compare `disagg-sim run` output directories, ignoring what
changes from one run to the next by design (wall time, provenance).

A refactoring that must not change behaviour is checked by running every
in-process scenario before and after it with fixed `--out` directories and
comparing them:

    python tools/results_digest.py BEFORE_DIR AFTER_DIR     # exit 0: equal, 1: differ
    python tools/results_digest.py DIR                      # one sha256 per file

What is compared: every results JSON (`*.json` except `report*`/`*.html`)
and every step trace (`*.steps.jsonl`), each parsed and re-serialised with
sorted keys after dropping the volatile keys below (and the scenario file's
path), so the comparison is
byte for byte on everything the simulation decides. Plots and the HTML page
are left out: they are drawn from these same files.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

# Keys whose values are not decided by the simulation: where and when it ran,
# how long it took on the wall clock, which tool version and commit.
VOLATILE_KEYS = frozenset(
    {
        "provenance",
        "date",
        "wall_time_s",
        "wall_seconds",
        "elapsed_wall_s",
        "sim_wall_s",
        "run_wall_s",
        "started_at",
    }
)


# Keys at one place only: where the scenario file was read from (the same
# scenario run from two checkouts has two paths).
VOLATILE_PATHS = frozenset({("scenario_config", "source")})


def _strip(value: Any, ignore: frozenset[str], where: tuple[str, ...] = ()) -> Any:
    if isinstance(value, dict):
        return {
            k: _strip(v, ignore, (*where, k))
            for k, v in value.items()
            if k not in ignore and (*where, k) not in VOLATILE_PATHS
        }
    if isinstance(value, list):
        return [_strip(v, ignore, where) for v in value]
    return value


def canonical(path: Path, ignore: frozenset[str] = VOLATILE_KEYS) -> bytes:
    """The file's content without volatile keys, serialised deterministically."""
    text = path.read_text(encoding="utf-8")
    if path.name.endswith(".jsonl"):
        rows = [_strip(json.loads(line), ignore) for line in text.splitlines() if line.strip()]
        return "\n".join(json.dumps(r, sort_keys=True) for r in rows).encode()
    return json.dumps(_strip(json.loads(text), ignore), sort_keys=True).encode()


def compared_files(root: Path) -> list[Path]:
    out = []
    for p in sorted(root.rglob("*")):
        if not p.is_file():
            continue
        if p.name.endswith(".steps.jsonl") or (p.suffix == ".json" and not p.name.startswith("report")):
            out.append(p)
    return out


def digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(canonical(p)).hexdigest() for p in compared_files(root)}


def _first_difference(a: Any, b: Any, where: str = "") -> str | None:
    if type(a) is not type(b):
        return f"{where or '.'}: {a!r:.80} != {b!r:.80}"
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return f"{where}.{k}: only in {'after' if k not in a else 'before'}"
            found = _first_difference(a[k], b[k], f"{where}.{k}")
            if found:
                return found
        return None
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{where}: {len(a)} items != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            found = _first_difference(x, y, f"{where}[{i}]")
            if found:
                return found
        return None
    return None if a == b else f"{where or '.'}: {a!r:.80} != {b!r:.80}"


def compare(before: Path, after: Path) -> list[str]:
    """One line per difference: a file in one side only, or the first key that differs."""
    a, b = digest(before), digest(after)
    problems = [f"{name}: only in {before if name in a else after}" for name in sorted(set(a) ^ set(b))]
    for name in sorted(set(a) & set(b)):
        if a[name] == b[name]:
            continue
        first = _first_difference(
            json.loads(b"[" + canonical(before / name).replace(b"\n", b",") + b"]"),
            json.loads(b"[" + canonical(after / name).replace(b"\n", b",") + b"]"),
        )
        problems.append(f"{name}: differs at {first}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path, nargs="?")
    args = parser.parse_args(argv)
    for root in (args.before, args.after):
        if root is not None and not root.is_dir():
            print(f"{root}: not a directory; allowed: a `disagg-sim run --out` directory", file=sys.stderr)
            return 2
    if args.after is None:
        for name, sha in digest(args.before).items():
            print(f"{sha}  {name}")
        return 0
    problems = compare(args.before, args.after)
    n = len(compared_files(args.before))
    for line in problems:
        print(line)
    print(f"{n} files compared, {len(problems)} differ" if problems else f"{n} files compared, all equal")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
