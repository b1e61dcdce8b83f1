"""Every bad input ends in one line on stderr naming the problem, exit code 2,
no traceback — through `validate` (without running anything) and `run`
(refused before the first run). Issue 12's list and issue 14's "refuse at
load" list, and more."""

import copy
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bench.cli import main

BASE = {
    "name": "tiny",
    "runtime": "inproc",
    "cluster": {
        "prefill": {"count": 1, "engine": {"num_gpu_blocks": 256, "max_model_len": 1024}},
        "decode": {"count": 1, "engine": {"num_gpu_blocks": 100, "max_model_len": 1024}},
    },
    "workload": {"num_requests": 4, "prompt_len": 32, "output_len": 8, "arrival": {"kind": "all_at_once"}},
    "variants": [{"name": "a"}, {"name": "b", "set": {"cluster.decode.engine.preemption_guard": "prefix"}}],
    "thresholds": ["num_preemptions[a] >= 0"],
    "report": {"plots": False},
}


def scenario(tmp_path: Path, mutate=None, text: str | None = None) -> Path:
    data = copy.deepcopy(BASE)
    if mutate is not None:
        mutate(data)
    p = tmp_path / "s.yaml"
    p.write_text(text if text is not None else yaml.safe_dump(data, sort_keys=False))
    return p


def trace_scenario(tmp_path: Path, name: str, content: str | None, fmt: str = "auto") -> Path:
    if content is not None:
        (tmp_path / name).write_text(content)
    return scenario(tmp_path, lambda d: (d.pop("workload"), d.update(trace={"path": name, "format": fmt})))


def one_error_line(capsys, code: int) -> str:
    captured = capsys.readouterr()
    assert code == 2, (code, captured.err)
    assert "Traceback" not in captured.err + captured.out
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    return lines[0]


def set_(path, value):
    def mutate(d):
        node = d
        keys = path.split(".")
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value

    return mutate


