"""`python -m runners batching`: one receipt per concurrency, the batch really formed, speedup over c=1."""

from __future__ import annotations

import torch
from click.testing import CliRunner

from harness.receipt import load_receipt, receipt_paths
from runners.cli import main


def test_the_batching_runner_writes_one_receipt_per_concurrency(tmp_path, monkeypatch):
    import runners.batching

    rounds: list[int] = []  # the concurrency of each round, in the order they ran
    real_round = runners.batching.run_round

    def recording_round(scheduler, prompts, gen_tokens):
        rounds.append(len(prompts))
        return real_round(scheduler, prompts, gen_tokens)

    monkeypatch.setattr(runners.batching, "run_round", recording_round)
    result = CliRunner().invoke(
        main,
        ["batching", "--synthetic", "tiny", "--dtype", "fp32", "--concurrency", "1,2", "--prompt-tokens", "8",
         "--gen-tokens", "4", "--repeats", "2", "--threads", "1", "--results", str(tmp_path), "--no-regenerate"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert rounds == [1, 2, 1, 2, 1, 2]  # untimed rounds, then the timed ones alternating between levels
    receipts = {r["config"]["concurrency"]: r for r in map(load_receipt, receipt_paths(tmp_path))}
    assert sorted(receipts) == [1, 2]
    for c, r in receipts.items():
        assert r["suite"] == "batching" and r["config"]["decode_step"] == "eager"  # KIMI_DECODE_STEP
        assert len(r["samples"]["aggregate_tok_s"]) == 2 and len(r["samples"]["ttft_ms"]) == 2 * c
        assert len(r["samples"]["itl_ms"]) == 2 * c * 3  # 4 tokens: 3 gaps per request
        assert max(r["samples"]["decoded_per_step"]) == c  # the c requests decoded together
        assert r["units"]["speedup_vs_c1"] == "ratio" and r["memory_cap"]["peak_rss_gib"] > 0
    assert receipts[1]["derived"]["speedup_vs_c1"] == 1.0 and receipts[2]["derived"]["speedup_vs_c1"] > 0
    assert receipts[1]["name"] == "synthetic-tiny.fp32.eager.c1"  # the shipped kernels: no suffix
    assert receipts[1]["config"]["kernel_variants"]["w16a16_grouped_swiglu"] == "cpp"


def test_kernels_chosen_away_from_the_defaults_name_the_receipts():
    from runners.batching import _selection_suffix

    chosen = {"w16a16_gemv": "cpp", "w16a16_grouped_gemv": "native", "w16a16_grouped_swiglu": "native"}
    suffix = _selection_suffix(chosen, torch.device("cpu"))
    assert suffix == ".w16a16_grouped_gemv-native.w16a16_grouped_swiglu-native"


def test_a_bad_concurrency_is_a_clear_error(tmp_path):
    result = CliRunner().invoke(main, ["batching", "--concurrency", "0,2", "--results", str(tmp_path)])
    assert result.exit_code != 0 and "positive whole numbers" in result.output
