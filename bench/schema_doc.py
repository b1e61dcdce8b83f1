"""The scenario format reference, generated from the pydantic models that
validate it: every key, its type, default, allowed values, bounds and units,
and its doc: the setting's declaration (engine/setting.py) or the comment
the code gives the field. `docs/scenario-reference.md` is this
module's output (`disagg-sim schema > docs/scenario-reference.md`), and a
test fails when the two differ, so the reference cannot drift from the code.
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from typing import Any, Literal

from annotated_types import Ge, Gt, Le, Lt, MaxLen, MinLen
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from cluster.cost_settings import CostModelSettings, FrontEndSettings, RooflineSettings
from cluster.engine_settings import EngineSettings, NodeGroup, SamplerSettings
from cluster.kv_transfer import KVTransferSettings
from cluster.link_settings import LinkSettings, LinksSpec
from cluster.routing_settings import RoutingWeights
from cluster.spec import ClusterSpec
from engine.cost_model import cost_model_names

from .scenario_file import SLO, Best, Chaos, Fault, Report, ScenarioFile, TraceSource, Variant
from .workloads.arrivals import AllAtOnceArrivals, ConstantArrivals, GammaArrivals, PoissonArrivals
from .workloads.lengths import (
    EmpiricalLengths,
    FixedLength,
    LognormalLengths,
    NormalLengths,
    ShareGPTLikeLengths,
    UniformLengths,
)
from .workloads.priorities import ChoicePriority, FixedPriority
from .workloads.spec import WorkloadSpec

# (heading, key path as written in a scenario, model), in reading order.
SECTIONS: list[tuple[str, str, type[BaseModel]]] = [
    ("Top level", "", ScenarioFile),
    ("Variants", "variants[]", Variant),
    ("Faults", "faults[]", Fault),
    ("Chaos", "chaos", Chaos),
    ("Report", "report", Report),
    ("Latency targets", "report.slo", SLO),
    ("Best variant", "report.best", Best),
    ("Trace replay", "trace", TraceSource),
    ("Cluster", "cluster", ClusterSpec),
    ("Node groups", "cluster.prefill / cluster.decode", NodeGroup),
    ("Routing weights", "cluster.routing_weights", RoutingWeights),
    ("Engine settings", "cluster.{prefill,decode}.engine", EngineSettings),
    ("Links", "cluster.links", LinksSpec),
    ("One link", "cluster.links.{proxy,kv,stage}", LinkSettings),
    ("Sampler", "cluster.sampler", SamplerSettings),
    ("P/D hand-off", "cluster.kv_transfer", KVTransferSettings),
    ("Custom cost model", "cluster.cost_model", CostModelSettings),
    ("Roofline cost model", "cluster.cost_model", RooflineSettings),
    ("Front end", "cluster.front_end", FrontEndSettings),
    ("Synthetic workload", "workload", WorkloadSpec),
    ("Length `kind: fixed`", "workload.{prompt_len,output_len}", FixedLength),
    ("Length `kind: uniform`", "workload.{prompt_len,output_len}", UniformLengths),
    ("Length `kind: normal`", "workload.{prompt_len,output_len}", NormalLengths),
    ("Length `kind: lognormal`", "workload.{prompt_len,output_len}", LognormalLengths),
    ("Length `kind: sharegpt_like`", "workload.{prompt_len,output_len}", ShareGPTLikeLengths),
    ("Length `kind: empirical`", "workload.{prompt_len,output_len}", EmpiricalLengths),
    ("Arrivals `kind: poisson`", "workload.arrival", PoissonArrivals),
    ("Arrivals `kind: gamma`", "workload.arrival", GammaArrivals),
    ("Arrivals `kind: constant`", "workload.arrival", ConstantArrivals),
    ("Arrivals `kind: all_at_once`", "workload.arrival", AllAtOnceArrivals),
    ("Priority `kind: fixed`", "workload.priority", FixedPriority),
    ("Priority `kind: choice`", "workload.priority", ChoicePriority),
]

INTRO = """# Scenario file reference

Generated from the code (`bench/schema_doc.py`) by `disagg-sim schema`; a
test keeps it equal to the code. Every key, its type, default, allowed
values and units. Anything not listed is refused, with a "did you mean".

Conventions:
- Units are in the key's name: `_ms` milliseconds, `_s` seconds, `_MBps`
  decimal megabytes per second (10^6 B/s); lengths are tokens. Times are run
  seconds: virtual in-process, wall seconds on Ray.
- Numbers must be finite: `.inf` and `.nan` are refused, except an outage's
  end (`.inf`: down for the rest of the run).
- `variants[].set` and `matrix` values are dotted keys into this document,
  e.g. `cluster.decode.engine.preemption_guard: fixed`; `--set KEY=VALUE` on
  the command line takes the same keys (and is refused where a variant sets
  the same key). A matrix crosses its axes in order and joins the labels
  with `+` into variant names (`prefix+d20`).
- `prompt_len` / `output_len` may be a plain integer (a fixed length);
  `priority` may be a plain integer (a fixed priority).
