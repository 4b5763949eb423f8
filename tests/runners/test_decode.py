import pytest
import torch
from click.testing import CliRunner

import runners.decode as decode_runner
from engine.cli_options import default_dtype_name
from engine.kernels.defaults import SHIPPED_DEFAULTS
from engine.kernels.linear import DENSE_EXPERT_OPS
from engine.quant import decode_bytes_per_token, make_plan
from engine.runtime import Engine, open_model_source
from engine.runtime.decode import DecodeRunner
from harness.receipt import receipt_paths
from runners.bandwidth import copy_bandwidth_gbs
from runners.cli import main
from runners.decode import WARMUP_TOKENS, measure
from runners.roofline import state_bytes_per_token, weight_bytes_per_token
from tests.runners.runner_support import run_for_receipts
from tests.runtime.runtime_support import write_tiny_artifact


@pytest.fixture(autouse=True)
def small_bandwidth_buffers(monkeypatch):
    """The runner's copy-bandwidth probe on 8 MiB buffers: these tests check receipts, not bandwidth."""
    monkeypatch.setattr(
        decode_runner, "copy_bandwidth_gbs", lambda device: copy_bandwidth_gbs(device, size_mib=8)
    )


def build_synthetic(name, device, dtype, seed, plan=None):
    return open_model_source(synthetic=name, seed=seed, quant=plan).load(device, dtype)


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
    receipts = run_for_receipts(
        ["decode", "--synthetic", "tiny", "--contexts", "5,9", "--gen-tokens", "3", "--repeats", "2",
         "--threads", "1"],
        tmp_path,
    )  # fmt: skip
    assert sorted(r["config"]["context"] for r in receipts) == [5, 9]
    for r in receipts:
        assert r["suite"] == "decode" and "synthetic weights" in r["notes"]
        assert len(r["samples"]["decode_ms"]) == 6 and len(r["samples"]["decode_tok_s"]) == 2
        assert r["derived"]["fraction_of_roofline"] > 0
        assert r["memory_cap"]["cap_gib"] == 16.0 and r["memory_cap"]["peak_rss_gib"] > 0
        assert r["config"]["cuda_graphs"] is False and "Engine" in r["config"]["decode"]
        # Dense Linears (FP32 or BF16) and expert banks decode through the shipped CPU kernels.
        dense_gemv = {op: SHIPPED_DEFAULTS["cpu"][op] for op in ("w16a16_gemv", *DENSE_EXPERT_OPS)}
        assert r["config"]["kernel_variants"] == dense_gemv and r["config"]["quant"] == "none"
        assert r["config"]["decode_step"] == "eager" and r["config"]["compile_s"] is None  # KIMI_DECODE_STEP
        assert r["config"]["threads"] == 1
        assert len(r["samples"]["raw_decode_tok_s"]) == 2 and r["derived"]["engine_over_raw_decode"] > 0


def test_measure_times_every_token_through_the_runtimes_decode_runner(monkeypatch):
    """TTFT ends with the first token (from the prefill logits); each later token is one runner step."""
    steps = []
    step = DecodeRunner.step
    monkeypatch.setattr(DecodeRunner, "step", lambda self, ids: steps.append(ids.shape) or step(self, ids))
    engine = Engine.load(synthetic="tiny", device="cpu", max_context=64, prefix_cache_gib=0)
    try:
        samples = measure(engine, 7, 2, 5, repeats=3, seed=4)
    finally:
        engine.close()
    assert len(steps) == WARMUP_TOKENS + 3 * 5 and set(steps) == {torch.Size([2])}
    assert len(samples["decode_ms"]) == 15 and len(samples["ttft_ms"]) == len(samples["decode_tok_s"]) == 3
    assert engine.pool.in_use_bytes == 0  # every repeat released its cache


