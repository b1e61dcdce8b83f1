"""A sweep's in-process runs as Ray tasks on a Ray cluster
(`disagg-sim run SCENARIO --address ADDR --jobs N`, or `--cluster`: as many
at once as the cluster has CPUs).

Each run (a variant and a repeat) is independent and deterministic, as
bench/parallel_runs.py explains for `--jobs` on one machine; here each is a
Ray task of one CPU, placed by Ray on any node of the cluster. What goes
where:

- The code: the project's packages, shipped with the tasks' runtime
  environment (`py_modules`), so a worker machine needs Python and the
  dependencies (pyproject.toml), not a checkout of this tree.
- The scenario: the `Sweep` (scenario, variant settings, a trace read on
  the driver beforehand) is put in Ray's object store once; every task
  gets it from there.
- The results: a task builds its run's results JSON and returns it with the
  run; the driver alone writes the files (`write_run`), as they come back,
  and hands the runs on in completion order (the progress display moves as
  runs finish); bench/runner.py puts them back in the sweep's order before
  the table, thresholds and plots, so those are the sequential run's.
- A lost run: a task whose worker process or Ray node died (a machine lost,
  the kernel's out-of-memory killer) is run again — Ray places it on a node
  still alive — up to `RUN_ATTEMPTS` times; each re-run is named in the
  report (`ClusterRuns.reruns`). A run that raises is not re-run: it ends
  the sweep as `RunCrashed`, as on one machine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .errors import InputError
from .results import write_run
from .sweep import RunCrashed, Sweep, file_sha256

# Attempts per run before a run whose worker keeps dying ends the sweep.
RUN_ATTEMPTS = 3
# The project's top-level packages (pyproject.toml's packages.find), shipped to the workers.
PROJECT_PACKAGES = ("engine", "connector", "node", "prefill_node", "decode_node", "proxy", "cluster", "bench", "protos")
REPO_ROOT = Path(__file__).resolve().parent.parent


def code_runtime_env() -> dict[str, Any]:
    """The job's runtime environment (`RayClusterHandle(runtime_env=...)`:
    Ray takes local directories at the job level only): this tree's
    packages (not its tests, docs or virtualenv), uploaded once per driver
    and cached by Ray on each node."""
    return {
        "py_modules": [str(REPO_ROOT / name) for name in PROJECT_PACKAGES],
        "excludes": ["__pycache__", "*.pyc"],
    }


class RunLost(RuntimeError):
    """A run's worker died `RUN_ATTEMPTS` times in a row (not the run's own error)."""


@dataclass(frozen=True)
class Rerun:
    """A run started again because its worker process or node was lost."""

    variant: str
    repeat: int
    attempt: int  # the attempt that starts now (2 = the first re-run)
    reason: str  # Ray's error, one line
    lost_nodes: tuple[str, ...]  # Ray nodes gone since the sweep began, when this was seen

    def describe(self) -> str:
        where = f"; Ray node(s) lost so far: {', '.join(n[:12] for n in self.lost_nodes)}" if self.lost_nodes else ""
        return (
            f"{self.variant} r{self.repeat}: its worker was lost ({self.reason}); re-run, attempt {self.attempt}{where}"
        )


def _one_line(err: BaseException, limit: int = 160) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text[:limit]}{'...' if len(text) > limit else ''}"


def _run_in_task(sweep: Sweep, variant: str, repeat: int) -> tuple[Any, dict, str]:
    """A Ray task's body: the run and its results JSON (no files: the
    sweep's `out_dir` is None here), and the Ray node it ran on."""
    import ray

    run, result = sweep.finished_run(variant, repeat)
    return run, result, ray.get_runtime_context().get_node_id()


def _lost_errors() -> tuple[type[BaseException], ...]:
    """Ray's errors for a task whose worker or node died (not its own error)."""
    from ray import exceptions as rx

    return (
        rx.WorkerCrashedError,
        rx.NodeDiedError,
        rx.LocalRayletDiedError,
        rx.ObjectLostError,  # the result was on a node that died before the driver fetched it
    )


