"""The one way benchmarks record into benchmarks/RESULTS.md: each benchmark
has one section ("## ..."), its entries ("### <time> — ...") newest first, and
a heading is never repeated (an entry whose heading exists gets a run number)."""

from __future__ import annotations

import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
TITLE = "# Benchmark results"


def record_entry(section: str, entry: str, intro: str = "", path: Path = RESULTS) -> None:
    """Insert `entry` (starting with its "### " heading) first in `section`
    ("## ..."), creating the section after the title if it is missing."""
    if not section.startswith("## ") or not entry.startswith("### "):
        raise ValueError("section must start with '## ' and entry with '### '")
    text = path.read_text() if path.exists() else TITLE + "\n"
    heading, _, body = entry.partition("\n")
    headings = set(re.findall(r"^### .*$", text, flags=re.M))
    if heading in headings:
        n = 2
        while f"{heading} (run {n})" in headings:
            n += 1
        heading = f"{heading} (run {n})"
    entry = heading + "\n" + body.rstrip("\n") + "\n"
    if section not in text:
        block = section + "\n\n" + (intro.rstrip("\n") + "\n\n" if intro else "") + entry
        title_end = text.find("\n", text.find(TITLE)) + 1 if TITLE in text else 0
        text = text[:title_end] + "\n" + block + "\n" + text[title_end:].lstrip("\n")
    else:
        start = text.index(section)
        first_entry = text.find("\n### ", start)
        next_section = text.find("\n## ", start + len(section))
        if first_entry == -1 or (next_section != -1 and first_entry > next_section):
            at = next_section + 1 if next_section != -1 else len(text)
        else:
            at = first_entry + 1
        text = text[:at].rstrip("\n") + "\n\n" + entry + "\n" + text[at:].lstrip("\n")
    path.write_text(text.rstrip("\n") + "\n")
