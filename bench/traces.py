"""Trace replay: turn a recorded arrival trace into `WorkloadRequest`s.

Two formats:

* Mooncake JSONL (as published with the Mooncake paper's traces): one JSON
  object per line with `timestamp` (milliseconds since trace start, int),
  `input_length` (prompt tokens), `output_length` (output tokens) and
  optionally `hash_ids` (ids of the prompt's blocks of 512 tokens, the
  trace's block size: equal ids mean equal content). They become the prompt's
  content (`engine/prompt.py`: one segment per hash id), so prefix caching
  hits exactly where the trace says prompts share blocks. Other keys are
  ignored; blank lines are skipped.
* CSV with a header row. Required columns: `arrival_time` (seconds, float),
  `prompt_len`, `output_len` (ints >= 1). Optional: `request_id`, `priority`
  (int). Column order is free; extra columns are ignored.

`time_scale` multiplies every arrival time (0.5 replays twice as fast);
`max_requests` keeps the first N requests in file order. Requests are then
sorted by arrival time (stable, so ties keep file order). Any malformed line
raises TraceError naming the file, the line number and what is wrong.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any, Literal

from bench.errors import InputError
from bench.input_files import check_regular_file
from bench.workloads.lengths import MAX_LENGTH
from bench.workloads.spec import MAX_REQUESTS
from engine.prompt import segment_key
from engine.records import WorkloadRequest

CSV_REQUIRED_COLUMNS = ("arrival_time", "prompt_len", "output_len")
CSV_OPTIONAL_COLUMNS = ("request_id", "priority")
MOONCAKE_REQUIRED_KEYS = ("timestamp", "input_length", "output_length")


# Bounds on a trace file (issue 34): its size, one line, one request's hash ids.
MAX_TRACE_BYTES = 1 << 30
MAX_LINE_CHARS = 1 << 20
MAX_HASH_IDS = 100_000


class TraceError(InputError):
    pass


def require_trace_file(given: str, scenario_source: str | Path) -> Path:
    """The trace a scenario names (`trace.path`, relative to the scenario
    file's directory unless absolute), or a TraceError that shows where it
    was looked for: the absolute path, and what a relative one was taken
    relative to (a scenario run from another directory otherwise reads as
    if the file were simply missing). A relative `--set trace.path=...` is
    the working directory's, made absolute before it gets here
    (bench/commands/run_inputs.py `paths_from_cwd`)."""
    path = Path(given)
    if path.is_absolute():
        where, how = path, "an absolute path"
    else:
        base = Path(scenario_source).parent.resolve()
        where, how = base / path, f"trace.path is relative to the scenario file's directory, {base}"
    if not where.exists() and not where.is_symlink():
        raise TraceError(
            f"{given}: trace file not found at {where} ({how}); allowed: an existing .jsonl or .csv trace file"
        )
    return where


def load_trace(
    path: str | Path,
    format: Literal["mooncake", "csv", "auto"] = "auto",
    time_scale: float = 1.0,
    max_requests: int | None = None,
    request_id_prefix: str = "trace-",
) -> list[WorkloadRequest]:
    """Read a trace file; `auto` picks the format from the suffix (.jsonl/.json or .csv)."""
    path = Path(path)
    if not math.isfinite(time_scale) or time_scale <= 0:
        raise TraceError(f"time_scale must be a finite number > 0, got {time_scale}")
    if max_requests is not None and max_requests < 1:
        raise TraceError(f"max_requests must be >= 1 or None, got {max_requests}")
    if format == "auto":
        suffix = path.suffix.lower()
        if suffix in (".jsonl", ".json"):
            format = "mooncake"
        elif suffix == ".csv":
            format = "csv"
        else:
            raise TraceError(f"{path}: cannot infer trace format from suffix {suffix!r}; use 'mooncake' or 'csv'")
    if path.is_dir():
        raise TraceError(f"{path}: is a directory; expected a trace file (.jsonl or .csv)")
    if not path.exists():
        raise TraceError(f"{path}: trace file not found")
    try:
        check_regular_file(path, MAX_TRACE_BYTES, "trace")
    except InputError as exc:
        raise TraceError(str(exc)) from None
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc.strerror or exc})") from None
    # Without max_requests a trace is read to MAX_REQUESTS + 1 so an oversized one is refused, not loaded.
    limit = max_requests if max_requests is not None else MAX_REQUESTS + 1
    try:
        if format == "mooncake":
            requests = _read_mooncake(path, time_scale, limit, request_id_prefix)
        elif format == "csv":
            requests = _read_csv(path, time_scale, limit, request_id_prefix)
        else:
            raise TraceError(f"unknown trace format {format!r}; allowed: 'mooncake', 'csv', 'auto'")
    except UnicodeDecodeError as exc:
        raise TraceError(f"{path}: not a text file (byte {exc.start} is not UTF-8)") from None
    except csv.Error as exc:  # a field past csv's size limit, a stray NUL
        raise TraceError(f"{path}: not a valid CSV trace ({str(exc)[:80]})") from None
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if len(requests) > MAX_REQUESTS:
        raise TraceError(
            f"{path}: more than {MAX_REQUESTS:,} requests; allowed: at most {MAX_REQUESTS:,} (set max_requests)"
        )
    if not requests:
        raise TraceError(f"{path}: trace has no requests")
    return sorted(requests, key=lambda r: r.arrival_time)


def _lines(fh, path: Path):
    """(line number, line) of a text file, each line at most MAX_LINE_CHARS
    long: a one-line 200 MB trace is refused at its first MiB, not read whole."""
    lineno = 0
    while line := fh.readline(MAX_LINE_CHARS + 1):
        lineno += 1
        if len(line) > MAX_LINE_CHARS and not line.endswith("\n"):
            raise TraceError(f"{path}:{lineno}: a line longer than {MAX_LINE_CHARS:,} characters; allowed: shorter")
        yield lineno, line


def _read_mooncake(path: Path, time_scale: float, max_requests: int | None, prefix: str) -> list[WorkloadRequest]:
    out: list[WorkloadRequest] = []
    with path.open() as fh:
        for lineno, line in _lines(fh, path):
            if not line.strip():
                continue
            if max_requests is not None and len(out) >= max_requests:
                break
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TraceError(f"{where}: invalid JSON ({exc.msg} at column {exc.colno})") from None
            except RecursionError:
                raise TraceError(f"{where}: JSON nested too deeply; allowed: an object of numbers and a list") from None
            except ValueError as exc:  # an integer past Python's digit limit
                raise TraceError(f"{where}: invalid JSON ({str(exc)[:80]})") from None
            if not isinstance(obj, dict):
                raise TraceError(f"{where}: expected a JSON object, got {type(obj).__name__}")
            missing = [k for k in MOONCAKE_REQUIRED_KEYS if k not in obj]
            if missing:
                raise TraceError(
                    f"{where}: missing key(s) {', '.join(missing)}; each line needs {', '.join(MOONCAKE_REQUIRED_KEYS)}"
                )
            timestamp_ms = _number(obj["timestamp"], "timestamp", where, minimum=0.0)
            prompt_len = _positive_int(obj["input_length"], "input_length", where)
            output_len = _positive_int(obj["output_length"], "output_length", where)
            hash_ids = obj.get("hash_ids", [])
            if not isinstance(hash_ids, list) or not all(_is_int(h) for h in hash_ids):
                raise TraceError(f"{where}: hash_ids must be a list of integers")
            if len(hash_ids) > MAX_HASH_IDS:
                raise TraceError(f"{where}: {len(hash_ids):,} hash_ids; allowed: at most {MAX_HASH_IDS:,}")
            out.append(
                WorkloadRequest(
                    request_id=f"{prefix}{len(out)}",
                    arrival_time=timestamp_ms / 1000.0 * time_scale,
                    prompt_len=prompt_len,
                    output_len=output_len,
                    hash_ids=tuple(hash_ids),
                    prompt_segments=hash_id_segments(hash_ids, prompt_len, f"{prefix}{len(out)}"),
                )
            )
    return out


# Tokens per hash id in the Mooncake traces.
MOONCAKE_BLOCK_TOKENS = 512


def hash_id_segments(
    hash_ids: list[int], prompt_len: int, request_id: str, block_tokens: int = MOONCAKE_BLOCK_TOKENS
) -> tuple[tuple[int, int], ...]:
    """The prompt as one segment per hash id (the same id, the same tokens);
    tokens past the listed ids are the request's own."""
    segments = []
    pos = 0
    for hid in hash_ids:
        if pos >= prompt_len:
            break
        n = min(block_tokens, prompt_len - pos)
        segments.append((segment_key(f"mooncake-block/{hid}"), n))
        pos += n
    if pos < prompt_len:
        segments.append((segment_key(f"own/{request_id}"), prompt_len - pos))
    return tuple(segments)


def _read_csv(path: Path, time_scale: float, max_requests: int | None, prefix: str) -> list[WorkloadRequest]:
    out: list[WorkloadRequest] = []
    seen_ids: set[str] = set()
    with path.open(newline="") as fh:
        reader = csv.reader(fh)
        header: list[str] | None = None
        for row in reader:
            lineno = reader.line_num
            where = f"{path}:{lineno}"
            if not row or all(not c.strip() for c in row):
                continue
            if header is None:
                header = [c.strip() for c in row]
                missing = [c for c in CSV_REQUIRED_COLUMNS if c not in header]
                if missing:
                    raise TraceError(
                        f"{where}: header lacks column(s) {', '.join(missing)}; required: "
                        f"{', '.join(CSV_REQUIRED_COLUMNS)}; optional: {', '.join(CSV_OPTIONAL_COLUMNS)}"
                    )
                continue
            if max_requests is not None and len(out) >= max_requests:
                break
            if len(row) != len(header):
                raise TraceError(f"{where}: expected {len(header)} columns like the header, got {len(row)}")
            fields = dict(zip(header, (c.strip() for c in row)))
            arrival = _number(_parse_float(fields["arrival_time"], "arrival_time", where), "arrival_time", where, 0.0)
            prompt_len = _positive_int(_parse_int(fields["prompt_len"], "prompt_len", where), "prompt_len", where)
            output_len = _positive_int(_parse_int(fields["output_len"], "output_len", where), "output_len", where)
            priority = _parse_int(fields["priority"], "priority", where) if fields.get("priority") else 0
            request_id = fields.get("request_id") or f"{prefix}{len(out)}"
            if request_id in seen_ids:
                raise TraceError(f"{where}: duplicate request_id {request_id!r}")
            seen_ids.add(request_id)
            out.append(
                WorkloadRequest(
                    request_id=request_id,
                    arrival_time=arrival * time_scale,
                    prompt_len=prompt_len,
                    output_len=output_len,
                    priority=priority,
                )
            )
    if header is None:
        raise TraceError(f"{path}: empty CSV; expected a header with {', '.join(CSV_REQUIRED_COLUMNS)}")
    return out


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _parse_float(text: str, name: str, where: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise TraceError(f"{where}: {name} {text!r} is not a number") from None


def _parse_int(text: str, name: str, where: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise TraceError(f"{where}: {name} {text!r} is not an integer") from None


def _number(v: Any, name: str, where: str, minimum: float) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TraceError(f"{where}: {name} must be a number, got {v!r}")
    if not math.isfinite(v) or v < minimum:
        raise TraceError(f"{where}: {name} must be a finite number >= {minimum:g}, got {v!r}")
    return float(v)


def _positive_int(v: Any, name: str, where: str) -> int:
    if not _is_int(v):
        raise TraceError(f"{where}: {name} must be an integer, got {v!r}")
    if not 1 <= v <= MAX_LENGTH:
        raise TraceError(f"{where}: {name} must be an integer in [1, {MAX_LENGTH:,}], got {v}")
    return v