def test_measure_refuses_an_engine_with_a_prefix_cache():
    engine = Engine.load(synthetic="tiny", device="cpu", max_context=64, prefix_cache_gib=0.01)
    try:
        with pytest.raises(ValueError, match="prefix cache"):
            measure(engine, 7, 1, 3, repeats=1, seed=0)
    finally:
        engine.close()


def test_an_int4_artifact_is_measured_as_it_is(tmp_path):
    _, artifact = write_tiny_artifact(tmp_path)
    (receipt,) = run_for_receipts(
        ["decode", "--weights", str(artifact), "--contexts", "5", "--gen-tokens", "2", "--repeats", "1"],
        tmp_path / "results",
    )
    assert receipt["name"] == f"artifact.{default_dtype_name('cpu')}.plan-default.kernels-default.ctx5.b1"
    assert (
        receipt["config"]["quant"] == "default"
        and receipt["config"]["kernel_variants"]["w4a16_gemv"] == SHIPPED_DEFAULTS["cpu"]["w4a16_gemv"]
    )
    assert "synthetic weights" in receipt["notes"]  # the artifact was made from a synthetic checkpoint


def test_bad_contexts_are_refused_clearly(tmp_path):
    result = CliRunner().invoke(main, ["decode", "--contexts", "17,abc", "--results", str(tmp_path)])
    assert result.exit_code == 2 and "comma-separated whole numbers" in result.output


def test_packed_bytes_count_top_k_and_shared_slots_and_the_head_at_its_precision():
    """Counted from the packed model's buffers; cross-checked with the plan's own byte budget."""
    model = build_synthetic("tiny", "cpu", torch.float32, seed=1, plan="default")
    parts = weight_bytes_per_token(model)
    budget = decode_bytes_per_token(model.config, make_plan("default")).components
    assert parts["routed_experts"] == budget["routed_expert"] > 0
    assert parts["shared_and_dense_mlp"] == budget["shared_expert"] + budget["dense_mlp"]
    assert parts["lm_head"] == budget["lm_head"] == model.config.vocab_size * model.config.hidden_size * 2


def test_quantised_run_records_the_bound_kernel_of_every_operation(tmp_path):
    written = run_for_receipts(
        ["decode", "--synthetic", "tiny", "--quant", "default", "--kernels", "default,reference",
         "--contexts", "5", "--gen-tokens", "2", "--repeats", "1"],
        tmp_path,
    )  # fmt: skip
    receipts = {r["config"]["kernels"]: r for r in written}
    assert set(receipts) == {"default", "reference"}
    for selection, r in receipts.items():
        assert (
            r["name"]
            == f"synthetic-tiny.{default_dtype_name('cpu')}.plan-default.kernels-{selection}.ctx5.b1"
        )
        assert r["config"]["quant"] == "default" and r["config"]["plan"]["group_size"] == 32
        # The receipt names the variant each operation was bound to.
        bound = SHIPPED_DEFAULTS["cpu"] if selection == "default" else {}
        assert r["config"]["kernel_variants"] == {
            op: bound.get(op, "reference")
            for op in [
                "route_combine",
                "w16a16_gemv",
                "w4a16_gemv",
                "w4a16_grouped_gemv",
                "w4a16_grouped_swiglu",
                "rms_norm",
                "kda_decode_step",
                "route_topk",
            ]
        }


@pytest.mark.parametrize(
    "args,message",
    [
        (["--kernels", "reference"], "add --quant PLAN"),
        (["--quant", "default", "--memory-cap-gib", "0.01"], "over the memory cap of 0.01 GiB"),
        (
            ["--quant", "default", "--kernels", "default,fastest"],
            "no operation has a variant named 'fastest'",
        ),
    ],
)
def test_bad_kernel_selections_are_refused_before_measuring(tmp_path, args, message):
    result = CliRunner().invoke(main, ["decode", "--synthetic", "tiny", *args, "--results", str(tmp_path)])
    assert result.exit_code in (1, 2) and message in result.output
    assert not list(receipt_paths(tmp_path))