class ClusterRuns:
    """A sweep's runs as Ray tasks on `handle`'s cluster, at most `jobs` at once."""

    def __init__(self, sweep: Sweep, handle: Any, jobs: int, attempts: int = RUN_ATTEMPTS) -> None:
        if jobs < 1:
            raise InputError(f"--jobs {jobs}: invalid; allowed: an integer >= 1")
        self.sweep = sweep
        self.handle = handle
        self.jobs = jobs
        self.attempts = attempts
        self.reruns: list[Rerun] = []
        self.ran_on: dict[tuple[str, int], str] = {}  # run -> Ray node id
        self._nodes_at_start: set[str] = set()
        self._trace_sha256: str | None = None
        scenario = sweep.scenario
        if scenario.file.trace is not None:
            # Read the trace here, once: it ships with the scenario, and its
            # checksum in the results is the driver's file's, not a worker's.
            scenario.workload(scenario.variant_names[0], scenario.file.seed)
            self._trace_sha256 = file_sha256(scenario.trace_path())

    def runs(
        self, keys: list[tuple[str, int]], starting: Callable[[str, int], None]
    ) -> Iterator[tuple[str, int, Any, dict]]:
        """(variant, repeat, run, results JSON) as each run finishes, its
        files written here. `starting(variant, repeat)` is told just before
        a run is handed on. A run that raises ends the sweep as `RunCrashed`
        (bad input as itself); the tasks still going are cancelled."""
        import ray

        remote_sweep = ray.put(replace(self.sweep, out_dir=None, observer=None, ray_handle=None, within=None))
        task = ray.remote(_run_in_task).options(num_cpus=1, max_retries=0, name="disagg-sim-run")
        self._nodes_at_start = self._alive_nodes()
        queue = list(keys)
        attempt = dict.fromkeys(keys, 1)
        pending: dict[Any, tuple[str, int]] = {}
        try:
            while queue or pending:
                while queue and len(pending) < self.jobs:
                    key = queue.pop(0)
                    pending[task.remote(remote_sweep, *key)] = key
                ready, _ = ray.wait(list(pending), num_returns=1)
                key = pending.pop(ready[0])
                outcome = self._collect(ready[0], key, attempt)
                if outcome is None:  # lost: again, first in line
                    queue.insert(0, key)
                    continue
                run, result = outcome
                starting(*key)
                yield key[0], key[1], run, result
        finally:
            for ref in pending:
                ray.cancel(ref, force=True)

    def _collect(self, ref: Any, key: tuple[str, int], attempt: dict[tuple[str, int], int]):
        """The run's (RunResult, results JSON), its files written; None when
        its worker was lost and it is to run again."""
        import ray

        variant, repeat = key
        try:
            run, result, node_id = ray.get(ref)
        except _lost_errors() as err:
            if attempt[key] >= self.attempts:
                crash = RunCrashed(variant, repeat, RunLost(f"lost {attempt[key]} times; last: {_one_line(err)}"))
                crash.out_dir = self.sweep.out_dir
                raise crash from err
            attempt[key] += 1
            lost = tuple(sorted(self._nodes_at_start - self._alive_nodes()))
            self.reruns.append(Rerun(variant, repeat, attempt[key], _one_line(err), lost))
            return None
        except ray.exceptions.RayTaskError as err:
            cause = err.cause if err.cause is not None else err
            if isinstance(cause, (InputError, KeyboardInterrupt)):
                raise cause from None
            crash = RunCrashed(variant, repeat, cause)
            crash.out_dir = self.sweep.out_dir
            raise crash from err
        self.ran_on[key] = node_id
        if self._trace_sha256 is not None:
            result["scenario_config"]["trace_sha256"] = self._trace_sha256
        if self.sweep.out_dir is not None:
            write_run(self.sweep.out_dir, result, run.steps)
        return run, result

    def _alive_nodes(self) -> set[str]:
        try:
            return {n["NodeID"] for n in self.handle.nodes()}
        except Exception:  # the report's detail only; never the reason a sweep fails
            return set()

    def summary_lines(self) -> list[str]:
        """Where the runs went, and every re-run, for the report."""
        per_node: dict[str, int] = {}
        for node_id in self.ran_on.values():
            per_node[node_id] = per_node.get(node_id, 0) + 1
        spread = ", ".join(f"{node[:12]} {n}" for node, n in sorted(per_node.items(), key=lambda kv: -kv[1]))
        lines = [
            f"cluster: {len(self.ran_on)} run(s) as Ray tasks, up to {self.jobs} at once; runs per Ray node: {spread}"
        ]
        if self.reruns:
            lines.append(f"cluster: {len(self.reruns)} run(s) re-run after a lost worker:")
            lines += [f"  {r.describe()}" for r in self.reruns]
        return lines


def cluster_jobs(handle: Any, jobs: int | None) -> int:
    """`jobs`, or (None: `--cluster`) every CPU the cluster offers now."""
    if jobs is not None:
        return jobs
    cpus = int(handle.cluster_resources().get("CPU", 0))
    if cpus < 1:
        raise InputError(
            "--cluster: the Ray cluster offers no CPU for runs; allowed: a cluster with CPUs (ray start --num-cpus N)"
        )
    return cpus


def cluster_mode(args: Any, runtime: str) -> tuple[bool, int | None]:
    """`disagg-sim run`'s flags: (runs as Ray tasks?, how many at once, None
    for every CPU). In-process runs go to the cluster with `--cluster`, or
    with `--address` (then `--jobs` at once)."""
    if args.cluster and args.jobs != 1:
        raise InputError(
            f"--cluster with --jobs {args.jobs}: --cluster runs as many at once as the cluster has CPUs; "
            "allowed: one of them (--address ADDR --jobs N for N at once)"
        )
    on_cluster = bool(args.cluster) or (args.address is not None and runtime == "inproc")
    return on_cluster, (None if args.cluster else args.jobs)