# (case id, mutation of BASE, a fragment the one line must contain)
SCENARIO_CASES = [
    (
        "lognormal-mu-400",
        set_("workload.prompt_len", {"kind": "lognormal", "mu": 400, "sigma": 1}),
        "s.yaml:18: workload.prompt_len.mu=400: Input should be less than or equal to 16.2",
    ),
    (
        "reversed-outage",
        set_("cluster.links", {"kv": {"outages": [[5.0, 4.0]]}}),
        "cluster.links.kv: outages[0]=[5, 4] is invalid; allowed: [start_s, end_s] with start_s < end_s",
    ),
    (
        "misspelt-threshold-metric",
        set_("thresholds", ["num_premptions[a] == 0"]),
        "names metric 'num_premptions', which this scenario's results do not have; did you mean num_preemptions?",
    ),
    (
        "threshold-unknown-variant",
        set_("thresholds", ["num_preemptions[c] == 0"]),
        "names variant 'c'; allowed: a, b",
    ),
    ("threshold-syntax", set_("thresholds", ["num_preemptions[a] =="]), "thresholds[0]: bad threshold"),
    (
        "percentiles-drop-a-reported-metric",
        set_("report", {"percentiles": [50, 95, 99.9], "plots": False}),
        "report.metrics[4]='p99_ttft_ms' is not a metric of this scenario's results; did you mean p99.9_ttft_ms?",
    ),
    (
        "percentile-over-100",
        set_("report", {"percentiles": [50, 101]}),
        "percentile 101 is invalid; allowed: 0 < p <= 100",
    ),
    ("poisson-rate-inf", set_("workload.arrival", {"kind": "poisson", "rate": float("inf")}), "arrival.rate=inf"),
    ("poisson-rate-nan", set_("workload.arrival", {"kind": "poisson", "rate": float("nan")}), "arrival.rate=nan"),
    (
        "prompt-over-max-model-len",
        set_("workload.prompt_len", 2000),
        "workload.prompt_len: 4 of 4 prompts (variant 'a', seed 0) are longer than "
        "cluster.prefill.engine.max_model_len=1024 (the longest: 2000 tokens)",
    ),
    (
        "pool-cannot-hold-one-request",
        set_("cluster.decode.engine.max_model_len", 8192),
        "cluster.decode.engine: num_gpu_blocks=100 x block_size=16 holds 1600 tokens, less than one "
        "max_model_len=8192 request (variant 'a'); allowed: num_gpu_blocks >= 512, or max_model_len <= 1600",
    ),
    ("delay-inf", set_("cluster.links", {"kv": {"delay_ms": float("inf")}}), "cluster.links.kv.delay_ms=inf"),
    ("jitter-1e308", set_("cluster.links", {"kv": {"jitter_ms": 1e308}}), "cluster.links.kv.jitter_ms=1e+308"),
    ("pull-timeout-inf", set_("cluster.kv_pull_timeout_s", float("inf")), "cluster.kv_pull_timeout_s=inf"),
    (
        "bandwidth-1e-300",
        set_("cluster.links", {"kv": {"bandwidth_MBps": 1e-300}}),
        "cluster.links.kv.bandwidth_MBps=1e-300: Input should be greater than or equal to 0.001",
    ),
    ("seed-negative", set_("seed", -1), "seed=-1: Input should be greater than or equal to 0"),
    ("sampler-seed-negative", set_("cluster.sampler", {"seed": -1}), "cluster.sampler.seed=-1"),
    (
        "fault-unknown-node",
        set_("faults", [{"kill": "decode-7", "at": 1.0}]),
        "faults[0].kill='decode-7' names no node of variant 'a'; did you mean decode-0?; allowed: prefill-0, decode-0",
    ),
    ("fault-at-nan", set_("faults", [{"kill": "decode-0", "at": float("nan")}]), "faults.0.at=nan"),
    ("fault-at-inf", set_("faults", [{"kill": "decode-0", "at": float("inf")}]), "faults.0.at=inf"),
    ("fault-bad-key", set_("faults", [{"kil": "decode-0", "at": 1}]), "faults.0.kil: unknown key; did you mean kill?"),
    (
        "cost-model-incomplete",
        set_("cluster.cost_model", {"base_ms": 1.0}),
        "cluster.cost_model.prefill_ms_per_token: required key missing",
    ),
    ("cost-model-unknown", set_("cluster.cost_model", "gpt-9"), "cost_model='gpt-9' is unknown"),
    ("num-requests-1e9", set_("workload.num_requests", 10**9), "workload.num_requests=1000000000"),
    ("num-gpu-blocks-1e12", set_("cluster.decode.engine.num_gpu_blocks", 10**12), "num_gpu_blocks=1000000000000"),
    (
        "matrix-of-9-axes",
        lambda d: (d.pop("variants"), d.update(matrix={f"x{i}": {f"v{j}": {} for j in range(10)} for i in range(9)})),
        "the matrix expands to 1,000,000,000 variants; allowed: at most 1000",
    ),
    ("name-with-path", set_("name", "../../../../tmp/x"), "name='../../../../tmp/x': String should match pattern"),
    ("name-absolute", set_("name", "/tmp/x"), "name='/tmp/x': String should match pattern"),
    ("nul-in-description", set_("description", "a\x00b"), "description holds the control character '\\x00'"),
    ("variant-name-bracket", set_("variants", [{"name": "a]"}]), "variants.0.name='a]': String should match"),
    ("unknown-top-level-key", set_("treshold", []), "treshold: unknown key; did you mean thresholds?"),
    (
        "unknown-engine-key",
        set_("cluster.decode.engine.max_num_seq", 4),
        "cluster.decode.engine.max_num_seq: unknown key; did you mean max_num_seqs?",
    ),
    ("repeats-huge", set_("repeats", 10**6), "repeats=1000000: Input should be less than or equal to 1000"),
    (
        "variant-sets-a-bad-value",
        set_("variants", [{"name": "a", "set": {"cluster.links.kv.loss": 1.5}}]),
        "(variant 'a'): cluster.links.kv.loss=1.5: Input should be less than 1",
    ),
]


@pytest.mark.parametrize("command", ["validate", "run"])
@pytest.mark.parametrize("case,mutate,fragment", SCENARIO_CASES, ids=[c[0] for c in SCENARIO_CASES])
def test_bad_scenario_is_one_line_exit_2(tmp_path, capsys, command, case, mutate, fragment):
    path = scenario(tmp_path, mutate)
    out = tmp_path / "out"
    argv = [command, str(path)] + (["--out", str(out)] if command == "run" else [])
    line = one_error_line(capsys, main(argv))
    assert fragment in line, line
    assert not out.exists() or not list(out.iterdir())  # refused before anything ran


