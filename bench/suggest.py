"""'Did you mean': the closest known name, by meaning as well as by spelling.

Names here are identifiers made of words (`p99_ttft_ms`, `--net-delay`), and
people get the words right but their order or one of them wrong
(`ttft_p99_ms`, `--net-delay-ms`). Plain character similarity ranks those
badly (`ttft_p99_ms` is closer, letter by letter, to `std_ttft_ms`), so a
candidate is scored by an edit distance over its tokens — each token of the
word matched to its most similar token of the candidate — and the spelling
score is kept for misspelt single words.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

CUTOFF = 0.6
# Two tokens count as the same word from this similarity on (`preemption` / `preemptions`).
_SAME_TOKEN = 0.75


def _tokens(name: str) -> list[str]:
    return [t for t in re.split(r"[^A-Za-z0-9]+", name.lower()) if t]


def _token_score(word: list[str], cand: list[str]) -> float:
    if not word or not cand:
        return 0.0
    matched = 0.0
    free = list(cand)
    for tok in word:
        best, where = 0.0, -1
        for i, other in enumerate(free):
            r = 1.0 if tok == other else difflib.SequenceMatcher(None, tok, other).ratio()
            if r > best:
                best, where = r, i
        if best >= _SAME_TOKEN:
            matched += best
            free.pop(where)
    return matched / max(len(word), len(cand))


def score(word: str, candidate: str) -> float:
    """How close `candidate` is to `word` in [0, 1]: the better of token and spelling similarity."""
    spelling = difflib.SequenceMatcher(None, word.lower(), candidate.lower()).ratio()
    return max(_token_score(_tokens(word), _tokens(candidate)), spelling)


def _common_start(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def closest(word: str, candidates: Iterable[str], cutoff: float = CUTOFF) -> str | None:
    """The best candidate scoring at least `cutoff`, or None."""
    best, best_key = None, (cutoff, -1.0, -1)
    for cand in dict.fromkeys(candidates):
        # Ties go to the spelling, then to the longer common start (`--metric` -> `--metrics-port`).
        key = (score(word, cand), difflib.SequenceMatcher(None, word, cand).ratio(), _common_start(word, cand))
        if key >= best_key and (best is None or key > best_key):
            best, best_key = cand, key
    return best
