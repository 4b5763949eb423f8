import pytest
import torch
from click.testing import CliRunner

from engine.model import KimiLinearForCausalLM, preset
from engine.model.checkpoint_spec import checkpoint_tensors
from engine.model.loading import parameter_for
from engine.quant import dequantize, make_plan, quantize
from harness import figures
from harness.receipt import load_receipt, receipt_paths
from runners.accuracy import compare
from runners.cli import main
from runners.dequantized import PlanApplier, fill, stored_bytes_by_class, synthetic_source
from runners.quality_metrics import common_prefix, expert_set_agreement, forced_pass, greedy_tokens
from tests.runners.runner_support import shards_sha256

EXPERT = "model.layers.1.block_sparse_moe.experts.3.w2.weight"
NORM = "model.layers.1.input_layernorm.weight"


def _tiny(seed=3):
    with torch.device("meta"):
        model = KimiLinearForCausalLM(preset("tiny"), dtype=torch.float32)
    model = model.to_empty(device="cpu").eval()
    source = synthetic_source(seed, "cpu")
    fill(model, source)
    return model, source


def _snapshot(model):
    return {n: t.clone() for n, t in model.state_dict().items()}


def test_a_plan_stores_dequantised_values_and_the_baseline_comes_back_exactly():
    model, source = _tiny()
    baseline = _snapshot(model)
    applier = PlanApplier(model, source)
    plan = make_plan("int4-head", group_size=32)
    counts = applier.apply(plan)
    assert counts["int4"] > 0 and counts["keep"] > 0
    spec = next(s for s in checkpoint_tensors(model.config) if s.name == EXPERT)
    expected = dequantize(quantize(source.read(spec), "int4", 32, rounding=plan.rounding))
    assert torch.equal(parameter_for(model, EXPERT), expected)
    assert not torch.equal(parameter_for(model, EXPERT), source.read(spec).float())
    assert torch.equal(model.state_dict()["model.layers.1.input_layernorm.weight"], baseline[NORM])
    head = model.state_dict()["lm_head.weight"]
    assert not torch.equal(head, baseline["lm_head.weight"])  # int4-head quantises the head
    applier.apply(make_plan("default", group_size=64))  # switching plans restores what the last one changed
    assert torch.equal(model.state_dict()["lm_head.weight"], baseline["lm_head.weight"])
    applier.apply(None)
    restored = model.state_dict()
    assert all(torch.equal(restored[n], t) for n, t in baseline.items())


def test_the_reference_against_itself_shows_no_damage_and_a_candidate_shows_some():
    model, source = _tiny()
    ids = torch.randint(0, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    ref, ref_greedy = forced_pass(model, ids), greedy_tokens(model, ids[:, :4], 5)
    samples, derived = compare(ref, forced_pass(model, ids), ref_greedy, greedy_tokens(model, ids[:, :4], 5))
    assert derived["kl_mean_nats"] == 0 and derived["kl_max_nats"] == 0
    assert derived["top1_agreement"] == 1 and derived["perplexity_delta"] == 0
    assert derived["greedy_identical_fraction"] == 1 and samples["greedy_common_prefix_tokens"] == [5, 5]
    assert samples["router_exact_set_agreement"] == [1.0] * 3  # tiny: layers 1-3 are MoE
    PlanApplier(model, source).apply(make_plan("int4-head", group_size=32))
    _, damaged = compare(ref, forced_pass(model, ids), ref_greedy, greedy_tokens(model, ids[:, :4], 5))
    assert damaged["kl_mean_nats"] > 0 and damaged["kl_max_nats"] >= damaged["kl_mean_nats"]
    assert 0 <= damaged["top1_agreement"] <= 1


def test_metric_helpers_on_hand_made_inputs():
    ref = torch.tensor([[0, 1], [2, 5], [1, 4]])
    cand = torch.tensor([[0, 1], [2, 6], [3, 7]])
    exact, overlap = expert_set_agreement(ref, cand)
    assert exact == pytest.approx(1 / 3) and overlap == pytest.approx((1 + 0.5 + 0) / 3)
    a = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 4], [9, 2, 3, 4]])
    b = torch.tensor([[1, 2, 3, 4], [1, 2, 0, 4], [1, 2, 3, 4]])
    assert common_prefix(a, b).tolist() == [4, 2, 0]


