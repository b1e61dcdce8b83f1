"""Reading a user's input file with bounds: a regular file, at most so many
bytes. `/dev/zero` given as a scenario read until memory ran out, and a
FIFO hung the loader (issue 34); a device, FIFO or socket is refused by its
type before it is opened, and a file is read no further than its limit."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .errors import InputError


def check_regular_file(path: Path, limit: int, what: str) -> None:
    """Raise InputError unless `path` is a regular file of at most `limit` bytes
    (OSError passes through for the caller to word)."""
    info = os.stat(path)
    if not stat.S_ISREG(info.st_mode):
        raise InputError(f"{what} {path}: not a regular file (a device, FIFO or socket); allowed: a file")
    if info.st_size > limit:
        raise InputError(f"{what} {path}: {info.st_size:,} bytes; allowed: at most {limit:,}")


def read_regular_text(path: Path, limit: int, what: str) -> str:
    """The UTF-8 text of a regular file of at most `limit` bytes (it may grow
    while read: reading stops one byte past the limit)."""
    check_regular_file(path, limit, what)
    with open(path, "rb") as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise InputError(f"{what} {path}: more than {limit:,} bytes; allowed: at most {limit:,}")
    return data.decode("utf-8")
