"""The fake worker half of a KV connector, for P/D conformance scenarios.

Both engines' scheduler sides announce transfers in each step's connector
metadata (loads to start, blocks held for a send). This worker reads those
announcements and, from a seeded script, decides when each transfer completes
and whether a load fails, then hands the results to the scheduler through the
`KVConnectorOutput` of a later `update_from_output` — identically on both sides,
since it runs in the shared replay loop (v1_play.py) and its decisions depend
only on the scenario seed, the request id and the step.

Script (`scenario["worker"]`, every key optional)::

    {"load_delay": [0, 3],        # a load announced in step s completes in the output of
                                  #   step s + d, d drawn uniformly from the range
     "send_delay": [0, 3],        # the same for a producer's held blocks (finished_sending)
     "fail_prob": 0.0,            # probability that a load fails (partly or wholly)
     "failure_mode": "mixed",     # "invalid_blocks": report block ids that did not load
                                  #   (from a random index on, or one block);
                                  # "failed_recving": report the request as failed;
                                  # "mixed": either, per load
     "requests": {"q0": {"delay": 2, "invalid_from": 1}}}
                                  # per request, overrides the draws (hand-written scenarios):
                                  #   delay (load or send), invalid_from (block index within the
                                  #   load: every block from there on fails), failed (true:
                                  #   failed_recving)

A failed load is still reported in `finished_recving` (the NIXL connector does
the same): the scheduler learns of the failure and of the end of the transfer
in one output. Stdlib only (loaded by path in both interpreters).
"""

from __future__ import annotations

import hashlib

FAILURE_MODES = ("invalid_blocks", "failed_recving", "mixed")
WORKER_KEYS = ("load_delay", "send_delay", "fail_prob", "failure_mode", "requests")
OVERRIDE_KEYS = {"delay": int, "invalid_from": int, "failed": bool}


def validate_worker(where: str, script: dict) -> None:
    """Raises ValueError naming the field when the script is malformed."""
    unknown = set(script) - set(WORKER_KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown worker keys {sorted(unknown)}; allowed: {list(WORKER_KEYS)}")
    for key in ("load_delay", "send_delay"):
        lo_hi = script.get(key, [0, 0])
        if not (isinstance(lo_hi, list) and len(lo_hi) == 2 and all(isinstance(x, int) for x in lo_hi)):
            raise ValueError(f"{where}: worker.{key} must be [lo, hi] ints, got {lo_hi!r}")
        if not 0 <= lo_hi[0] <= lo_hi[1]:
            raise ValueError(f"{where}: worker.{key} needs 0 <= lo <= hi, got {lo_hi!r}")
    p = script.get("fail_prob", 0.0)
    if not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
        raise ValueError(f"{where}: worker.fail_prob must be a probability, got {p!r}")
    if script.get("failure_mode", "mixed") not in FAILURE_MODES:
        raise ValueError(f"{where}: worker.failure_mode must be one of {FAILURE_MODES}")
    for rid, override in script.get("requests", {}).items():
        if not isinstance(override, dict) or any(
            k not in OVERRIDE_KEYS or type(v) is not OVERRIDE_KEYS[k] for k, v in override.items()
        ):
            raise ValueError(f"{where}: worker.requests.{rid} may set {OVERRIDE_KEYS}, got {override!r}")


def ordered_ids(ids: list[str]):
    """The report's request ids as a set-like view that iterates in the given
    (sorted) order, or None when empty. Both schedulers iterate these sets
    (`finished_sending` frees blocks in that order); a real `set` of strings
    iterates in an order that depends on the interpreter's hash seed, which
    the two processes do not share."""
    return dict.fromkeys(ids).keys() if ids else None


class FakeWorker:
    def __init__(self, scenario: dict) -> None:
        self.seed = scenario["seed"]
        script = scenario.get("worker", {})
        self.load_delay = script.get("load_delay", [0, 0])
        self.send_delay = script.get("send_delay", [0, 0])
        self.fail_prob = float(script.get("fail_prob", 0.0))
        self.failure_mode = script.get("failure_mode", "mixed")
        self.overrides: dict[str, dict] = script.get("requests", {})
        # (due step, kind, request id, invalid block ids, failed) in announcement order.
        self._pending: list[tuple[int, str, str, list[int], bool]] = []

    def _draw(self, *key: object) -> int:
        digest = hashlib.blake2b("/".join(map(str, (self.seed, *key))).encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little")

    def _delay(self, lo_hi: list[int], *key: object) -> int:
        lo, hi = lo_hi
        return lo + self._draw("delay", *key) % (hi - lo + 1)

    def announce(self, step: int, recv: dict[str, list[int]], send: dict[str, list[int]]) -> None:
        """The metadata of schedule step `step`: loads started, blocks held for sending."""
        for rid, local_block_ids in recv.items():
            due = step + self._delay(self.load_delay, "load", step, rid)
            invalid: list[int] = []
            failed = False
            u = (self._draw("fail", step, rid) & 0xFFFFFFFF) / 2**32
            override = self.overrides.get(rid)
            if override is not None:
                due = step + override.get("delay", 0)
                failed = override.get("failed", False)
                if "invalid_from" in override:
                    invalid = local_block_ids[override["invalid_from"] :]
            elif u < self.fail_prob:
                mode = self.failure_mode
                if mode == "mixed":
                    mode = FAILURE_MODES[self._draw("mode", step, rid) % 2]
                if mode == "failed_recving" or not local_block_ids:
                    failed = True
                else:
                    pick = self._draw("blocks", step, rid)
                    first = (pick >> 8) % len(local_block_ids)
                    # Half the failures lose every block from `first` on, half just that one.
                    invalid = local_block_ids[first:] if pick & 1 else [local_block_ids[first]]
            self._pending.append((due, "recv", rid, invalid, failed))
        for rid in send:
            delay = self.overrides.get(rid, {}).get("delay", self._delay(self.send_delay, "send", step, rid))
            self._pending.append((step + delay, "send", rid, [], False))

    def pending(self) -> bool:
        return bool(self._pending)

    def take(self, step: int) -> dict | None:
        """What the worker reports in the output of schedule step `step`
        (None: nothing, and no `KVConnectorOutput` is attached)."""
        due = [e for e in self._pending if e[0] <= step]
        if not due:
            return None
        self._pending = [e for e in self._pending if e[0] > step]
        out: dict = {"finished_recving": [], "finished_sending": [], "invalid_block_ids": [], "failed_recving": []}
        for _, kind, rid, invalid, failed in due:
            if kind == "send":
                out["finished_sending"].append(rid)
                continue
            out["finished_recving"].append(rid)
            out["invalid_block_ids"].extend(invalid)
            if failed:
                out["failed_recving"].append(rid)
        for key in out:
            out[key] = sorted(set(out[key]))
        return out
