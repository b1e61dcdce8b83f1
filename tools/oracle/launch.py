"""Project-side launcher for the oracles: vLLM's real schedulers, each in its own venv.

The project never imports vLLM. A driver script (e.g. `tools/oracle/v1_driver.py`)
runs inside the oracle's interpreter; this module finds that interpreter and the
oracle kit, sets the environment the kit's `env.sh` would set, sends
one JSON document on stdin and reads one JSON document back from stdout.
Importing vLLM takes ~20 s here, so callers batch all their work into one call.

Stdlib only, no package-relative imports: the v1 and v0 harnesses and the
benchmarks load it by adding `tools/oracle/` to `sys.path`.

Locations (environment overrides first):
- oracle kit (the scheduler kits, build scripts, model config): `$DISAGG_SIM_ORACLE_KIT_DIR`,
  else the in-repo copy `tools/oracle/kit/` (see its README.md for where it came from).
- v1 interpreter: `$DISAGG_SIM_ORACLE_V1`, else `~/.cache/disagg-sim/vllm-oracle/bin/python`.
- v0 interpreter: `$DISAGG_SIM_ORACLE_V0`, else `~/.cache/disagg-sim/vllm-v0-oracle/bin/python`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
ORACLE_TOOLS_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True)
class OracleSpec:
    """Where one oracle's interpreter lives and how to rebuild it."""

    name: str  # "v1" / "v0"
    python_env_var: str
    default_venv: str  # relative to ~/.cache/disagg-sim
    build_script: str  # relative to the kit directory
    home_env_default: str  # ORACLE_HOME default for env.sh-style caches


ORACLES = {
    "v1": OracleSpec("v1", "DISAGG_SIM_ORACLE_V1", "vllm-oracle", "build.sh", "vllm-oracle-home"),
    "v0": OracleSpec("v0", "DISAGG_SIM_ORACLE_V0", "vllm-v0-oracle", "build-v0.sh", "vllm-v0-oracle-home"),
}


class OracleError(RuntimeError):
    """The oracle subprocess failed or answered something that is not JSON."""


def _spec(name: str) -> OracleSpec:
    try:
        return ORACLES[name]
    except KeyError:
        raise ValueError(f"unknown oracle {name!r}; allowed: {sorted(ORACLES)}") from None


def oracle_kit_dir() -> Path:
    """The directory holding `vllm_scheduler_kit.py` / `v0_scheduler_kit.py` and
    the build scripts: the repository's own copy unless overridden."""
    override = os.environ.get("DISAGG_SIM_ORACLE_KIT_DIR")
    return Path(override).expanduser().resolve() if override else ORACLE_TOOLS_DIR / "kit"


def oracle_python(name: str = "v1") -> Path:
    spec = _spec(name)
    override = os.environ.get(spec.python_env_var)
    if override:
        return Path(override).expanduser()
    return Path.home() / ".cache" / "disagg-sim" / spec.default_venv / "bin" / "python"


def oracle_missing_reason(name: str = "v1") -> str | None:
    """None when the oracle can run; otherwise a sentence saying what is missing."""
    python = oracle_python(name)
    if not python.exists():
        return f"vLLM {name} oracle interpreter not found at {python}"
    kit = oracle_kit_dir()
    if not kit.is_dir():
        return f"oracle kit directory not found at {kit} (unset DISAGG_SIM_ORACLE_KIT_DIR)"
    return None