TRACE_CASES = [
    ("missing-file", "t.jsonl", None, "auto", "t.jsonl: trace file not found"),
    (
        "bad-json-line",
        "t.jsonl",
        '{"timestamp": 0, "input_length": 8, "output_length": 2}\n{oops\n',
        "auto",
        "t.jsonl:2: invalid JSON",
    ),
    (
        "missing-key",
        "t.jsonl",
        '{"timestamp": 0, "input_length": 8}\n',
        "auto",
        "t.jsonl:1: missing key(s) output_length",
    ),
    (
        "non-numeric-timestamp",
        "t.jsonl",
        '{"timestamp": "soon", "input_length": 8, "output_length": 2}\n',
        "auto",
        "t.jsonl:1: timestamp must be a number, got 'soon'",
    ),
    (
        "zero-length",
        "t.jsonl",
        '{"timestamp": 0, "input_length": 0, "output_length": 2}\n',
        "auto",
        "t.jsonl:1: input_length must be an integer in [1, 10,000,000], got 0",
    ),
    ("empty-trace", "t.jsonl", "\n", "auto", "t.jsonl: trace has no requests"),
    (
        "csv-wrong-header",
        "t.csv",
        "time,prompt,output\n0,8,2\n",
        "auto",
        "t.csv:1: header lacks column(s) arrival_time, prompt_len, output_len",
    ),
    ("not-utf8", "t.jsonl", None, "auto", "not a text file"),
    ("unknown-suffix", "t.txt", "x\n", "auto", "cannot infer trace format from suffix '.txt'"),
    (
        "prompt-over-max-model-len",
        "t.csv",
        "arrival_time,prompt_len,output_len\n0,5000,2\n",
        "auto",
        "trace: 1 of 1 prompts (variant 'a', seed 0) are longer than cluster.prefill.engine.max_model_len=1024",
    ),
]


@pytest.mark.parametrize("command", ["validate", "run"])
@pytest.mark.parametrize("case,name,content,fmt,fragment", TRACE_CASES, ids=[c[0] for c in TRACE_CASES])
def test_bad_trace_is_one_line_exit_2(tmp_path, capsys, command, case, name, content, fmt, fragment):
    if case == "not-utf8":
        (tmp_path / name).write_bytes(b'{"timestamp": 0}\xff\xfe\n')
    path = trace_scenario(tmp_path, name, content, fmt)
    argv = [command, str(path)] + (["--out", str(tmp_path / "out")] if command == "run" else [])
    line = one_error_line(capsys, main(argv))
    assert fragment in line, line


def test_trace_that_is_a_directory(tmp_path, capsys):
    (tmp_path / "t.jsonl").mkdir()
    line = one_error_line(capsys, main(["validate", str(trace_scenario(tmp_path, "t.jsonl", None))]))
    assert "t.jsonl: is a directory; expected a trace file" in line


def test_scenario_path_problems(tmp_path, capsys):
    line = one_error_line(capsys, main(["validate", str(tmp_path)]))
    assert line == f"error: scenario {tmp_path}: is a directory; allowed: a scenario file (.yaml) or a built-in name"
    line = one_error_line(capsys, main(["validate", "casade"]))
    assert "scenario 'casade' not found: not a file, and not a built-in; did you mean cascade?" in line
    bad = scenario(tmp_path, text="name: x\ncluster: {decode: [unclosed\n")
    line = one_error_line(capsys, main(["validate", str(bad)]))
    assert f"{bad}:3: not valid YAML" in line
    top = scenario(tmp_path, text="- a list\n")
    assert "the top level must be a mapping" in one_error_line(capsys, main(["validate", str(top)]))


