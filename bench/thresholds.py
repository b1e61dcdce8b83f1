"""Thresholds written as small expressions over the results of a run.

Threshold language (parsed by hand, never eval'd):

    threshold  := sum CMP sum              CMP: == != <= >= < >
    sum        := product (("+" | "-") product)*
    product    := unary (("*" | "/") unary)*
    unary      := "-" unary | atom
    atom       := NUMBER | ref | AGG "(" ref ")" | "(" sum ")"
    ref        := METRIC "[" VARIANT ("@" NODE)? "]"   AGG: mean min max median std

`metric[variant]` is the mean over that variant's repeats; wrap it in an
aggregate to pick another (`max(num_zero_progress_preemptions[fixed]) == 0`).
`metric[variant@node]` is one node's figure (its counters and step
aggregates; bench/per_node.py): `num_preemptions[fixed@decode-1] == 0`.
Division follows IEEE: x/0 is +-inf (so "a / b >= 10" passes when b is 0 and
a is not). 0/0 is undefined: the threshold fails, whatever its comparison,
and says so.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bench.errors import InputError, did_you_mean
from bench.per_node import node_names, node_view, split_variant
from bench.results import ResultsError, is_number

AGGREGATES = {
    "mean": lambda xs: float(np.mean(xs)),
    "min": lambda xs: float(np.min(xs)),
    "max": lambda xs: float(np.max(xs)),
    "median": lambda xs: float(np.median(xs)),
    "std": lambda xs: sample_std(xs),
}
COMPARATORS = {
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    "<=": lambda a, b: a <= b,
    ">=": lambda a, b: a >= b,
    "<": lambda a, b: a < b,
    ">": lambda a, b: a > b,
}


class ThresholdError(InputError):
    pass


def divide(a: float, b: float) -> float:
    """a / b with IEEE semantics rather than ZeroDivisionError; 0/0 is NaN (undefined)."""
    if b == 0:
        return math.nan if a == 0 or math.isnan(a) else math.copysign(math.inf, a)
    return a / b


def ratio_of_means(xs: Sequence[float], base: Sequence[float]) -> float | None:
    """The comparison table's ratio: mean(xs) / mean(base), as `m[a] / m[b]` in a threshold."""
    if not xs or not base:
        return None
    return divide(float(np.mean(xs)), float(np.mean(base)))


def sample_std(xs: Sequence[float]) -> float:
    return float(np.std(xs, ddof=1)) if len(xs) > 1 else 0.0


# ---- grouping ------------------------------------------------------------------------------------


def group_by_variant(results: Sequence[dict]) -> dict[str, dict[int, dict]]:
    """variant -> repeat -> result, in first-seen variant order; duplicates are an error."""
    groups: dict[str, dict[int, dict]] = {}
    for r in results:
        runs = groups.setdefault(r["variant"], {})
        if r["repeat"] in runs:
            raise ResultsError(f"two results for variant {r['variant']!r} repeat {r['repeat']}")
        runs[r["repeat"]] = r
    return groups


def metric_values(groups: dict[str, dict[int, dict]], metric: str, variant: str) -> dict[int, float]:
    """Per repeat, `metric` of `variant` — or of one node, `variant@node` (bench/per_node.py)."""
    base, node = split_variant(variant)
    if variant not in groups and node is not None and base in groups:
        runs = _node_runs(groups[base], base, node)
    elif variant not in groups:
        raise ThresholdError(f"unknown variant {variant!r}{did_you_mean(variant, groups)}; known: {', '.join(groups)}")
    else:
        runs = groups[variant]
    missing = [rep for rep, r in runs.items() if not is_number(r.get(metric))]
    if missing:
        known = sorted({k for r in runs.values() for k, v in r.items() if is_number(v)})
        raise ThresholdError(f"unknown metric {metric!r} for variant {variant!r}{did_you_mean(metric, known)}")
    return {rep: float(r[metric]) for rep, r in sorted(runs.items())}


def _node_runs(runs: dict[int, dict], variant: str, node: str) -> dict[int, dict]:
    views = {rep: node_view(r, node) for rep, r in runs.items()}
    missing = [rep for rep, v in views.items() if v is None]
    if missing:
        known = node_names(list(runs.values()))
        raise ThresholdError(
            f"unknown node {node!r} of variant {variant!r}{did_you_mean(node, known)}; known: {', '.join(known)}"
        )
    return {rep: v for rep, v in views.items() if v is not None}


# ---- threshold parsing ---------------------------------------------------------------------------

_TOKEN = re.compile(
    r"\s*(?:(?P<num>\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)"
    r"|(?P<name>[A-Za-z_][A-Za-z0-9_.]*)"
    r"|(?P<variant>\[[^\]]*\])"
    r"|(?P<op>==|!=|<=|>=|<|>|[-+*/()]))"
)


@dataclass(frozen=True)
class Ref:
    metric: str
    variant: str
    agg: str = "mean"

    def __str__(self) -> str:
        core = f"{self.metric}[{self.variant}]"
        return core if self.agg == "mean" else f"{self.agg}({core})"


