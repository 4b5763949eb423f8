"""Figures fit for a paper: one series per configuration, stable order and colours, captions, same bytes."""

import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

from harness import figures
from harness.figure_style import series_style, text
from harness.receipt import write_receipt
from tests.harness.conftest import HARDWARE

REPO = Path(__file__).resolve().parents[2]


def _write(results, suite, name, config, samples, derived=None, memory=None, hardware=HARDWARE):
    return write_receipt(
        suite, name, config=config, samples=samples, units={k: "x" for k in samples}, derived=derived or {},
        memory=memory, results_dir=results, hardware=hardware, command=["test"],
    )  # fmt: skip


def _decode(results, context, plan=None, hardware=HARDWARE):
    cfg = {"model": "synthetic-small", "dtype": "fp32", "batch": 1, "context": context, "plan": plan,
           "kernels": "default" if plan else None, "weights": "synthetic weights"}  # fmt: skip
    quant = f".plan-{plan['name']}" if plan else ""
    return _write(
        results, "decode", f"synthetic-small.fp32{quant}.ctx{context}.b1", cfg,
        {"decode_tok_s": [random.uniform(5, 20) for _ in range(3)]},
        derived={"roofline_tok_s": random.uniform(50, 100), "fraction_of_roofline": 0.1},
        memory={"cap_gib": 16.0, "peak_rss_gib": random.uniform(0.5, 1)}, hardware=hardware,
    )  # fmt: skip


def _accuracy(results, classes, plan="default", group=32):
    derived = {f"full_weight_bytes_{c}": size for c, size in classes.items()}
    derived |= {"kl_mean_nats": 0.5, "kl_max_nats": 1.0, "top1_agreement": 0.9}
    cfg = {"model": "synthetic-small", "plan": {"name": plan, "group_size": group}}
    return _write(
        results, "accuracy", f"synthetic-small.{plan}.g{group}", cfg, {"kl_nats": [0.1, 0.2]}, derived
    )


def test_dense_and_int4_decode_are_two_series_each_rising_in_context(tmp_path):
    results = tmp_path / "results"
    int4 = {"name": "default", "group_size": 32}
    for context in (1024, 17, 256):
        _decode(results, context)
    for context in (256, 17):
        _decode(results, context, plan=int4)
    data = figures.build_all(results)["decode_throughput"]
    assert len(data["series"]) == 2
    for line in data["series"]:
        xs = [p["context"] for p in line["points"]]
        assert xs == sorted(set(xs)) and all("roofline_tok_s" in p for p in line["points"])
        assert "random (stress test)" in line["label"] and "cpu-2c-Test-CPU" not in line["label"]
    assert {("INT4 default g32" in s["label"]) for s in data["series"]} == {True, False}
    assert data["hardware"] == "cpu-2c-Test-CPU"  # named once, in the title


def test_hardware_is_named_in_labels_only_when_several_are_shown(tmp_path):
    results = tmp_path / "results"
    _decode(results, 17)
    _decode(results, 17, hardware=HARDWARE | {"hardware_id": "NVIDIA-H200"})
    data = figures.build_all(results)["decode_throughput"]
    assert data["hardware"] is None
    assert sorted(s["hardware_id"] for s in data["series"]) == ["NVIDIA-H200", "cpu-2c-Test-CPU"]
    assert "cpu-2c-Test-CPU" in data["caption"] and "NVIDIA-H200" in data["caption"]


def test_memory_headroom_orders_contexts_by_value(tmp_path):
    results = tmp_path / "results"
    for context in (1024, 17, 256):
        _decode(results, context)
    labels = [b["label"] for b in figures.build_all(results)["memory_headroom"]["bars"]]
    assert [re.search(r"ctx(\d+)", label).group(1) for label in labels] == ["17", "256", "1024"]


def test_eleven_weight_classes_get_eleven_distinct_styles():
    styles = {tuple(series_style(i).values()) for i in range(11)}
    assert len(styles) == 11 and len({series_style(i)["color"] for i in range(11)}) == 8


def test_captions_name_receipts_and_commits_in_json_and_pdf(tmp_path):
    results = tmp_path / "results"
    path = _decode(results, 17)
    sha = json.loads(path.read_text())["sha256"][:7]
    figures.write_all(results, tmp_path / "out")
    data = json.loads((tmp_path / "out" / "decode_throughput.json").read_text())
    assert sha in data["caption"] and "0123456789" in data["caption"]
    assert sha.encode() in (tmp_path / "out" / "decode_throughput.pdf").read_bytes()  # /Subject


def test_proxy_overhead_title_is_words_not_a_field_name(tmp_path):
    results = tmp_path / "results"
    _write(results, "proxy", "asgi.anthropic.json", {"mode": "asgi"}, {"added_ms": [0.1, 0.2, 0.3]})
    data = figures.build_all(results)["proxy_overhead"]
    assert "added_ms" not in data["title"] and "added_ms" not in data["xlabel"]


