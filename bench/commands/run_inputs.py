"""What `disagg-sim run` reads before it runs: the scenario (a file, a
built-in name or a results JSON), its `--set` and link-flag overrides, and
the results directory it writes into."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import yaml

from ..bounded_yaml import safe_load_bounded
from ..errors import InputError, one_line

# Files a run writes into its directory; --overwrite removes exactly these.
RUN_OUTPUTS = ("*__r*.json", "*__r*.steps.jsonl", "v0_report.json", "report.html", "plots", "error.log")


def parse_set(items: list[str]) -> dict:
    out = {}
    for item in items:
        if "\x00" in item:
            raise InputError(f"--set {item!r}: holds a NUL byte; allowed: printable key=value")
        if "=" not in item:
            raise InputError(f"--set {item!r}: expected KEY=VALUE, e.g. cluster.decode.engine.num_gpu_blocks=256")
        key, value = item.split("=", 1)
        key = key.strip()
        try:
            parsed = safe_load_bounded(value) if value.strip() else ""
        except yaml.YAMLError as exc:
            raise InputError(f"--set {item!r}: the value is not valid YAML ({one_line(str(exc))})") from None
        out[key] = paths_from_cwd(key.rsplit(".", 1)[-1], parsed)
    return out


def paths_from_cwd(name: str, value: object) -> object:
    """A file a flag names is the working directory's, as any shell argument is; the scenario's own
    paths (trace.path, empirical lengths' path, a cost_model preset file) are its directory's
    (cluster/settings_base.py `scenario_relative`). So a relative path given with `--set` is made
    absolute here, before it joins the scenario: `--set cluster.cost_model=my.json` on a built-in
    scenario finds ./my.json, not one beside the built-in file."""
    if isinstance(value, dict):
        return {k: paths_from_cwd(str(k), v) for k, v in value.items()}
    names_a_file = name == "path" or (name == "cost_model" and str(value).endswith(".json"))
    if names_a_file and isinstance(value, str) and value and not Path(value).is_absolute():
        return str(Path.cwd() / value)
    return value


def link_overrides(args) -> tuple[dict, dict]:
    out, origins = {}, {}
    for flag, field in (
        ("net_delay", "delay_ms"),
        ("jitter", "jitter_ms"),
        ("bandwidth", "bandwidth_MBps"),
        ("loss", "loss"),
    ):
        value = getattr(args, flag)
        if value is not None:
            key = f"cluster.links.kv.{field}"
            out[key] = value
            origins[key] = f"--{flag.replace('_', '-')} {value:g}"
    return out, origins


def load_for_run(target: str):
    """(scenario, the (variant, repeat) to re-run or None): a scenario file or
    name, or a results JSON (its scenario exactly, and which run it records)."""
    from ..rerun import is_result_file, run_of_result, scenario_from_result
    from ..scenario import load_scenario

    if is_result_file(target):
        scenario = scenario_from_result(target)
        return scenario, run_of_result(target, scenario)
    return load_scenario(target), None


def prepare_out_dir(out: str | None, scenario_name: str, overwrite: bool) -> Path:
    """A fresh directory for the run: `results/<scenario>-<time>` (never one
    that exists), or `--out DIR`, which must be new or empty unless --overwrite
    (then only the files a run writes are removed from it)."""
    if out is not None:
        if "\x00" in out:
            raise InputError(f"--out {out!r}: holds a NUL byte; allowed: a directory path")
        path = Path(out)
        if path.exists() and not path.is_dir():
            raise InputError(f"--out {out}: is a file; allowed: a new or empty directory")
        if path.is_dir() and any(path.iterdir()):
            if not overwrite:
                raise InputError(
                    f"--out {out}: already holds files (a previous run?); allowed: a new or empty directory, "
                    "or --overwrite to replace that run's results"
                )
            for pattern in RUN_OUTPUTS:
                for old in path.glob(pattern):
                    shutil.rmtree(old) if old.is_dir() else old.unlink()
    else:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        path = Path("results") / f"{scenario_name}-{stamp}"
        n = 2
        while path.exists():
            path = Path("results") / f"{scenario_name}-{stamp}-{n}"
            n += 1
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"--out {path}: cannot create the directory ({exc.strerror or exc})") from None
    try:
        # An existing directory on a read-only mount (or not ours) fails here,
        # before the first run, not when the results are written.
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        why = exc.strerror or exc
        raise InputError(f"--out {path}: cannot write there ({why}); allowed: a writable directory") from None
    return path