@pytest.mark.parametrize(
    "argv,fragment",
    [
        (["--metrics-port", "99999"], "argument --metrics-port: 99999 is out of range; allowed: a finite number >= 0"),
        (["--log-stats", "-1"], "argument --log-stats: -1 is out of range; allowed: a finite number > 0"),
        (["--repeats", "0"], "argument --repeats: 0 is out of range"),
        (["--loss", "nan"], "argument --loss: nan is out of range"),
        (["--net-delay", "abc"], "argument --net-delay: 'abc' is not a number"),
        (
            ["--set", "cluster.decode.engine.num_gpu_blocks"],
            "--set 'cluster.decode.engine.num_gpu_blocks': expected KEY=VALUE",
        ),
        (["--set", "repeats=[1"], "--set 'repeats=[1': the value is not valid YAML"),
        (["--set", "cluster.decode.engine.preemption_guard=fixed"], "is also set by variant 'b'"),
        (["--set", "cluster.decode.engne.num_gpu_blocks=4"], "cluster.decode.engne: unknown key; did you mean engine?"),
        (["--net-delay", "1e9"], "--net-delay 1e+09: cluster.links.kv.delay_ms=1000000000.0"),
        (["--only", "c"], "--only c: not a variant of tiny; allowed: a, b"),
        (["--runtime", "k8s"], "argument --runtime: invalid choice: 'k8s'"),
        (["--pace", "1", "--runtime", "ray"], "--pace 1: only in-process runs have a virtual clock to pace"),
    ],
)
def test_bad_flags_are_one_line_exit_2(tmp_path, capsys, argv, fragment):
    path = scenario(tmp_path)
    code = -1
    try:
        code = main(["run", str(path), "--out", str(tmp_path / "out"), *argv])
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    line = one_error_line(capsys, code)
    assert fragment in line, line


def test_out_dir_problems(tmp_path, capsys):
    path = scenario(tmp_path)
    a_file = tmp_path / "file"
    a_file.write_text("x")
    line = one_error_line(capsys, main(["run", str(path), "--out", str(a_file)]))
    assert line == f"error: --out {a_file}: is a file; allowed: a new or empty directory"
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out)]) == 0
    capsys.readouterr()
    line = one_error_line(capsys, main(["run", str(path), "--out", str(out)]))
    assert "already holds files (a previous run?); allowed: a new or empty directory, or --overwrite" in line
    stray = out / "notes.txt"
    stray.write_text("mine")
    assert main(["run", str(path), "--out", str(out), "--overwrite", "--only", "a"]) == 0
    # --overwrite replaced the run's files only: b's results are gone, the user's file stays.
    assert sorted(p.name for p in out.glob("*.json")) == ["tiny__a__r0.json"]
    assert stray.read_text() == "mine"


def test_metrics_port_in_use(tmp_path, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        line = one_error_line(
            capsys, main(["run", str(scenario(tmp_path)), "--out", str(tmp_path / "o"), "--metrics-port", str(port)])
        )
    assert f"--metrics-port {port}: cannot serve /metrics on 127.0.0.1" in line
    assert "allowed: a free port (node i uses PORT+i), or 0 for ephemeral ports" in line


def test_compare_bad_inputs(tmp_path, capsys):
    # On stderr, like every other bad input (a --format json/csv reader never gets it).
    assert main(["compare", str(tmp_path / "nope.json")]) == 2
    out = capsys.readouterr()
    assert "nope.json: result file not found" in out.err and out.out == ""
    (tmp_path / "x.json").write_text("{")
    assert main(["compare", str(tmp_path / "x.json")]) == 2
    assert "x.json:1: invalid JSON" in capsys.readouterr().err


def test_a_subprocess_sees_one_line_and_no_traceback(tmp_path):
    """The real entry point, end to end: stderr is exactly one line."""
    path = scenario(tmp_path, set_("workload.prompt_len", {"kind": "lognormal", "mu": 400, "sigma": 1}))
    proc = subprocess.run(
        [sys.executable, "-m", "bench.cli", "validate", str(path)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "workload.prompt_len.mu=400" in proc.stderr


def test_nothing_here_is_refused_when_it_is_fine(tmp_path, capsys):
    assert main(["validate", str(scenario(tmp_path))]) == 0
    assert "tiny: ok (2 variants: a, b" in capsys.readouterr().out
    # An outage to the end of the run is allowed (.inf end).
    assert (
        main(["validate", str(scenario(tmp_path, set_("cluster.links", {"kv": {"outages": [[1.0, float("inf")]]}})))])
        == 0
    )


def test_zero_over_zero_threshold_fails_and_says_why(tmp_path, capsys):
    path = scenario(tmp_path, set_("thresholds", ["num_preemptions[a] / num_preemptions[a] != 1"]))
    assert main(["run", str(path), "--out", str(tmp_path / "o")]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "FAIL" in out and "the left side is undefined (0/0)" in out


def test_json_dump_of_base_is_plain():
    json.dumps(BASE)  # the fixture itself is valid input
