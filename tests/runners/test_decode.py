import pytest
import torch
from click.testing import CliRunner

from engine.quant import decode_bytes_per_token, make_plan
from harness.receipt import load_receipt, receipt_paths
from runners.cli import main
from runners.decode import build_synthetic, build_synthetic_quantized
from runners.roofline import state_bytes_per_token, weight_bytes_per_token


def test_weight_bytes_count_each_tensor_once_with_top_k_experts():
    model = build_synthetic("tiny", "cpu", torch.float32, seed=1)
    cfg = model.config
    parts = weight_bytes_per_token(model)
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    experts = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if ".experts." in n)
    embedding = model.model.embed_tokens.weight
    expected = (
        total
        - experts
        + experts * cfg.num_experts_per_token // cfg.num_experts
        - embedding.numel() * 4
        + cfg.hidden_size * 4
    )
    assert sum(parts.values()) == expected
    assert parts["lm_head"] == cfg.vocab_size * cfg.hidden_size * 4


def test_state_bytes_grow_with_context_only_in_mla_layers():
    model = build_synthetic("tiny", "cpu", torch.float32, seed=1)
    cache = model.new_cache(64)
    short, long = state_bytes_per_token(cache, 1), state_bytes_per_token(cache, 33)
    assert short["state_kda"] == long["state_kda"] > 0
    mla_layers = sum(model.config.is_mla_layer(i) for i in range(model.config.num_hidden_layers))
    width = model.config.kv_lora_rank + model.config.qk_rope_head_dim
    assert long["state_mla_cache"] - short["state_mla_cache"] == 32 * mla_layers * width * 4


def test_decode_runner_writes_one_valid_receipt_per_context(tmp_path):
    result = CliRunner().invoke(
        main,
        ["decode", "--synthetic", "tiny", "--contexts", "5,9", "--gen-tokens", "3", "--repeats", "2",
         "--results", str(tmp_path), "--no-regenerate"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    receipts = [load_receipt(p) for p in receipt_paths(tmp_path)]
    assert sorted(r["config"]["context"] for r in receipts) == [5, 9]
    for r in receipts:
        assert r["suite"] == "decode" and "synthetic weights" in r["notes"]
        assert len(r["samples"]["decode_ms"]) == 6 and len(r["samples"]["decode_tok_s"]) == 2
        assert r["derived"]["fraction_of_roofline"] > 0
        assert r["memory_cap"]["cap_gib"] == 16.0 and r["memory_cap"]["peak_rss_gib"] > 0


def test_bad_contexts_are_refused_clearly(tmp_path):
    result = CliRunner().invoke(main, ["decode", "--contexts", "17,abc", "--results", str(tmp_path)])
    assert result.exit_code == 2 and "comma-separated whole numbers" in result.output


def test_packed_bytes_count_top_k_and_shared_slots_and_the_head_at_its_precision():
    """Counted from the packed model's buffers; cross-checked with the plan's own byte budget."""
    model = build_synthetic_quantized("tiny", "cpu", torch.float32, seed=1, plan="default")
    parts = weight_bytes_per_token(model)
    budget = decode_bytes_per_token(model.config, make_plan("default")).components
    assert parts["routed_experts"] == budget["routed_expert"] > 0
    assert parts["shared_and_dense_mlp"] == budget["shared_expert"] + budget["dense_mlp"]
    assert parts["lm_head"] == budget["lm_head"] == model.config.vocab_size * model.config.hidden_size * 2


def test_quantised_run_records_the_bound_kernel_of_every_operation(tmp_path):
    result = CliRunner().invoke(
        main,
        ["decode", "--synthetic", "tiny", "--quant", "default", "--kernels", "default,reference",
         "--contexts", "5", "--gen-tokens", "2", "--repeats", "1", "--results", str(tmp_path), "--no-regenerate"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    receipts = {r["config"]["kernels"]: r for r in map(load_receipt, receipt_paths(tmp_path))}
    assert set(receipts) == {"default", "reference"}
    for selection, r in receipts.items():
        assert r["name"] == f"synthetic-tiny.fp32.plan-default.kernels-{selection}.ctx5.b1"
        assert r["config"]["quant"] == "default" and r["config"]["plan"]["group_size"] == 32
        # On the CPU the shipped defaults are the references: the receipt says so, whatever was asked.
        assert r["config"]["kernel_variants"] == {
            op: "reference"
            for op in [
                "route_combine",
                "w16a16_gemv",
                "w4a16_gemv",
                "w4a16_grouped_gemv",
                "w4a16_grouped_swiglu",
            ]
        }


@pytest.mark.parametrize(
    "args,message",
    [
        (["--kernels", "reference"], "add --quant PLAN"),
        (
            ["--quant", "default", "--kernels", "default,fastest"],
            "no operation has a variant named 'fastest'",
        ),
    ],
)
def test_bad_kernel_selections_are_refused_before_measuring(tmp_path, args, message):
    result = CliRunner().invoke(main, ["decode", "--synthetic", "tiny", *args, "--results", str(tmp_path)])
    assert result.exit_code == 2 and message in result.output
    assert not list(receipt_paths(tmp_path))
