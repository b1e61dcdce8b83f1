"""The layout's rules, checked on the source: dependencies point one way
(engine <- connector <- node <- the three roles <- cluster <- bench), the
node roles never import each other nor the proxy, only the runtimes and what
users touch import the proxy, `cluster` never imports `bench`, the roles,
the proxy and the shared node package do no I/O, and both runtimes run the
very same role classes."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from cluster.inproc import InProcCluster
from cluster.wall.node_host import WallNodeHost, WallNodeSettings
from decode_node.node import DecodeNode
from prefill_node.node import PrefillNode
from tests.e2e_ray.conftest import make_spec

ROOT = Path(__file__).resolve().parents[2]
FIRST_PARTY = {"engine", "connector", "node", "prefill_node", "decode_node", "proxy", "cluster", "bench", "protos"}
IO_MODULES = {"asyncio", "socket", "threading", "grpc", "ray", "time", "subprocess", "selectors"}

# package -> first-party packages it may import
ALLOWED = {
    "engine": {"engine"},
    "connector": {"engine", "connector", "protos"},
    "node": {"engine", "connector", "node"},
    "prefill_node": {"engine", "connector", "node", "prefill_node"},
    "decode_node": {"engine", "connector", "node", "decode_node"},
    # The proxy speaks to nodes in node messages only: no KV connector, no node role.
    "proxy": {"engine", "node", "proxy"},
    # The runtimes drive everything below them and never reach up into `bench`.
    "cluster": {"engine", "connector", "node", "prefill_node", "decode_node", "proxy", "cluster", "protos"},
}


def imports_of(package: str) -> dict[str, set[str]]:
    """module path -> top-level names it imports (relative imports resolved to `package`)."""
    out = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        if "_pb2" in path.name:
            continue
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                names.add(package if node.level else (node.module or "").split(".")[0])
        out[str(path.relative_to(ROOT))] = names
    return out


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_dependencies_point_one_way(package):
    for module, names in imports_of(package).items():
        above = (names & FIRST_PARTY) - ALLOWED[package]
        assert not above, f"{module} imports {sorted(above)}"


@pytest.mark.parametrize("package", ["engine", "node", "prefill_node", "decode_node", "proxy"])
def test_the_engine_the_roles_and_the_node_package_do_no_io(package):
    for module, names in imports_of(package).items():
        assert not names & IO_MODULES, f"{module} imports {sorted(names & IO_MODULES)}"


def test_both_runtimes_run_the_same_role_classes():
    spec = make_spec()
    cluster = InProcCluster(spec)
    assert type(cluster.nodes["prefill-0"]) is PrefillNode and type(cluster.nodes["decode-0"]) is DecodeNode
    settings = WallNodeSettings(node=spec.node_settings())
    (_, prefill_spec, _), (_, decode_spec, _) = spec.node_specs()
    assert type(WallNodeHost("prefill", prefill_spec, settings).node) is PrefillNode
    assert type(WallNodeHost("decode", decode_spec, settings).node) is DecodeNode


def _module_graph() -> dict[str, set[str]]:
    """First-party module -> the first-party modules it imports anywhere in
    its source (at the top, under TYPE_CHECKING or inside a function)."""
    paths = {}
    for package in sorted(FIRST_PARTY):
        for path in sorted((ROOT / package).rglob("*.py")):
            if "_pb2" in path.name:
                continue
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            paths[".".join(parts)] = path
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        base_parts = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    up = base_parts[: len(base_parts) - (node.level - 1)]
                    base = ".".join(up + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                for a in node.names:
                    deps.add(f"{base}.{a.name}" if f"{base}.{a.name}" in paths else base)
        graph[module] = {d for d in deps if d in paths and d != module}
    return graph


def test_no_module_imports_itself_through_others():
    """No import circle anywhere (a mixin importing its host class for `self`
    types was the usual cause): Tarjan's strongly connected components of
    the module graph are all single modules."""
    graph = _module_graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert circles == []