def test_text_escapes_what_cmr10_would_draw_as_another_glyph():
    assert text("decode_tok_s") == r"decode$\_$tok$\_$s"
    assert text("KL(a ‖ b) in µs") == r"KL(a $\Vert$ b) in $\mu$s"


def test_figures_are_byte_identical_across_hash_seeds(tmp_path):
    """Equal-sized weight classes must not be ordered by a set (their colours would swap between runs).
    The second run goes through scripts/make_figures.py, which must be the same code."""
    results = tmp_path / "results"
    tied = {f"class_{letter}": 1e9 for letter in "abcdefgh"}
    _accuracy(results, tied | {"routed_expert": 9e9})
    _accuracy(results, tied | {"routed_expert": 8e9}, group=64)
    _decode(results, 17)
    outputs = []
    commands = {"0": ["-m", "harness", "figures"], "3": [str(REPO / "scripts" / "make_figures.py")]}
    for seed, command in commands.items():
        out = tmp_path / f"seed{seed}"
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(REPO)}
        subprocess.run([sys.executable, *command, "--results", str(results), "--out", str(out)],
                       cwd=REPO, env=env, check=True, capture_output=True, timeout=300)  # fmt: skip
        outputs.append({p.name: p.read_bytes() for p in sorted(out.iterdir())})
    assert "plan_weight_bytes.pdf" in outputs[0] and outputs[0].keys() == outputs[1].keys()
    for name in outputs[0]:
        assert outputs[0][name] == outputs[1][name], name


def test_use_tex_without_latex_is_a_clear_error(tmp_path):
    results = tmp_path / "results"
    _decode(results, 17)
    env = {**os.environ, "USE_TEX": "1", "PATH": str(tmp_path), "PYTHONPATH": str(REPO)}  # no latex on PATH
    out = subprocess.run([sys.executable, "-m", "harness", "figures", "--results", str(results), "--out",
                          str(tmp_path / "out")], env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 1 and "USE_TEX=1" in out.stderr and "unset USE_TEX" in out.stderr


def test_batching_is_one_line_per_configuration_rising_in_concurrency_and_absent_without_receipts(tmp_path):
    results = tmp_path / "results"
    assert "batching_concurrency" not in figures.build_all(results)
    for c in (4, 1, 2):
        cfg = {"model": "synthetic-small", "dtype": "bf16", "threads": 2, "decode_step": "compiled",
               "concurrency": c}  # fmt: skip
        samples = {"aggregate_tok_s": [10.0 * c], "ttft_ms": [50.0, 60.0], "itl_ms": [30.0, 31.0]}
        _write(results, "batching", f"synthetic-small.bf16.c{c}", cfg, samples, {"speedup_vs_c1": float(c)})
    data = figures.build_all(results)["batching_concurrency"]
    (line,) = data["series"]
    assert [p["concurrency"] for p in line["points"]] == [1, 2, 4]
    assert [p["speedup_vs_c1"] for p in line["points"]] == [1.0, 2.0, 4.0]
    assert "compiled step" in line["label"]
    written = figures.write_all(results, tmp_path / "figures")
    assert tmp_path / "figures" / "batching_concurrency.png" in written


def test_labels_of_points_a_hair_apart_are_parted_from_each_other_and_the_markers():
    import matplotlib.pyplot as plt
    import matplotlib.text

    from harness.figure_style import LEADER, part_labels

    fig, ax = plt.subplots(figsize=(4, 3))
    points = [(4.66, 172.63), (4.70, 172.70), (4.78, 172.38), (5.0, 172.2)]
    ax.scatter(*zip(*points, strict=True))
    ax.set_xlim(4, 6)
    ax.set_ylim(171, 174)
    labels = [ax.annotate(f"label {i}", p, xytext=(4, 4), textcoords="offset points", fontsize=6,
                          arrowprops=LEADER) for i, p in enumerate(points)]  # fmt: skip
    renderer = fig.canvas.get_renderer()

    def boxes():
        fig.draw_without_rendering()
        return [matplotlib.text.Text.get_window_extent(label, renderer) for label in labels]

    assert any(a.overlaps(b) for i, a in enumerate(boxes()) for b in boxes()[i + 1 :])  # crowded first
    part_labels(fig, labels)
    placed = boxes()
    assert not any(a.overlaps(b) for i, a in enumerate(placed) for b in placed[i + 1 :])
    markers = [ax.transData.transform(p) for p in points]
    assert not any(box.contains(x, y) for box in placed for x, y in markers)
    inside = ax.get_window_extent(renderer)
    assert all(inside.contains(box.x0, box.y0) and inside.contains(box.x1, box.y1) for box in placed)
    plt.close(fig)