def _tokenize(text: str) -> list[tuple[str, str, int]]:
    tokens, pos = [], 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            col = pos + (len(text[pos:]) - len(text[pos:].lstrip()))
            raise ThresholdError(_caret(text, col, f"unexpected character {text[col]!r}"))
        kind = m.lastgroup
        assert kind is not None  # (every alternative of `_TOKEN` is a named group)
        tokens.append((kind, m.group(kind), m.start(kind)))
        pos = m.end()
    tokens.append(("end", "", len(text)))
    return tokens


def _caret(text: str, col: int, msg: str) -> str:
    return f"bad threshold: {msg}\n  {text}\n  {' ' * col}^"


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.tokens = _tokenize(text)
        self.i = 0

    def peek(self) -> tuple[str, str, int]:
        return self.tokens[self.i]

    def take(self) -> tuple[str, str, int]:
        tok = self.tokens[self.i]
        self.i += 1
        return tok

    def fail(self, msg: str, tok: tuple[str, str, int] | None = None):
        tok = tok or self.peek()
        found = "end of input" if tok[0] == "end" else repr(tok[1])
        raise ThresholdError(_caret(self.text, tok[2], f"{msg}, found {found}"))

    def expect_op(self, op: str):
        tok = self.take()
        if tok != ("op", op, tok[2]):
            self.fail(f"expected {op!r}", tok)

    def threshold(self):
        lhs = self.sum()
        tok = self.take()
        if tok[0] != "op" or tok[1] not in COMPARATORS:
            self.fail(f"expected a comparison ({' '.join(COMPARATORS)})", tok)
        rhs = self.sum()
        if self.peek()[0] != "end":
            self.fail("expected end of threshold")
        return (tok[1], lhs, rhs)

    def sum(self):
        node = self.product()
        while self.peek()[0] == "op" and self.peek()[1] in "+-":
            node = (self.take()[1], node, self.product())
        return node

    def product(self):
        node = self.unary()
        while self.peek()[0] == "op" and self.peek()[1] in "*/":
            node = (self.take()[1], node, self.unary())
        return node

    def unary(self):
        if self.peek()[:2] == ("op", "-"):
            self.take()
            return ("neg", self.unary())
        return self.atom()

    def atom(self):
        tok = self.take()
        if tok[0] == "num":
            return ("num", float(tok[1]))
        if tok[:2] == ("op", "("):
            node = self.sum()
            self.expect_op(")")
            return node
        if tok[0] == "name" and self.peek()[:2] == ("op", "("):
            if tok[1] not in AGGREGATES:
                self.fail(f"unknown function; allowed: {', '.join(AGGREGATES)}", tok)
            self.take()
            ref = self.ref(self.take())
            self.expect_op(")")
            return ("ref", Ref(ref.metric, ref.variant, tok[1]))
        if tok[0] == "name":
            return ("ref", self.ref(tok))
        self.fail("expected a number, metric[variant], an aggregate or '('", tok)

    def ref(self, tok) -> Ref:
        if tok[0] != "name":
            self.fail("expected a metric name", tok)
        bracket = self.take()
        if bracket[0] != "variant":
            self.fail(f"expected [variant] after metric {tok[1]!r}", bracket)
        variant = bracket[1][1:-1].strip()
        if not variant:
            self.fail("empty variant name", bracket)
        return Ref(tok[1], variant)


def parse_threshold(text: str):
    """Parse one threshold into a small tuple AST; raises ThresholdError with a caret on bad syntax."""
    if not text.strip():
        raise ThresholdError("bad threshold: empty expression")
    return _Parser(text).threshold()


# ---- threshold evaluation ------------------------------------------------------------------------


@dataclass
class ThresholdOutcome:
    text: str
    passed: bool
    lhs: float
    rhs: float
    note: str = ""  # why it failed when the values alone do not say (an undefined side)


def _eval(node, groups) -> float:
    kind = node[0]
    if kind == "num":
        return node[1]
    if kind == "ref":
        ref: Ref = node[1]
        return AGGREGATES[ref.agg](list(metric_values(groups, ref.metric, ref.variant).values()))
    if kind == "neg":
        return -_eval(node[1], groups)
    a, b = _eval(node[1], groups), _eval(node[2], groups)
    if kind == "+":
        return a + b
    if kind == "-":
        return a - b
    if kind == "*":
        return a * b
    return divide(a, b)


def evaluate_thresholds(results: Sequence[dict], thresholds: Sequence[str]) -> list[ThresholdOutcome]:
    """Parse all thresholds first (so a typo fails before anything is judged), then evaluate."""
    groups = group_by_variant(results)
    parsed = [(t, parse_threshold(t)) for t in thresholds]
    outcomes = []
    for text, (op, lhs, rhs) in parsed:
        a, b = _eval(lhs, groups), _eval(rhs, groups)
        if math.isnan(a) or math.isnan(b):
            # 0/0 has no value: the threshold cannot be judged, so it fails,
            # whatever the comparison (`0/0 != 1` must not pass).
            side = "left" if math.isnan(a) else "right"
            outcomes.append(ThresholdOutcome(text, False, a, b, f"the {side} side is undefined (0/0)"))
            continue
        outcomes.append(ThresholdOutcome(text, bool(COMPARATORS[op](a, b)), a, b))
    return outcomes
