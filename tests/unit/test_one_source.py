"""One source per setting (engine/setting.py): a setting is declared once —
name, type, default, bounds, doc — on the plain dataclass that uses it, and
the scenario schema derives its field from that declaration
(`from_setting`). These tests fail when a setting is declared twice: in the
schema and again on a runtime class, or validated again by the class that
receives the already-valid value."""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import typing

import pytest
from pydantic import BaseModel, Field, ValidationError
from pydantic.fields import FieldInfo

from bench.schema_doc import SECTIONS
from cluster.settings_base import DerivedFrom, StrictModel, from_setting
from engine.setting import SETTING_KEY, Setting, declaration, setting

# Where the engine and the runtimes keep their configuration classes.
RUNTIME_PACKAGES = ["engine", "connector", "node", "proxy", "prefill_node", "decode_node", "cluster"]

# A schema key that shares its name with a runtime field of another meaning.
# Each entry says why the two are not one setting declared twice.
HOMONYMS = {
    ("ScenarioFile", "name"): "the scenario's name, not a KV connector preset's (KVTransferTiming.name)",
    ("Variant", "name"): "a variant's name, not a KV connector preset's (KVTransferTiming.name)",
    ("CostModelSettings", "name"): "the cost model's name, not a KV connector preset's (KVTransferTiming.name)",
    ("RooflineSettings", "name"): "the cost model's name, not a KV connector preset's (KVTransferTiming.name)",
    ("ScenarioFile", "trace"): "a trace file to replay, not a run's event trace (RunResult.trace)",
    ("ScenarioFile", "seed"): "the run's seed; ChaosConfig.seed seeds the fault plan",
    ("SamplerSettings", "seed"): "the sampler's seed; NodeSpec.sampler_seed is it plus the run's",
    ("WorkloadSpec", "seed"): "the workload's seed; ChaosConfig.seed seeds the fault plan",
    ("TraceSource", "time_scale"): "scales a trace's arrival times; NodeSettings.time_scale scales step time",
    ("ClusterSpec", "front_end"): "the API server's settings; ProxySettings.front_end is the model built from them",
    ("ClusterSpec", "sampler"): "the sampler's settings; NodePorts.sampler is the sampler object",
    ("NodeGroup", "engine"): "the engine settings mapping; NodeSpec.engine is the scheduler's version (v1 / v0)",
    ("SamplerSettings", "ignore_eos"): "the cluster's default; a request's own ignore_eos overrides it",
    ("WorkloadSpec", "priority"): "how priorities are drawn; a request's priority is one draw",
}

# A runtime field with a default that shares a declared setting's name and
# is not that declaration: why it is not the same setting declared twice.
OTHER_DEFAULTS = {
    ("engine.v0.config.SchedulerConfig", "max_num_seqs"): "vLLM 0.5.3's own default (the v0 oracle's shape)",
    ("engine.v0.config.SchedulerConfig", "max_num_batched_tokens"): "vLLM 0.5.3's own default (None: by chunking)",
    ("engine.v0.config.SchedulerConfig", "max_model_len"): "vLLM 0.5.3's own default (the v0 oracle's shape)",
    ("engine.v0.config.SchedulerConfig", "enable_chunked_prefill"): "vLLM 0.5.3's own default (off)",
    ("engine.v0.config.SchedulerConfig", "preemption_mode"): "vLLM 0.5.3's form (None: auto) of NodeSpec's",
    ("engine.v0.config.CacheConfig", "block_size"): "vLLM 0.5.3's own default (the v0 oracle's shape)",
    ("engine.v0.config.CacheConfig", "num_cpu_blocks"): "vLLM 0.5.3's own default (no swap space)",
    ("engine.v0.config.CacheConfig", "watermark"): "vLLM 0.5.3's block manager's 0.01, not the v1 admission setting",
    ("engine.config.ParallelConfig", "pipeline_parallel_size"): "vLLM's own default; nodes pass NodeSpec's",
    ("cluster.chaos.Fault", "loss"): "a chaos fault's drop probability, not a link's setting",
    **{
        ("connector.grpc.pull_config.PullerConfig", name): "the standalone gRPC puller's own defaults (longer, "
        "for wall-clock transfers); its bounds are KVFaultPolicy's declaration (check_declared)"
        for name in ("attempt_timeout_s", "deadline_s", "backoff_initial_s", "backoff_max_s", "max_concurrent_pulls")
    },
}

# Settings still declared twice, each with the reason; the test fails when
# one becomes one source and stays listed here, so the list only shrinks.
NOT_YET_ONE_SOURCE: dict[tuple[str, str], str] = {}


def scenario_models() -> list[type[BaseModel]]:
    return [model for _, _, model in SECTIONS]


def runtime_dataclasses() -> list[type]:
    out = []
    for package in RUNTIME_PACKAGES:
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, package + "."):
            if "_pb2" in info.name:
                continue
            module = importlib.import_module(info.name)
            out += [
                v
                for v in vars(module).values()
                if isinstance(v, type) and dataclasses.is_dataclass(v) and v.__module__ == info.name
            ]
    return out


def _derived_from(info: FieldInfo) -> DerivedFrom | None:
    return next((m for m in info.metadata if isinstance(m, DerivedFrom)), None)


def _declares(f: dataclasses.Field) -> bool:
    """A runtime field declares a setting when it carries a default or a `setting()`."""
    return (
        SETTING_KEY in f.metadata
        or f.default is not dataclasses.MISSING
        or f.default_factory is not dataclasses.MISSING
    )


