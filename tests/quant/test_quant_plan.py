"""The plan and layout against the published checkpoint facts (kimi-linear.md §1.8, §2.2, §2.3, §9)."""

from collections import Counter

import pytest

from engine.model import preset
from engine.model.checkpoint_spec import checkpoint_tensors
from engine.quant.budget import decode_bytes_per_token, stored_nbytes
from engine.quant.plan import PLANS, PlanError, classify, make_plan

FULL = preset("full")
TENSORS = {spec.name: spec for spec in checkpoint_tensors(FULL)}


def _stored_total(plan) -> int:
    return sum(
        stored_nbytes(spec, plan.decide(name, spec.shape).precision, plan) for name, spec in TENSORS.items()
    )


def test_layout_matches_the_real_checkpoint():
    assert len(TENSORS) == 20_493
    assert sum(spec.nbytes for spec in TENSORS.values()) == 98_245_528_576
    assert FULL.full_attn_layers == (3, 7, 11, 15, 19, 23, 26)
    assert TENSORS["model.layers.5.self_attn.A_log"].shape == (1, 1, 32, 1)
    assert TENSORS["model.layers.26.block_sparse_moe.experts.255.w2.weight"].shape == (2304, 1024)


def test_default_plan_classes_and_bytes():
    plan = make_plan("default")
    decisions = Counter(plan.decide(n, s.shape).quantized for n, s in TENSORS.items())
    assert decisions == {True: 20_150, False: 343}
    assert _stored_total(plan) == 28_803_304_448


def test_shared_bf16_profile_costs_the_published_delta():
    assert _stored_total(make_plan("shared-bf16")) - _stored_total(make_plan("default")) == 264_536_064


@pytest.mark.parametrize(
    "head,head_bytes", [("bf16", 163840 * 2304 * 2), ("int8", 163840 * 2304 + 163840 * 72 * 2)]
)
def test_lm_head_precision_is_a_plan_option(head, head_bytes):
    plan = make_plan("default", lm_head=head)
    spec = TENSORS["lm_head.weight"]
    assert stored_nbytes(spec, plan.decide("lm_head.weight", spec.shape).precision, plan) == head_bytes


EMBEDDING = ("model.embed_tokens.weight", TENSORS["model.embed_tokens.weight"].shape)


def test_every_plan_keeps_the_sensitive_tensors():
    for plan in PLANS.values():
        # The embedding is kept by every plan except the ones named for storing it as INT4.
        assert plan.decide(*EMBEDDING).quantized == plan.name.startswith("int4-embed"), plan.name
        for name in [
            "model.layers.3.block_sparse_moe.gate.weight",
            "model.layers.0.self_attn.A_log",
            "model.layers.0.self_attn.f_b_proj.weight",
            "model.layers.3.self_attn.kv_a_layernorm.weight",
            "model.norm.weight",
        ]:
            assert not plan.decide(name, TENSORS[name].shape).quantized, (plan.name, name)


def test_unknown_tensor_is_refused():
    with pytest.raises(PlanError, match="no quantisation rule"):
        classify("model.layers.0.self_attn.mystery_proj.weight")


def test_group_size_must_divide_quantised_inputs_and_be_a_power_of_two():
    with pytest.raises(PlanError, match="power of two"):
        make_plan("default", group_size=48)
    plan = make_plan("default", group_size=2048)
    with pytest.raises(PlanError, match="not a multiple of group size"):
        plan.decide("model.layers.0.self_attn.q_proj.weight", (4096, 2304))


def test_bytes_per_token_recount():
    """Per-token reads at batch 1 (kimi-linear.md §9): experts 931.6 MB, head 755.0, attention 534.1, ..."""
    tb = decode_bytes_per_token(FULL, make_plan("default"))
    c = tb.components
    per_expert = 3 * (1024 * 2304 // 2 + 1024 * 72 * 2)
    assert c["routed_expert"] == 26 * 8 * per_expert
    assert c["shared_expert"] == 26 * per_expert
    assert c["lm_head"] == 163840 * 2304 * 2
    assert c["embedding"] == 2304 * 2
    assert c["state:kda_recurrent"] == 2 * 20 * 32 * 128 * 128 * 4
    assert round((c["routed_expert"] + c["shared_expert"]) / 1e6, 1) == 931.6
    assert round(c["attention_projection"] / 1e6, 1) == round(424.7 + 109.4, 1)
    assert round(tb.weights / 1e6) == 2377  # the recount's 2,374.3 MB plus norms, convs, biases
    assert tb.total - tb.weights == c["state:kda_recurrent"] + c["state:kda_conv"] + c["state:mla_cache"]


def test_bytes_per_token_follow_plan_and_context():
    base = decode_bytes_per_token(FULL, make_plan("default"))
    int4_head = decode_bytes_per_token(FULL, make_plan("int4-head"))
    assert base.total - int4_head.total == 163840 * 2304 * 2 - (163840 * 1152 + 163840 * 72 * 2)
    long = decode_bytes_per_token(FULL, make_plan("default"), context_tokens=1000)
    assert long.total - base.total == 7 * 1000 * 576 * 2


def test_rounding_is_a_plan_option_recorded_in_its_json():
    plan = make_plan("int4-embed", rounding="mse")
    assert plan.rounding == "mse" and make_plan("default").rounding == "signed"
    assert PLANS["int4-embed-mse"].precisions == PLANS["int4-embed"].precisions
    assert type(plan).from_json(plan.to_json()) == plan
    legacy = {k: v for k, v in plan.to_json().items() if k != "rounding"}  # artifacts before the option
    assert type(plan).from_json(legacy).rounding == "absmax"
    with pytest.raises(PlanError, match="rounding"):
        make_plan("default", rounding="stochastic")