- A scenario is refused at load when a node's KV pool cannot hold one
  `max_model_len` request (`num_gpu_blocks * block_size >= max_model_len`,
  vLLM's start-up check), or when a prompt is longer than `max_model_len`.
- Trace files: Mooncake JSONL (`timestamp` ms, `input_length`,
  `output_length`, optional `hash_ids`) or CSV with a header
  (`arrival_time` s, `prompt_len`, `output_len`; optional `request_id`,
  `priority`). Paths (a trace, empirical lengths, a `cost_model` preset
  file) are relative to the scenario file's directory; a relative path
  given with `--set` is the working directory's.
"""


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin is Literal:
        return " | ".join(repr(a).replace("'", '"') for a in args)
    if origin in (typing.Union, types.UnionType):
        names = []
        for a in args:
            if a is type(None):
                names.append("null")
            elif isinstance(a, type) and issubclass(a, BaseModel):
                kind = a.model_fields.get("kind")
                names.append(f"{{kind: {kind.default}}}" if kind is not None else "mapping")
            else:
                names.append(_type_name(a))
        return " | ".join(names)
    if origin in (list, tuple):
        inner = ", ".join(_type_name(a) for a in args if a is not Ellipsis)
        return f"list of [{inner}]" if origin is tuple else f"list of {inner}"
    if origin is dict:
        return "mapping"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "mapping"
    return getattr(annotation, "__name__", str(annotation))


def _bounds(info: FieldInfo) -> str:
    parts = []
    for m in info.metadata:
        if isinstance(m, Ge):
            parts.append(f">= {m.ge:g}" if isinstance(m.ge, float) else f">= {m.ge:,}")
        elif isinstance(m, Gt):
            parts.append(f"> {m.gt:g}")
        elif isinstance(m, Le):
            parts.append(f"<= {m.le:g}" if isinstance(m.le, float) else f"<= {m.le:,}")
        elif isinstance(m, Lt):
            parts.append(f"< {m.lt:g}")
        elif isinstance(m, MinLen) and m.min_length > 0:
            parts.append(f"length >= {m.min_length}")
        elif isinstance(m, MaxLen):
            parts.append(f"length <= {m.max_length:,}")
        elif getattr(m, "pattern", None):
            parts.append(f"matches `{m.pattern}`")
    return ", ".join(parts)


def _default(info: FieldInfo) -> str:
    if info.default is PydanticUndefined and info.default_factory is None:
        return "**required**"
    value = info.default_factory() if info.default_factory is not None else info.default  # type: ignore[call-arg]
    if isinstance(value, BaseModel):
        return "(see below)"
    if value is None:
        return "null"
    if isinstance(value, str):
        return f'"{value}"'
    return f"`{value}`"


def _unit(name: str) -> str:
    if name.endswith("_ms"):
        return "ms"
    if name.endswith("_s") or name in ("at", "start_time"):
        return "s"
    if name.endswith("_MBps"):
        return "MB/s"
    if name in ("rate",):
        return "requests/s"
    if name.endswith("_len") or name in ("value", "low", "high", "min", "max", "mean", "std", "max_model_len"):
        return "tokens"
    return ""


def _comments(model: type[BaseModel]) -> dict[str, str]:
    """The `#` comments right above each field (and on its line), from the source."""
    try:
        lines = inspect.getsource(model).splitlines()
    except (OSError, TypeError):
        return {}
    out: dict[str, str] = {}
    pending: list[str] = []
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("#").strip())
            continue
        m = re.match(r"\s+(\w+)\s*:", line)
        if m and m.group(1) in model.model_fields:
            inline = line.split("  # ", 1)[1].strip() if "  # " in line else ""
            out[m.group(1)] = " ".join([*pending, inline]).strip()
        pending = []
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown() -> str:
    out = [INTRO]
    for title, path, model in SECTIONS:
        out.append(f"## {title}\n")
        out.append(f"Key: `{path}`\n" if path else "Keys of the document itself.\n")
        doc = inspect.getdoc(model)
        if doc and model.__module__.startswith(("bench", "cluster")) and not doc.startswith("!"):
            out.append(_cell(" ".join(doc.split())) + "\n")
        comments = _comments(model)
        out.append("| key | type | default | allowed | unit | notes |")
        out.append("|---|---|---|---|---|---|")
        for name, info in model.model_fields.items():
            allowed = _bounds(info)
            if name == "cost_model" and model is ClusterSpec:
                allowed = (
                    ", ".join(f'"{n}"' for n in cost_model_names())
                    + ", a preset file (*.json), or a mapping (Custom / Roofline cost model)"
                )
            row = [
                f"`{name}`",
                _cell(_type_name(info.annotation)),
                _cell(_default(info)),
                _cell(allowed),
                _unit(name),
                # A setting declared on a runtime class carries its doc (engine/setting.py).
                _cell(info.description or comments.get(name, "")),
            ]
            out.append("| " + " | ".join(row) + " |")
        out.append("")
    return "\n".join(out)


def metric_reference() -> str:
    """The metric names results carry (for thresholds and report.metrics), for the built-in topologies."""
    from .metric_names import known_metric_names

    specs = [
        ClusterSpec(),
        ClusterSpec.model_validate({"prefill": {"count": 0}, "decode": {"engine": {"engine": "v0"}}}),
    ]
    names = sorted(known_metric_names(specs, [50, 90, 99], slo=True))
    return (
        "## Metric names\n\n"
        "What thresholds (`metric[variant]`) and `report.metrics` may name, for the default percentiles "
        "(50, 90, 99: `p<P>_<metric>_ms` follows `report.percentiles`) and both engines "
        "(`request_goodput` and `slo_attainment_pct` with `report.slo` only). "
        "`disagg-sim schema --metrics SCENARIO` lists a scenario's own.\n\n"
        + "\n".join(f"- `{n}`" for n in names)
        + "\n"
    )


def reference() -> str:
    """The whole of docs/scenario-reference.md."""
    return render_markdown() + "\n" + metric_reference()


def scenario_json_schema() -> dict:
    return ScenarioFile.model_json_schema()