def declared_twice(models: list[type[BaseModel]], classes: list[type]) -> list[str]:
    """Schema keys declared by hand while a runtime class declares the same name."""
    declared_at: dict[str, list[str]] = {}
    for cls in classes:
        for f in dataclasses.fields(cls):
            if _declares(f):
                declared_at.setdefault(f.name, []).append(cls.__qualname__)
    twice = []
    for model in models:
        for name, info in model.model_fields.items():
            key = (model.__name__, name)
            if _derived_from(info) is None and name in declared_at and key not in HOMONYMS:
                if key not in NOT_YET_ONE_SOURCE:
                    twice.append(f"{model.__name__}.{name} (also {', '.join(declared_at[name])})")
            elif key in NOT_YET_ONE_SOURCE:
                twice.append(f"{model.__name__}.{name} is one source now: remove it from NOT_YET_ONE_SOURCE")
    return twice


def test_no_setting_is_declared_in_the_schema_and_again_on_a_runtime_class():
    assert declared_twice(scenario_models(), runtime_dataclasses()) == []


def test_no_declared_setting_has_a_second_default_elsewhere():
    declared = {
        mark.name: mark.owner
        for model in scenario_models()
        for info in model.model_fields.values()
        if (mark := _derived_from(info)) is not None
    }
    twice = [
        f"{cls.__module__}.{cls.__qualname__}.{f.name} (declared on {declared[f.name].__qualname__})"
        for cls in runtime_dataclasses()
        for f in dataclasses.fields(cls)
        if f.name in declared
        and cls is not declared[f.name]
        and SETTING_KEY not in f.metadata
        and _declares(f)
        and (f"{cls.__module__}.{cls.__qualname__}", f.name) not in OTHER_DEFAULTS
    ]
    assert twice == []


def test_every_derived_field_carries_its_declaration():
    """Default, bounds and doc are the declaration's (a schema field may only
    change the default to its own form, e.g. a list for a tuple)."""
    for model in scenario_models():
        for name, info in model.model_fields.items():
            mark = _derived_from(info)
            if mark is None:
                continue
            default, declared = declaration(mark.owner, mark.name)
            where = f"{model.__name__}.{name} <- {mark}"
            assert info.description == declared.doc and declared.doc, where
            if info.default_factory is None:
                # None: the scenario's "take the preset's / the measured value" form.
                required = default is dataclasses.MISSING
                assert info.is_required() if required else info.default in (default, None), where
            # The declared type, or the scenario's form of it: "auto", null (the preset's), a list for a tuple.
            declared_type = typing.get_type_hints(mark.owner)[mark.name]
            forms = {declared_type, declared_type | None, declared_type | typing.Literal["auto"]}
            assert info.annotation in forms or info.default_factory is not None, where
            bounds = {op: getattr(m, op) for m in info.metadata for op in ("ge", "gt", "le", "lt") if hasattr(m, op)}
            # Every declared bound is the schema's, unless a wrap validator applies them (int or "auto").
            assert bounds in (declared.bounds(), {}), where


def test_every_declared_setting_is_reachable_from_the_schema():
    derived = {
        (mark.owner, mark.name)
        for model in scenario_models()
        for info in model.model_fields.values()
        if (mark := _derived_from(info)) is not None
    }
    unreachable = [
        f"{cls.__qualname__}.{f.name}"
        for cls in runtime_dataclasses()
        for f in dataclasses.fields(cls)
        if SETTING_KEY in f.metadata and (cls, f.name) not in derived
    ]
    assert unreachable == []


def test_a_class_that_declares_settings_does_not_validate_them_again():
    validating = [
        cls.__qualname__
        for cls in runtime_dataclasses()
        if any(SETTING_KEY in f.metadata for f in dataclasses.fields(cls)) and "__post_init__" in vars(cls)
    ]
    assert validating == []


# -- the mechanism, on a class of its own ---------------------------------------


def _positive_even(v: int) -> None:
    if v % 2:
        raise ValueError(f"n={v} is invalid; allowed: an even number")


@dataclasses.dataclass(frozen=True)
class _Runtime:
    n: int = setting(4, doc="An even count.", ge=2, le=10, check=_positive_even)
    label: str = "x"


class _Schema(StrictModel):
    n: int = from_setting(_Runtime, "n")


def test_from_setting_gives_the_schema_the_declared_default_bounds_doc_and_rule():
    assert _Schema().n == 4
    assert _Schema.model_fields["n"].description == "An even count."
    for bad, message in [(0, "greater than or equal to 2"), (12, "less than or equal to 10"), (5, "an even number")]:
        with pytest.raises(ValidationError, match=message):
            _Schema(n=bad)
    assert _Runtime(n=5).n == 5  # the runtime class trusts what it is given


def test_from_setting_refuses_a_name_the_class_does_not_declare():
    with pytest.raises(KeyError, match=r"_Runtime declares no setting 'label'; it declares \['n'\]"):
        from_setting(_Runtime, "label")


def test_the_check_fails_when_a_setting_is_declared_twice():
    """The rule itself: a schema that repeats `_Runtime.n` by hand is caught;
    the derived one is not."""

    class Twice(StrictModel):
        n: int = Field(4, ge=2, le=10)

    assert declared_twice([Twice], [_Runtime]) == ["Twice.n (also _Runtime)"]
    assert declared_twice([_Schema], [_Runtime]) == []
    assert isinstance(declaration(_Runtime, "n")[1], Setting)
    assert typing.get_type_hints(_Schema)["n"] is int
