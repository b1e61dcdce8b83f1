"""Loading has bounds (issue 34, finding 5): a YAML bomb, /dev/zero, a FIFO,
deep nesting, huge integers, duplicate keys, a one-line giant trace and
nested hash_ids each end with exit 2 and one line naming the problem.
Their time and memory (under 2 s and 200 MB each) are measured by
`benchmarks/bad_input.py` (benchmarks/RESULTS.md), not asserted here."""

from __future__ import annotations

import copy
import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from bench.cli import main
from tests.bench.test_bad_input import BASE

BOMB = """
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


@pytest.fixture
def assert_refused(capsys):
    def check(args, *words: str) -> None:
        code = main(list(args))
        stderr = capsys.readouterr().err.strip()
        assert code == 2, stderr
        assert len(stderr.splitlines()) == 1 and "Traceback" not in stderr, stderr
        for word in words:
            assert word in stderr, stderr

    return check


def write(tmp_path: Path, text: str, name: str = "s.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_a_yaml_bomb_is_refused(assert_refused, tmp_path):
    assert_refused(["validate", write(tmp_path, BOMB)], "s.yaml:", "aliases expand")


def test_dev_zero_and_a_fifo_are_refused_by_their_type(assert_refused, tmp_path):
    assert_refused(["validate", "/dev/zero"], "not a regular file")
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    assert_refused(["validate", str(fifo)], "not a regular file")


@pytest.mark.parametrize("depth", [100, 10_000])
def test_deep_nesting_is_refused(assert_refused, tmp_path, depth):
    assert_refused(["validate", write(tmp_path, "a: " + "[" * depth + "]" * depth + "\n")], "s.yaml:1", "nested")


def test_a_huge_integer_is_refused(assert_refused, tmp_path):
    text = yaml.safe_dump(BASE, sort_keys=False).replace("num_requests: 4", "num_requests: " + "9" * 5000)
    assert_refused(["validate", write(tmp_path, text)], "s.yaml:", "digits")


def test_a_duplicate_key_is_refused(assert_refused, tmp_path):
    text = yaml.safe_dump(BASE, sort_keys=False) + "name: again\n"
    assert_refused(["validate", write(tmp_path, text)], "given twice")


def test_a_deep_set_is_refused(assert_refused, tmp_path):
    path = write(tmp_path, yaml.safe_dump(BASE, sort_keys=False))
    deep = "seed=" + "[" * 10_000 + "]" * 10_000
    assert_refused(["run", path, "--set", deep, "--out", str(tmp_path / "out")], "--set", "nested")


def trace_scenario(tmp_path: Path, trace: Path) -> str:
    data = {k: v for k, v in BASE.items() if k != "workload"}
    data["trace"] = {"path": str(trace), "format": "mooncake"}
    return write(tmp_path, yaml.safe_dump(data, sort_keys=False))


def test_a_one_line_giant_trace_is_refused_at_its_first_mib(assert_refused, tmp_path):
    trace = tmp_path / "t.jsonl"
    with trace.open("w") as out:  # 200 MB on one line, written in pieces
        out.write('{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [')
        piece = "1," * (1 << 20)
        for _ in range(100):
            out.write(piece)
        out.write("1]}\n")
    assert_refused(["validate", trace_scenario(tmp_path, trace)], "t.jsonl:1", "longer than")


@pytest.mark.parametrize(
    "hash_ids, words",
    [("[" * 50_000 + "]" * 50_000, ("t.jsonl:1", "nested")), ("[" + "9" * 5000 + "]", ("t.jsonl:1", "JSON"))],
)
def test_a_trace_line_nested_deep_or_with_a_huge_integer_is_refused(assert_refused, tmp_path, hash_ids, words):
    trace = tmp_path / "t.jsonl"
    head = json.dumps({"timestamp": 0, "input_length": 10, "output_length": 5})[:-1]
    trace.write_text(head + f', "hash_ids": {hash_ids}}}\n')
    assert_refused(["validate", trace_scenario(tmp_path, trace)], *words)


def test_an_out_directory_that_cannot_be_written_is_refused_before_the_run(assert_refused, tmp_path):
    """An existing --out on a read-only mount failed with exit 4 once the
    run had started. A read-only tmpfs needs root; elsewhere this is skipped."""
    mount = tmp_path / "ro"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "none", str(mount)], capture_output=True).returncode:
        pytest.skip("cannot mount a read-only tmpfs here (not root)")
    try:
        path = write(tmp_path, yaml.safe_dump(BASE, sort_keys=False))
        assert_refused(["run", path, "--out", str(mount)], "--out", "cannot write there")
    finally:
        subprocess.run(["umount", str(mount)], check=True)


@pytest.mark.parametrize("key", ["faults", "seed", "repeats", "trace.path"])
def test_a_variant_setting_a_key_it_cannot_change_is_refused_at_load(assert_refused, tmp_path, key):
    """Issue 34, finding 7: `set: {faults: ...}` in a variant was silently ignored."""
    data = copy.deepcopy(BASE)
    data["variants"][1]["set"][key] = [{"kill": "decode-0", "at": 0.1}] if key == "faults" else 3
    path = write(tmp_path, yaml.safe_dump(data, sort_keys=False))
    assert_refused(["validate", path], "s.yaml:", f"variant 'b' sets {key!r}", "cluster. or workload.")
