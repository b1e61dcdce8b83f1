"""`disagg-sim run --cluster` / `--address` with an in-process scenario
(bench/cluster_sweep.py): the combinations that cannot work are refused
with one line and exit 2, before Ray starts or anything is written."""

import pytest
import yaml

from bench.cli import main
from tests.bench.test_parallel_runs import TINY


@pytest.mark.parametrize(
    "flags,message",
    [
        (
            ["--cluster", "--jobs", "2"],
            "--cluster with --jobs 2: --cluster runs as many at once as the cluster has CPUs",
        ),
        (
            ["--cluster", "--runtime", "ray"],
            "--cluster/--address with runtime ray: a Ray run already runs on the cluster",
        ),
        (["--cluster", "--pace", "1"], "on a Ray cluster (--cluster/--address) with --pace: these watch a run"),
        (
            ["--address", "127.0.0.9:1", "--metrics-port", "0"],
            "on a Ray cluster (--cluster/--address) with --metrics-port",
        ),
    ],
)
def test_cluster_flags_that_cannot_work_are_refused(tmp_path, capsys, flags, message):
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY, sort_keys=False))
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out), *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not out.exists()


@pytest.mark.parametrize("runtime", ["inproc", "ray"])
def test_an_address_where_no_cluster_answers_is_refused_at_once(tmp_path, capsys, runtime):
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(TINY, sort_keys=False))
    # Port 1 on a loopback alias: nothing listens (Ray's own attach would retry for minutes).
    args = ["run", str(path), "--out", str(tmp_path / "out"), "--address", "127.0.0.9:1", "--runtime", runtime]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --address 127.0.0.9:1: no Ray cluster answers there (")
    assert "allowed: host:port of a running Ray cluster's head" in err and err.count("\n") == 1
    assert not list((tmp_path / "out").glob("*.json"))
