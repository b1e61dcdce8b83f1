import random

import pytest

from engine.cost_model import COST_MODELS, CostModel, StepShape, get_cost_model


def test_linear_step_time_is_exact():
    m = CostModel("t", base_ms=2.0, prefill_ms_per_token=0.5, decode_ms_per_token=0.25, context_ms_per_ktoken=1.0)
    shape = StepShape(prefill_tokens=100, decode_tokens=8, context_tokens=4000, batch_size=9)
    assert m.step_time(shape) == pytest.approx((2.0 + 50.0 + 2.0 + 4.0) / 1000.0)


def test_empty_step_costs_nothing():
    assert COST_MODELS["synthetic-8b"].step_time(StepShape()) == 0.0


def test_named_sets_and_custom_dicts():
    assert get_cost_model("unit").base_ms == 1.0
    custom = get_cost_model(
        {"base_ms": 3, "prefill_ms_per_token": 0, "decode_ms_per_token": 0, "context_ms_per_ktoken": 0}
    )
    assert custom.step_time(StepShape(decode_tokens=1)) == pytest.approx(0.003)


def test_bad_cost_models_are_named():
    with pytest.raises(ValueError, match="unknown; allowed"):
        get_cost_model("nope")
    with pytest.raises(ValueError, match="unknown field"):
        get_cost_model({"base": 1})
    terms = {"prefill_ms_per_token": 0, "decode_ms_per_token": 0, "context_ms_per_ktoken": 0}
    with pytest.raises(ValueError, match=r"CostModel.base_ms=-1 is invalid; allowed: >= 0"):
        get_cost_model({"name": "x", "base_ms": -1, **terms})  # a mapping from a file, checked
    with pytest.raises(ValueError, match="base_ms is missing"):
        get_cost_model(terms)


def test_decode_step_time_is_step_time_of_the_decode_shape_bit_for_bit():
    """The steady-decode fast-forward times its steps with `decode_step_time`
    (no shape built); the plain path with `step_time`: the same floats."""
    rng = random.Random(0)
    for name in ("synthetic-8b", "synthetic-70b", "unit"):
        cm = COST_MODELS[name]
        for _ in range(2000):
            n, ctx = rng.randint(1, 1024), rng.randint(1, 4_000_000)
            assert cm.decode_step_time(n, ctx) == cm.step_time(StepShape(0, n, ctx, n, ctx, 0))
    custom = CostModel.from_dict(
        {"base_ms": 0.1, "prefill_ms_per_token": 0.3, "decode_ms_per_token": 1 / 3, "context_ms_per_ktoken": 0.7}
    )
    assert custom.decode_step_time(7, 12345) == custom.step_time(StepShape(0, 7, 12345, 7, 12345, 0))
