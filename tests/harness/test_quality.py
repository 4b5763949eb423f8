"""Perplexity against bits per weight: the panels RESULTS.md's table and the figure share, the Pareto
frontier, and which checkpoints are shown."""

from __future__ import annotations

import random

from harness import figures, quality, report
from harness.receipt import write_receipt
from tests.harness.conftest import HARDWARE

EVAL = {"sequences": 4, "seq_len": 32}


def _accuracy(results, model, plan, group, bits, ppl, reference, kind="trained", rounding=None):
    label = f"{plan}.{rounding}" if rounding else plan
    cfg = {
        "model": model,
        "weights_kind": kind,
        "plan": {"name": plan, "label": label, "group_size": group},
    } | EVAL
    derived = {"bits_per_weight": bits, "perplexity_candidate": ppl, "perplexity_reference": reference,
               "kl_mean_nats": random.uniform(0.01, 0.1), "kl_max_nats": random.uniform(0.2, 1.0),
               "top1_agreement": random.uniform(0.8, 0.95)}  # fmt: skip
    return write_receipt(
        "accuracy", f"{model}.{label}.g{group}", config=cfg, samples={"kl_nats": [0.1, 0.2]},
        units={"kl_nats": "nats"}, derived=derived, results_dir=results, hardware=HARDWARE, command=["test"],
    )  # fmt: skip


def _llamacpp(results, model, gguf_type, bits, ppl):
    cfg = {"model": model, "weights_kind": "trained", "gguf_type": gguf_type} | EVAL
    return write_receipt(
        "llamacpp_quality", f"{model}.{gguf_type}", config=cfg, samples={"nll_nats": [5.0, 5.1]},
        units={"nll_nats": "nats/token"}, derived={"bits_per_weight": bits, "perplexity": ppl},
        results_dir=results, hardware=HARDWARE, command=["test"],
    )  # fmt: skip


def _point(bits, ppl):
    return {"bits_per_weight": bits, "perplexity": ppl}


def test_the_frontier_keeps_only_points_nothing_beats_at_fewer_or_equal_bits():
    points = [_point(4.0, 12.0), _point(4.5, 11.0), _point(4.5, 11.5), _point(5.0, 11.2), _point(6.0, 10.0)]
    assert quality.on_frontier(points) == [True, True, False, False, True]
    assert quality.on_frontier([_point(4.0, 10.0), _point(4.0, 10.0)]) == [True, True]  # ties both stand


def test_panels_pair_our_plans_with_llamacpp_on_the_newest_checkpoint_of_each_preset(tmp_path):
    results = tmp_path / "results"
    reference = random.uniform(100, 200)
    _accuracy(results, "small-aaaa", "default", 32, 6.3, reference * 1.01, reference)  # superseded recipe
    _llamacpp(results, "small-aaaa", "q4_0", 4.7, reference * 1.02)
    new = reference + 1
    _accuracy(results, "small-bbbb", "default", 32, 6.3, new * 1.005, new)
    _accuracy(results, "small-bbbb", "int4-embed-int8-head", 128, 4.66, new * 1.003, new)
    _accuracy(results, "small-bbbb", "int4-embed-int8-head", 128, 4.66, new * 1.009, new, rounding="absmax")
    _llamacpp(results, "small-bbbb", "q4_0", 4.7, new * 1.01)
    _accuracy(results, "synthetic-small", "default", 32, 6.3, 9e9, 1e9, kind="random")  # a stress test
    panels = quality.quality_panels(report.newest(report.load_frame(results)))
    assert [p["model"] for p in panels] == ["small-bbbb"]
    panel = panels[0]
    assert panel["panel"] == "small-bbbb · cpu-2c-Test-CPU · 4 x 32 tokens" and panel["reference"] == new
    by_label = {p["label"]: p for p in panel["points"]}
    assert set(by_label) == {"int4-embed-int8-head g128", "int4-embed-int8-head.absmax g128", "Q4_0",
                             "default g32"}  # fmt: skip
    assert [p["bits_per_weight"] for p in panel["points"]] == sorted(
        p["bits_per_weight"] for p in panel["points"]
    )
    assert by_label["int4-embed-int8-head g128"]["frontier"] and not by_label["Q4_0"]["frontier"]
    assert (
        by_label["Q4_0"]["source"] == quality.LLAMA_CPP and by_label["default g32"]["source"] == quality.OURS
    )


def test_results_md_tabulates_each_quantisation_with_its_receipt_and_the_figure_draws_a_panel_each(tmp_path):
    results = tmp_path / "results"
    reference = random.uniform(100, 200)
    _accuracy(results, "small-bbbb", "default", 32, 6.3, reference * 1.005, reference)
    receipt = _llamacpp(results, "small-bbbb", "q4_0", 4.7, reference * 1.01)
    _accuracy(results, "tiny-cccc", "default", 32, 10.7, 150.0, 148.0)
    text = report.render(results)
    table = text[text.index("## Perplexity against bits per weight") :]
    row = next(line for line in table.splitlines() if line.startswith("| llama.cpp | Q4_0 |"))
    assert f"| {report.fmt(reference * 1.01)} | +1.00% |" in row
    assert receipt.relative_to(results).as_posix() in row
    data = figures.build_all(results)["perplexity_vs_bits"]
    assert [p["model"] for p in data["panels"]] == ["small-bbbb", "tiny-cccc"]
    assert len(figures.draw_perplexity_vs_bits(data).axes) == 2


def test_without_trained_weights_there_is_no_table_and_no_figure(tmp_path):
    results = tmp_path / "results"
    _accuracy(results, "synthetic-small", "default", 32, 6.3, 1.2e9, 1e9, kind="random")
    assert "## Perplexity against bits per weight" not in report.render(results)
    assert "perplexity_vs_bits" not in figures.build_all(results)
