"""The `vllm_version` setting: a node names the vLLM release it models; only
releases the conformance harness found identical to the model are accepted."""

from __future__ import annotations

import pytest

from cluster.engine_settings import EngineSettings
from engine.config import MODELLED_VLLM_VERSIONS, SchedulerConfig, check_vllm_version


def test_default_is_the_release_the_engine_core_models():
    assert SchedulerConfig().vllm_version == "0.33.0"
    assert EngineSettings().scheduler_config().vllm_version == "0.33.0"


@pytest.mark.parametrize("version", MODELLED_VLLM_VERSIONS)
def test_every_modelled_release_is_accepted_and_reaches_the_scheduler(version):
    assert EngineSettings(vllm_version=version).scheduler_config().vllm_version == version


def test_a_release_with_other_behaviour_is_refused_with_the_allowed_values():
    with pytest.raises(ValueError) as info:
        check_vllm_version("0.29.0")
    text = str(info.value)
    assert "vllm_version='0.29.0' is invalid; allowed: " in text
    assert all(repr(v) in text for v in MODELLED_VLLM_VERSIONS)
    assert "preemption_guard='prefix'" in text
    with pytest.raises(ValueError, match="vllm_version='0.29.0' is invalid"):
        EngineSettings(vllm_version="0.29.0")


def test_a_v0_node_refuses_a_v1_release():
    with pytest.raises(ValueError, match="vllm_version='0.32.0' is a v1 setting|vllm_version='0.32.0' is invalid"):
        EngineSettings(engine="v0", vllm_version="0.32.0")