def oracle_env(name: str = "v1") -> dict[str, str]:
    """The subprocess environment: what the kit's `env.sh` exports, on top of ours."""
    spec = _spec(name)
    env = dict(os.environ)
    home = Path(env.get("ORACLE_HOME") or Path.home() / ".cache" / "disagg-sim" / spec.home_env_default)
    home.mkdir(parents=True, exist_ok=True)
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        HF_HOME=str(home / "hf"),
        VLLM_CACHE_ROOT=str(home / "vllm-cache"),
        VLLM_CONFIG_ROOT=str(home / "vllm-config"),
        XDG_CACHE_HOME=str(home / "xdg-cache"),
        XDG_CONFIG_HOME=str(home / "xdg-config"),
        TORCHINDUCTOR_CACHE_DIR=str(home / "inductor"),
        TRITON_CACHE_DIR=str(home / "triton"),
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        VLLM_TARGET_DEVICE="cpu",
        VLLM_LOGGING_LEVEL=env.get("VLLM_LOGGING_LEVEL", "ERROR"),
        # The driver imports the kit from here and the shared harness modules from REPO_ROOT.
        DISAGG_SIM_ORACLE_KIT=str(oracle_kit_dir()),
        DISAGG_SIM_REPO=str(REPO_ROOT),
        PYTHONHASHSEED="0",
    )
    # Never let the project venv's packages leak into the oracle interpreter.
    env.pop("PYTHONPATH", None)
    env.pop("VIRTUAL_ENV", None)
    return env


# How long one driver call may take (a conformance suite batches hundreds of
# scenarios into one; a loaded 2-core machine takes minutes). The tests that
# wait on a call give pytest this bound too, so this one fires, with its message.
DRIVER_TIMEOUT_S = 1800.0


def run_driver(driver: str | Path, payload: object, name: str = "v1", timeout: float = DRIVER_TIMEOUT_S) -> object:
    """Runs `driver` (a path, or a file name inside tools/oracle/) in the oracle
    interpreter with `payload` as JSON on stdin; returns the decoded JSON stdout.

    The driver must print exactly one JSON document on stdout; vLLM's own chatter
    goes to stderr, which is returned inside the error on failure."""
    reason = oracle_missing_reason(name)
    if reason:
        raise OracleError(reason)
    driver_path = Path(driver)
    if not driver_path.is_absolute():
        driver_path = ORACLE_TOOLS_DIR / driver_path
    if not driver_path.exists():
        raise OracleError(f"oracle driver not found: {driver_path}")
    proc = subprocess.run(
        [str(oracle_python(name)), str(driver_path)],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        env=oracle_env(name),
        cwd=str(REPO_ROOT),
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise OracleError(f"oracle driver {driver_path.name} exited with {proc.returncode}:\n{proc.stderr[-4000:]}")
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError as exc:
        raise OracleError(
            f"oracle driver {driver_path.name} printed non-JSON output ({exc}):\n"
            f"stdout tail: {proc.stdout[-2000:]}\nstderr tail: {proc.stderr[-2000:]}"
        ) from None


class OracleSession:
    """A long-lived driver started with `--serve`: one JSON request per line in,
    one JSON answer per line out. For callers that replay many small variants
    (the shrinker) and cannot pay vLLM's import for each. Use as a context manager."""

    def __init__(self, driver: str | Path, name: str = "v1") -> None:
        reason = oracle_missing_reason(name)
        if reason:
            raise OracleError(reason)
        driver_path = Path(driver)
        if not driver_path.is_absolute():
            driver_path = ORACLE_TOOLS_DIR / driver_path
        self._stderr = open(os.devnull, "w")
        self._proc = subprocess.Popen(
            [str(oracle_python(name)), str(driver_path), "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            env=oracle_env(name),
            cwd=str(REPO_ROOT),
        )
        self.hello = self._read()

    def _read(self) -> object:
        line = self._proc.stdout.readline()
        if not line:
            raise OracleError(f"oracle session ended unexpectedly (exit code {self._proc.poll()})")
        return json.loads(line)

    def ask(self, payload: object) -> object:
        self._proc.stdin.write(json.dumps(payload) + "\n")
        self._proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._stderr.close()

    def __enter__(self) -> OracleSession:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


if __name__ == "__main__":  # `python tools/oracle/launch.py [v1|v0]`: where is the oracle?
    which = sys.argv[1] if len(sys.argv) > 1 else "v1"
    print(oracle_missing_reason(which) or f"{which} oracle: {oracle_python(which)} (kit {oracle_kit_dir()})")
