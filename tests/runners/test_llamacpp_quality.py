"""llama.cpp's quants of a trained checkpoint on the accuracy runner's tokens; the perplexity-vs-bits figure
and the RESULTS.md sections that keep random-weight accuracy apart as a stress test."""

from __future__ import annotations

import math

import pytest
from click.testing import CliRunner

from harness import figures, report
from harness.receipt import load_receipt, receipt_paths
from runners.cli import main

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
pytestmark = pytest.mark.filterwarnings("ignore:`rope_scaling` is deprecated:FutureWarning")

EVAL = ["--sequences", "2", "--seq-len", "16", "--results"]


@pytest.fixture(scope="module")
def results(trained_tiny, tmp_path_factory):
    ckpt = trained_tiny
    root = tmp_path_factory.mktemp("quality")
    out = root / "results"
    accuracy = ["accuracy", "--weights", str(ckpt), "--plans", "default", "--groups", "32", "--prompts", "1",
                "--prompt-len", "4", "--greedy-tokens", "3", *EVAL, str(out), "--no-regenerate"]  # fmt: skip
    assert (r := CliRunner().invoke(main, accuracy)).exit_code == 0, r.output
    random = ["accuracy", "--synthetic", "tiny", "--plans", "default", "--groups", "32", "--prompts", "1",
              "--prompt-len", "4", "--greedy-tokens", "3", *EVAL, str(out), "--no-regenerate"]  # fmt: skip
    assert (r := CliRunner().invoke(main, random)).exit_code == 0, r.output
    quality = ["llamacpp-quality", "--weights", str(ckpt), "--types", "f16,q4_0", "--threads", "1", *EVAL,
               str(out), "--no-regenerate"]  # fmt: skip
    assert (r := CliRunner().invoke(main, quality)).exit_code == 0, r.output
    return out


def _receipts(results, suite):
    return {r["name"]: r for r in map(load_receipt, receipt_paths(results)) if r["suite"] == suite}


def test_llamacpp_f16_scores_the_same_tokens_as_the_accuracy_reference(results):
    quality = _receipts(results, "llamacpp_quality")
    assert sorted(r["config"]["gguf_type"] for r in quality.values()) == ["f16", "q4_0"]
    f16 = next(r for r in quality.values() if r["config"]["gguf_type"] == "f16")
    q4 = next(r for r in quality.values() if r["config"]["gguf_type"] == "q4_0")
    trained = next(
        r for r in _receipts(results, "accuracy").values() if r["config"]["weights_kind"] == "trained"
    )
    assert f16["config"]["eval_set"] == trained["config"]["eval_set"]
    assert f16["config"]["weights_sha256"] == trained["config"]["weights_sha256"]
    # F16 storage of BF16 weights is (nearly) exact: llama.cpp's perplexity is the engine's FP32 one.
    assert math.isclose(
        f16["derived"]["perplexity"], trained["derived"]["perplexity_reference"], rel_tol=1e-2
    )
    assert q4["derived"]["bits_per_weight"] < f16["derived"]["bits_per_weight"]
    assert q4["config"]["tensor_types"].get("Q4_0", 0) > 0 and f16["config"]["weights_kind"] == "trained"


def test_the_figure_plots_trained_weights_only_and_both_toolchains(results):
    data = figures.build_all(results)["perplexity_vs_bits"]
    (panel,) = data["panels"]  # one checkpoint, one evaluation set: one panel
    assert sorted({p["source"] for p in panel["points"]}) == ["llama.cpp", "ours"]
    assert "synthetic" not in panel["model"] and panel["panel"].endswith("· 2 x 16 tokens")
    assert panel["reference"] is not None
    figure = figures.draw_perplexity_vs_bits(data)
    assert len(figure.axes) == 1


def test_results_md_keeps_random_weight_accuracy_apart_as_a_stress_test(results):
    text = report.render(results)
    trained, stress = text.index("## Accuracy (trained weights)"), text.index("## Accuracy stress test")
    assert trained < stress and "## llama.cpp quants: perplexity" in text
    assert "synthetic-tiny" not in text[trained:stress] and "synthetic-tiny" in text[stress:]
