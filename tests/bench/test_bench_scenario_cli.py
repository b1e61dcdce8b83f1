"""Scenario files and the CLI: validation errors that name the field, variants,
overrides, exit codes."""

import json
from pathlib import Path

import pytest
import yaml

from bench.cli import main
from bench.scenario import ScenarioError, load_scenario

TINY = {
    "name": "tiny",
    "runtime": "inproc",
    "cluster": {
        "prefill": {"count": 1},
        "decode": {"count": 1, "engine": {"num_gpu_blocks": 100, "async_scheduling": True, "max_model_len": 1024}},
    },
    "workload": {"num_requests": 12, "prompt_len": 64, "output_len": 192, "arrival": {"kind": "all_at_once"}},
    "variants": [
        {"name": "prefix", "set": {"cluster.decode.engine.preemption_guard": "prefix"}},
        {"name": "fixed", "set": {"cluster.decode.engine.preemption_guard": "fixed"}},
    ],
    "repeats": 2,
    "thresholds": ["num_zero_progress_preemptions[fixed] == 0"],
    "report": {"baseline": "fixed", "plots": False},
}


def write(tmp_path: Path, data: dict, name="s.yaml") -> Path:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


def test_every_builtin_scenario_validates():
    for name in ("cascade", "cascade-inproc", "delay-sweep", "frozen-workload"):
        s = load_scenario(name)
        assert s.variants


def test_matrix_variants_are_crossed_in_order(tmp_path):
    data = dict(TINY)
    data.pop("variants")
    data["matrix"] = {
        "guard": {"p": {"cluster.decode.engine.preemption_guard": "prefix"}, "f": {}},
        "delay": {"d0": {"cluster.links.kv.delay_ms": 0}, "d9": {"cluster.links.kv.delay_ms": 9}},
    }
    data["thresholds"] = []
    data["report"] = {"plots": False}
    s = load_scenario(write(tmp_path, data))
    assert s.variant_names == ["p+d0", "p+d9", "f+d0", "f+d9"]
    assert s.cluster("p+d9").links.kv.delay_ms == 9
    assert s.cluster("p+d9").decode.engine.preemption_guard == "prefix"


@pytest.mark.parametrize(
    "mutate,message",
    [
        (lambda d: d["cluster"]["decode"]["engine"].update(num_gpu_blocks=1), "num_gpu_blocks"),
        (lambda d: d["cluster"]["decode"]["engine"].update(policy="lifo"), "policy"),
        (
            lambda d: d["cluster"]["decode"].update(pp=2),
            "cluster.decode.pp: unknown key",
        ),
        (lambda d: d.update(runtime="k8s"), "runtime"),
        (lambda d: d["workload"].update(num_requests=0), "num_requests"),
        (lambda d: d["variants"].append({"name": "fixed"}), "unique"),
        (lambda d: d["report"].update(baseline="nope"), "report.baseline='nope' is not a variant"),
        (lambda d: d["variants"][0]["set"].update({"cluster.links.kv.loss": 1.5}), "loss"),
        (lambda d: d.pop("workload"), "exactly one of 'workload'"),
    ],
)
def test_bad_scenarios_name_the_field(tmp_path, mutate, message):
    data = json.loads(json.dumps(TINY))
    mutate(data)
    with pytest.raises(ScenarioError, match=message.replace("(", r"\(").replace("[", r"\[")):
        load_scenario(write(tmp_path, data))


def test_not_yaml_and_unknown_builtin(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("name: [unclosed")
    with pytest.raises(ScenarioError, match="not valid YAML"):
        load_scenario(p)
    with pytest.raises(ScenarioError, match="not a built-in"):
        load_scenario("no-such-scenario")


def test_run_writes_results_and_thresholds_set_the_exit_code(tmp_path):
    path = write(tmp_path, TINY)
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out)]) == 0
    files = sorted(p.name for p in out.glob("*.json"))
    assert files == ["tiny__fixed__r0.json", "tiny__fixed__r1.json", "tiny__prefix__r0.json", "tiny__prefix__r1.json"]
    result = json.loads((out / "tiny__prefix__r0.json").read_text())
    assert result["clock"] == "virtual" and result["completed"] == 12
    assert result["num_zero_progress_preemptions"] > 0
    assert (out / "tiny__prefix__r0.steps.jsonl").exists()
    # compare over the written files: a failing threshold gives exit code 1.
    paths = [str(p) for p in out.glob("*.json")]
    assert main(["compare", *paths, "--threshold", "num_zero_progress_preemptions[fixed] == 0"]) == 0
    assert main(["compare", *paths, "--threshold", "num_zero_progress_preemptions[prefix] == 0"]) == 1


def test_set_override_and_failing_threshold_exit_one(tmp_path):
    path = write(tmp_path, TINY)
    code = main(
        [
            "run",
            str(path),
            "--out",
            str(tmp_path / "o"),
            "--repeats",
            "1",
            "--set",
            "thresholds=['num_preemptions[fixed] > 1000000']",
        ]
    )
    assert code == 1


def test_bad_set_is_a_clear_error(tmp_path, capsys):
    path = write(tmp_path, TINY)
    assert main(["run", str(path), "--set", "cluster.decode.engine.max_num_seqs=0"]) == 2
    assert capsys.readouterr().err == (
        "error: --set cluster.decode.engine.max_num_seqs: cluster.decode.engine.max_num_seqs=0: "
        "Input should be greater than or equal to 1\n"
    )


def test_thresholds_are_checked_at_load(tmp_path):
    data = json.loads(json.dumps(TINY))
    data["thresholds"] = ["num_preemptions[nope] == 0"]
    with pytest.raises(ScenarioError, match="names variant 'nope'"):
        load_scenario(write(tmp_path, data))
    data["thresholds"] = ["num_preemptions[fixed] =="]
    with pytest.raises(ScenarioError, match="thresholds"):
        load_scenario(write(tmp_path, data))