def test_stored_bytes_for_the_real_model_match_the_pinned_plan_total():
    # docs/INT4.md: `default` at G = 32 stores 28,803,304,448 tensor bytes for the real checkpoint.
    assert sum(stored_bytes_by_class(preset("full"), make_plan("default")).values()) == 28_803_304_448
    head = {name: stored_bytes_by_class(preset("full"), make_plan(name))["lm_head"] for name in ("default", "int8-head", "int4-head")}  # fmt: skip
    assert head["default"] > head["int8-head"] > head["int4-head"]


def test_accuracy_runner_writes_one_receipt_per_plan_and_group(tmp_path):
    result = CliRunner().invoke(
        main,
        ["accuracy", "--synthetic", "tiny", "--plans", "default,shared-bf16", "--groups", "32,64",
         "--sequences", "2", "--seq-len", "12", "--prompts", "2", "--prompt-len", "4", "--greedy-tokens", "4",
         "--results", str(tmp_path), "--no-regenerate"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    receipts = [load_receipt(p) for p in receipt_paths(tmp_path)]
    assert sorted(r["name"] for r in receipts) == [
        "synthetic-tiny.default.g32", "synthetic-tiny.default.g64",
        "synthetic-tiny.shared-bf16.g32", "synthetic-tiny.shared-bf16.g64",
    ]  # fmt: skip
    for r in receipts:
        assert r["suite"] == "accuracy" and "synthetic weights" in r["notes"]
        assert r["config"]["weights"] == "synthetic weights" and r["config"]["router_layers"] == [1, 2, 3]
        assert r["config"]["weights_kind"] == "random" and r["notes"].startswith("stress test")
        assert len(r["samples"]["kl_nats"]) == 2 * 11 and min(r["samples"]["kl_nats"]) >= 0
        assert len(r["samples"]["greedy_common_prefix_tokens"]) == 2
        d = r["derived"]
        assert d["kl_max_nats"] >= d["kl_mean_nats"] > 0 and 0 <= d["top1_agreement"] <= 1
        assert all(0 <= d[f"router_overlap_layer{i}"] <= 1 for i in (1, 2, 3))
        assert d["full_weight_bytes_routed_expert"] > 0 and not any(k.startswith("weight_bytes") for k in d)
    by_name = {r["name"]: r["derived"] for r in receipts}
    # shared-bf16 keeps the shared experts at their BF16 size; default stores them in 4.5 bits at G = 32.
    shared = {name: d["full_weight_bytes_shared_expert"] for name, d in by_name.items()}
    bf16_over_int4 = 2 / (0.5 + 2 / 32)  # bytes per weight: BF16 / (4-bit code + a BF16 scale per 32)
    assert shared["synthetic-tiny.shared-bf16.g32"] == pytest.approx(
        bf16_over_int4 * shared["synthetic-tiny.default.g32"]
    )

    data = figures.build_all(tmp_path)
    plans = {p["plan"]: p["gb"] for p in data["plan_weight_bytes"]["plans"]}
    assert sorted(plans) == ["default g32", "default g64", "shared-bf16 g32", "shared-bf16 g64"]
    assert sum(plans["default g32"].values()) * 1e9 == pytest.approx(28_803_304_448)
    points = data["quantisation_quality"]["points"]
    assert [p["kl_mean_nats"] for p in points] == [
        by_name[f"synthetic-tiny.{p['plan'].replace(' ', '.')}"]["kl_mean_nats"] for p in points
    ]


def test_another_rounding_is_named_in_the_receipt_and_the_plans_own_is_not(tmp_path):
    args = ["accuracy", "--synthetic", "tiny", "--plans", "default,int4-embed-mse", "--groups", "32",
            "--sequences", "2", "--seq-len", "12", "--prompts", "1", "--prompt-len", "4", "--greedy-tokens", "2",
            "--results", str(tmp_path), "--no-regenerate"]  # fmt: skip
    for rounding in ("absmax", "signed"):
        result = CliRunner().invoke(main, [*args, "--rounding", rounding])
        assert result.exit_code == 0, result.output
    receipts = {
        r["name"]: r["config"]["plan"]["rounding"] for r in map(load_receipt, receipt_paths(tmp_path))
    }
    assert receipts == {
        "synthetic-tiny.default.absmax.g32": "absmax", "synthetic-tiny.default.g32": "signed",
        "synthetic-tiny.int4-embed-mse.absmax.g32": "absmax", "synthetic-tiny.int4-embed-mse.signed.g32": "signed",
    }  # fmt: skip
    labels = {p["plan"] for p in figures.build_all(tmp_path)["quantisation_quality"]["points"]}
    assert labels == {
        "default.absmax g32",
        "default g32",
        "int4-embed-mse.absmax g32",
        "int4-embed-mse.signed g32",
    }


def test_a_group_size_the_model_cannot_use_is_refused(tmp_path):
    result = CliRunner().invoke(
        main, ["accuracy", "--synthetic", "tiny", "--groups", "128", "--results", str(tmp_path)]
    )
    assert result.exit_code == 2 and "group size 128" in result.output
    assert receipt_paths(tmp_path) == []


def test_a_checkpoint_and_a_text_file_can_replace_the_synthetic_defaults(tmp_path):
    from engine.synth import write_synthetic_checkpoint

    write_synthetic_checkpoint(preset("tiny"), tmp_path / "ckpt", seed=3, preset_name="tiny")
    (tmp_path / "text.txt").write_text("The quick brown fox jumps over the lazy dog. " * 3)
    args = ["accuracy", "--weights", str(tmp_path / "ckpt"), "--plans", "default", "--groups", "32",
            "--sequences", "2", "--seq-len", "16", "--prompts", "1", "--prompt-len", "4", "--greedy-tokens", "3",
            "--results", str(tmp_path / "results"), "--no-regenerate"]  # fmt: skip
    result = CliRunner().invoke(main, [*args, "--text", str(tmp_path / "text.txt")])
    assert result.exit_code == 0, result.output
    (receipt,) = [load_receipt(p) for p in receipt_paths(tmp_path / "results")]
    assert receipt["name"] == "ckpt.default.g32" and receipt["config"]["weights"] == "synthetic weights"
    assert receipt["config"]["eval_set"].startswith("text text.txt")
    assert receipt["config"]["weight_source"] == str(tmp_path / "ckpt")
    assert receipt["config"]["weights_sha256"] == shards_sha256(tmp_path / "ckpt")
    short = tmp_path / "short.txt"
    short.write_text("too short")
    result = CliRunner().invoke(main, [*args, "--text", str(short)])
    assert result.exit_code == 2 and "the text has 2 tokens; 2 sequences of 16 need 32" in result.output


def test_a_trained_checkpoint_is_measured_on_its_heldout_text_and_labelled_trained(trained_tiny, tmp_path):
    ckpt = trained_tiny
    args = ["accuracy", "--weights", str(ckpt), "--plans", "default", "--groups", "32", "--sequences", "2",
            "--seq-len", "16", "--prompts", "1", "--prompt-len", "4", "--greedy-tokens", "3",
            "--results", str(tmp_path / "results"), "--no-regenerate"]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    (receipt,) = [load_receipt(p) for p in receipt_paths(tmp_path / "results")]
    assert (
        receipt["config"]["weights_kind"] == "trained" and receipt["config"]["weights"] == "trained weights"
    )
    assert receipt["config"]["eval_set"].startswith("text heldout.txt")
    assert receipt["notes"].startswith("trained weights")
    assert 4 < receipt["derived"]["bits_per_weight"] < 16
