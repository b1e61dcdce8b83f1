"""Finding the processes a launched local Ray cluster left behind.

Ray's own processes (GCS, raylet, workers, which host our gRPC servers) are
all descendants of the driver that launched the cluster. We record them
while the cluster runs and, after `ray.shutdown()`, wait for exactly those
PIDs to go — and end, by PID, any that do not. Nothing is matched by name.

For a cluster started with `ray start` (docs/ray.md), `python -m
cluster.ray.processes stop TEMP_DIR` ends just that cluster's processes.
"""

from __future__ import annotations

import os
import signal
import time


def _parent_map() -> dict[int, int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        # The command name (field 2) may hold spaces and parentheses; the
        # fields after the last ')' are fixed: state, ppid, ...
        rest = stat.rsplit(")", 1)[-1].split()
        if len(rest) >= 2:
            parents[int(entry)] = int(rest[1])
    return parents


def descendants(pid: int | None = None) -> set[int]:
    root = os.getpid() if pid is None else pid
    children: dict[int, list[int]] = {}
    for child, parent in _parent_map().items():
        children.setdefault(parent, []).append(child)
    out: set[int] = set()
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in out:
                out.add(child)
                stack.append(child)
    return out


def alive(pid: int) -> bool:
    """True while `pid` runs (a zombie, already exited, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().decode(errors="replace").rsplit(")", 1)[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def reap_children() -> None:
    """Collect exited children so they do not linger as zombies."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def wait_gone(pids: set[int], timeout_s: float) -> set[int]:
    deadline = time.monotonic() + timeout_s
    left = {p for p in pids if alive(p)}
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        reap_children()
        left = {p for p in left if alive(p)}
    return left


def end_processes(pids: set[int], grace_s: float = 3.0) -> set[int]:
    """SIGTERM, then SIGKILL after `grace_s`, exactly these PIDs; returns those still alive."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 2.0)):
        left = {p for p in pids if alive(p)}
        if not left:
            return set()
        for pid in left:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        pids = wait_gone(left, wait)
    return pids


def session_processes(temp_dir: str) -> set[int]:
    """The processes of a `ray start` cluster (all its nodes on this
    machine): those whose command line names its temp dir, with their
    descendants. This process is never included."""
    me = os.getpid()
    roots = {p for p in _parent_map() if p != me and temp_dir in command_line(p)}
    pids = set(roots)
    for root in roots:
        pids |= descendants(root)
    pids.discard(me)
    return pids


def main(argv: list[str] | None = None) -> int:
    """`python -m cluster.ray.processes stop TEMP_DIR`: end, by PID, the
    processes of the `ray start` cluster using TEMP_DIR — unlike `ray stop`,
    which ends every Ray process on the machine, other users' included."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m cluster.ray.processes")
    parser.add_argument("command", choices=["stop", "list"])
    parser.add_argument("temp_dir", help="the --temp-dir the head was started with")
    args = parser.parse_args(argv)
    if not os.path.isabs(args.temp_dir) or len(args.temp_dir) < 6:
        parser.error(f"temp_dir={args.temp_dir!r} is invalid; allowed: an absolute path such as /tmp/dsr-two")
    pids = session_processes(args.temp_dir)
    for pid in sorted(pids):
        print(pid, command_line(pid)[:100])
    if args.command == "stop":
        left = end_processes(pids)
        print(f"ended {len(pids) - len(left)} process(es)" + (f"; still alive: {sorted(left)}" if left else ""))
        return 1 if left else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
