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
    with pytest.raises(ValueError, match="base_ms=-1"):
        CostModel("x", -1, 0, 0, 0)
