"""What refusing bad input costs (issue 34, finding 5): each case runs
`disagg-sim` in its own process and reports its exit code, the wall and CPU
time of `main()` (imports excluded) and the process's peak RSS. The target:
exit 2 within 2 s and 200 MB each.

    .venv/bin/python -m benchmarks.bad_input

Not part of the test suite (tests/bench/test_bounded_loading.py pins the
exit codes and messages; this measures).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from tests.bench.test_bad_input import BASE
from tests.bench.test_bounded_loading import BOMB

ROOT = Path(__file__).resolve().parents[1]
PROBE = """
import resource, sys, time
from bench.cli import main
t, c = time.monotonic(), time.process_time()
code = main(sys.argv[1:])
print("PROBE", code, time.monotonic() - t, time.process_time() - c,
      resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, file=sys.stderr)
"""


def cases(tmp: Path) -> dict[str, list[str]]:
    def write(name: str, text: str) -> str:
        (tmp / name).write_text(text)
        return str(tmp / name)

    fifo = tmp / "pipe.yaml"
    os.mkfifo(fifo)
    base = yaml.safe_dump(BASE, sort_keys=False)
    trace = tmp / "t.jsonl"
    with trace.open("w") as out:
        out.write('{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [')
        for _ in range(100):
            out.write("1," * (1 << 20))
        out.write("1]}\n")
    traced = {k: v for k, v in BASE.items() if k != "workload"}
    traced["trace"] = {"path": str(trace), "format": "mooncake"}
    return {
        "yaml bomb (9^9 aliases)": ["validate", write("bomb.yaml", BOMB)],
        "/dev/zero": ["validate", "/dev/zero"],
        "FIFO": ["validate", str(fifo)],
        "YAML nested 10k": ["validate", write("deep.yaml", "a: " + "[" * 10_000 + "]" * 10_000 + "\n")],
        "5,000-digit int": [
            "validate",
            write("int.yaml", base.replace("num_requests: 4", "num_requests: " + "9" * 5000)),
        ],
        "--set nested 10k": ["run", write("s.yaml", base), "--set", "seed=" + "[" * 10_000 + "]" * 10_000],
        "200 MB one-line trace": ["validate", write("traced.yaml", yaml.safe_dump(traced))],
    }


def main() -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, args in cases(Path(tmp)).items():
            run = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, cwd=ROOT)
            _, code, wall, cpu, peak = run.stderr.strip().splitlines()[-1].split()
            rows.append(
                {
                    "case": name,
                    "exit": int(code),
                    "wall_s": round(float(wall), 3),
                    "cpu_s": round(float(cpu), 3),
                    "peak_rss_mib": int(peak) >> 20,
                }
            )
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
