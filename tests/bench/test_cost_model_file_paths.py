"""Where a preset file named by `cluster.cost_model` is looked for: in a
scenario file, its directory (as trace.path and empirical lengths' path are);
given with `--set`, the working directory (as any shell argument is), also
on a built-in scenario."""

from __future__ import annotations

import json

import pytest
import yaml

from bench.commands.run_inputs import parse_set
from bench.scenario import ScenarioError, load_scenario
from tests.bench.test_bad_input import BASE

PRESET = {"base_ms": 5.0, "prefill_ms_per_token": 0.08, "decode_ms_per_token": 0.3, "context_ms_per_ktoken": 0.05}


def _preset(path, base_ms):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**PRESET, "base_ms": base_ms}))


def _base_ms(scenario):
    return {v: scenario.cluster(v).cost().base_ms for v in scenario.variant_names}


def test_a_scenario_file_names_a_preset_beside_it(tmp_path, monkeypatch):
    _preset(tmp_path / "exp" / "fitted.json", 7.0)
    _preset(tmp_path / "fitted.json", 9.0)  # in the working directory: not the one meant
    doc = {**BASE, "cluster": {**BASE["cluster"], "cost_model": "fitted.json"}}
    (tmp_path / "exp" / "s.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    monkeypatch.chdir(tmp_path)
    assert set(_base_ms(load_scenario("exp/s.yaml")).values()) == {7.0}


def test_a_set_preset_is_the_working_directorys_also_on_a_built_in_scenario(tmp_path, monkeypatch):
    _preset(tmp_path / "mine.json", 11.0)
    monkeypatch.chdir(tmp_path)
    overrides = parse_set(["cluster.cost_model=mine.json"])
    assert overrides == {"cluster.cost_model": str(tmp_path / "mine.json")}
    scenario = load_scenario("cascade-inproc").with_overrides(overrides)
    assert set(_base_ms(scenario).values()) == {11.0}


def test_a_missing_preset_names_where_it_was_looked_for(tmp_path):
    doc = {**BASE, "cluster": {**BASE["cluster"], "cost_model": "nope.json"}}
    path = tmp_path / "exp" / "s.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    with pytest.raises(ScenarioError, match=f"cannot read the preset file .*{tmp_path / 'exp' / 'nope.json'}"):
        load_scenario(str(path))


@pytest.mark.parametrize(
    ("item", "expected"),
    [
        ("workload.prompt_len={kind: empirical, path: lens.csv}", {"kind": "empirical", "path": "CWD/lens.csv"}),
        ("trace.path=t.jsonl", "CWD/t.jsonl"),
        ("trace.path=/abs/t.jsonl", "/abs/t.jsonl"),
        ("cluster.cost_model=llama-3.1-8b-h100", "llama-3.1-8b-h100"),  # a name, not a file
    ],
)
def test_set_makes_relative_file_paths_absolute(tmp_path, monkeypatch, item, expected):
    monkeypatch.chdir(tmp_path)
    (value,) = parse_set([item]).values()
    assert json.loads(json.dumps(value).replace(str(tmp_path), "CWD")) == expected
