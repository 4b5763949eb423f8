"""Figures regenerated from receipts only, written as PNG + PDF + the JSON data they plot.

A figure is a `build(frame) -> data | None` (pure data taken from receipts; None when no receipt feeds it)
and a `draw(data) -> Figure`; adding one is a pair of functions and a line in `FIGURES`. `build` returns a
"title" and, per plotted item, its "hardware_id" and "receipt" path; `build_all` then adds the caption
(receipts, commits, hardware) and names the hardware once, in the title, when only one is shown. `draw`
passes every string through `figure_style.text` and takes colours from `figure_style.series_style`.
The JSON sidecar is what the audit compares with a fresh build, so stale figures fail it. Output is
byte-identical for the same receipts in any process: nothing is ordered by a set or a hash.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import matplotlib.ticker
import pandas as pd
from matplotlib.patches import Patch

from harness.figure_style import (
    LEADER,
    NEUTRAL,
    STYLE,
    check_renderer,
    part_labels,
    save,
    series_style,
    text,
)
from harness.hardware import REPO_ROOT
from harness.quality import LLAMA_CPP, OURS, quality_panels
from harness.receipt import short_id
from harness.report import load_frame, newest
from harness.summary import config_label, natural_key, plan_label, weights_label

FIGURES_DIR = REPO_ROOT / "docs" / "figures"


@dataclass(frozen=True)
class Figure:
    name: str
    build: Callable[[pd.DataFrame], dict | None]
    draw: Callable[[dict], plt.Figure]


def heading(data: dict) -> str:
    """The figure's title, naming the hardware when all it shows ran on one machine."""
    return data["title"] + (f"\non {data['hardware']}" if data.get("hardware") else "")


def title(data: dict) -> str:
    return text(heading(data))


def _bar(label: str, row: Any, metric: str) -> dict:
    """One bar of `draw_bars`: a receipt row's median and p10/p90 of `metric`, its unit and path."""
    stats = row.receipt["summary"][metric]
    return {"label": label, "median": stats["median"], "p10": stats["p10"], "p90": stats["p90"],
            "unit": row.receipt["units"][metric], "hardware_id": row.hardware_id, "receipt": row.path}  # fmt: skip


def suite_medians(suite: str, metric: str, heading: str, axis: str) -> Callable[[pd.DataFrame], dict | None]:
    """Median and p10/p90 of one metric for every (name, hardware) of a suite, newest receipts."""

    def build(frame: pd.DataFrame) -> dict | None:
        rows = _newest_suite(frame, suite)
        bars = [_bar(row.name, row, metric) for row in rows.itertuples() if metric in row.receipt["summary"]]
        if not bars:
            return None
        bars.sort(key=lambda b: (natural_key(b["label"]), b["hardware_id"]))
        return {"title": f"{heading} (median, p10–p90)", "xlabel": axis, "bars": bars}

    return build


def _key(ax: plt.Axes, names: list[str], **legend) -> None:
    """A legend of one colour patch per name, in `series_style` order."""
    handles = [Patch(color=series_style(i)["color"], label=text(n)) for i, n in enumerate(names)]
    ax.legend(handles=handles, **legend)


def draw_bars(data: dict) -> plt.Figure:
    bars = data["bars"]
    fig, ax = plt.subplots(figsize=(6.4, 0.9 + 0.4 * len(bars)), layout="constrained")
    y = list(range(len(bars)))
    medians = [b["median"] for b in bars]
    errors = [[b["median"] - b["p10"] for b in bars], [b["p90"] - b["median"] for b in bars]]
    groups = list(dict.fromkeys(b.get("series", "") for b in bars))  # e.g. one colour per proxy
    colors = [series_style(groups.index(b.get("series", "")))["color"] for b in bars]
    ax.barh(y, medians, xerr=errors, color=colors, ecolor="#222222", capsize=3)
    if len(groups) > 1:
        _key(ax, groups, loc="lower right")
    ax.set_yticks(y, [text(b["label"]) for b in bars])
    ax.invert_yaxis()
    ax.set_xlabel(text(f"{data['xlabel']} ({bars[0]['unit']})"))
    ax.set_title(title(data))
    ax.grid(axis="x", alpha=0.3)
    return fig


def proxy_vs_peers(frame: pd.DataFrame) -> dict | None:
    """Latency k3 and each peer proxy add to the same turn over loopback (`proxy-peers` receipts)."""
    rows = _newest_suite(frame, "proxy")
    rows = rows[rows["name"].str.startswith("peers.")]
    bars = []
    for row in sorted(rows.itertuples(), key=lambda r: (natural_key(r.name), r.hardware_id)):
        receipt = row.receipt
        for proxy in ("k3", *sorted(receipt["config"]["peers"])):
            if f"{proxy}_added_ms" in receipt["summary"]:  # else the proxy does not support this dialect
                bar = _bar(f"{row.name.removeprefix('peers.')} · {proxy}", row, f"{proxy}_added_ms")
                bars.append(bar | {"series": proxy})
    if not bars:
        return None
    return {"title": "Latency added per turn over loopback, k3 and peer proxies (median, p10–p90)",
            "xlabel": "added latency", "bars": bars}  # fmt: skip


def proxy_load(frame: pd.DataFrame) -> dict | None:
    """Turns/s and k3's CPU per turn against the number of streaming clients (`load.*` receipts), one
    series per client kind and hardware, x rising."""
    rows = _newest_suite(frame, "proxy")
    rows = rows[rows["name"].str.startswith("load.")]
    series: dict[tuple[str, str], dict] = {}
    for row in rows.itertuples():
        cfg, derived = row.receipt["config"], row.receipt["derived"]
        key = (f"{cfg['client']} clients", row.hardware_id)
        line = series.setdefault(key, {"label": key[0], "hardware_id": row.hardware_id, "points": []})
        line["points"].append({"clients": cfg["clients"], "turns_per_s": derived["turns_per_s"],
                               "k3_cpu_ms_per_turn": derived["k3_cpu_ms_per_turn"],
                               "latency_p99_ms": derived["latency_p99_ms"], "errors": derived["errors"],
                               "receipt": row.path})  # fmt: skip
    if not series:
        return None
    lines = []
    for key in sorted(series):
        line = series[key]
        lines.append(line | {"points": sorted(line["points"], key=lambda p: p["clients"])})
    return {"title": "k3 under load: keep-alive clients streaming 64-delta turns back to back",
            "series": lines}  # fmt: skip


def _log2_axes(ax: plt.Axes, xlabel: str, ylabel: str) -> None:
    """A load axis: x (clients, requests in flight) in powers of two, y from zero."""
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel(text(xlabel))
    ax.set_ylabel(text(ylabel))
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3, which="both")


def draw_proxy_load(data: dict) -> plt.Figure:
    fig, (rate, cpu) = plt.subplots(1, 2, figsize=(8.0, 3.8), layout="constrained")
    for i, line in enumerate(data["series"]):
        style = series_style(i)
        xs = [p["clients"] for p in line["points"]]
        for ax, key in ((rate, "turns_per_s"), (cpu, "k3_cpu_ms_per_turn")):
            ax.plot(xs, [p[key] for p in line["points"]], marker=style["marker"], color=style["color"],
                    label=text(line["label"]))  # fmt: skip
    for ax, label in ((rate, "completed turns/s"), (cpu, "k3 CPU ms per turn")):
        _log2_axes(ax, "concurrent streaming clients", label)
    rate.legend()
    fig.suptitle(title(data))
    return fig


def _lines_in_order(series: dict[tuple[str, str], dict]) -> list[dict]:
    """Lines keyed by (label, hardware) in natural label order, each line's points ({x: point}) by x."""
    lines = []
    for key in sorted(series, key=lambda k: (natural_key(k[0]), k[1])):
        line = series[key]
        lines.append(line | {"points": [line["points"][x] for x in sorted(line["points"])]})
    return lines


def _newest_lines(
    frame: pd.DataFrame,
    suite: str,
    x: str,
    label_of: Callable[[dict], str],
    measures_of: Callable[[dict], dict],
) -> list[dict]:
    """The suite's receipts as lines keyed by (label of the config, hardware), each point its config's
    `x`, the measures and the receipt's path; an x measured twice on one line keeps its newest receipt."""
    series: dict[tuple[str, str], dict] = {}
    for row in sorted(_newest_suite(frame, suite).itertuples(), key=lambda r: (r.created, r.path)):
        cfg = row.receipt["config"]
        label = label_of(cfg)
        line = series.setdefault(
            (label, row.hardware_id), {"label": label, "hardware_id": row.hardware_id, "points": {}}
        )
        line["points"][cfg[x]] = {x: cfg[x], **measures_of(row.receipt), "receipt": row.path}
    return _lines_in_order(series)


def decode_throughput(frame: pd.DataFrame) -> dict | None:
    """Decode tok/s against context length, one line per configuration and hardware, each with its
    roofline; a context measured twice in one configuration keeps its newest receipt (x strictly rises)."""
    lines = _newest_lines(
        frame,
        "decode",
        "context",
        lambda cfg: f"{config_label(cfg)}; {weights_label(cfg)} weights",
        lambda receipt: {
            "tok_s": receipt["summary"]["decode_tok_s"]["median"],
            "roofline_tok_s": receipt["derived"]["roofline_tok_s"],
        },
    )
    if not lines:
        return None
    return {"title": "Decode tokens/s by context length (median; dashed: roofline of the same colour)",
            "series": lines}  # fmt: skip


def draw_decode(data: dict) -> plt.Figure:
    fig, ax = plt.subplots(figsize=(6.4, 4.4), layout="constrained")
    for i, line in enumerate(data["series"]):
        style = series_style(i)
        xs = [p["context"] for p in line["points"]]
        ax.plot(xs, [p["tok_s"] for p in line["points"]], marker=style["marker"], color=style["color"],
                label=text(line["label"]))  # fmt: skip
        ax.plot(
            xs, [p["roofline_tok_s"] for p in line["points"]], linestyle="--", color=style["color"], alpha=0.7
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel(text("context length (tokens)"))
    ax.set_ylabel(text("decode tokens/s"))
    ax.set_title(title(data))
    ax.grid(alpha=0.3, which="both")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=1)
    return fig


def batching_concurrency(frame: pd.DataFrame) -> dict | None:
    """Aggregate output tok/s and median TTFT / ITL against concurrency (`batching` receipts), one line per
    configuration and hardware; each point labelled with its speedup over concurrency 1."""
    lines = _newest_lines(
        frame,
        "batching",
        "concurrency",
        lambda cfg: f"{config_label(cfg)}, {cfg['decode_step']} step",
        lambda receipt: {
            "aggregate_tok_s": receipt["summary"]["aggregate_tok_s"]["median"],
            "ttft_ms": receipt["summary"]["ttft_ms"]["median"],
            "itl_ms": receipt["summary"]["itl_ms"]["median"],
            "speedup_vs_c1": receipt["derived"].get("speedup_vs_c1"),
        },
    )
    if not lines:
        return None
    return {"title": "Continuous batching: aggregate output tokens/s and latency by concurrency (medians)",
            "series": lines}  # fmt: skip


def draw_batching(data: dict) -> plt.Figure:
    fig, (rate, latency) = plt.subplots(1, 2, figsize=(9.6, 4.4), layout="constrained")
    for i, line in enumerate(data["series"]):
        style = series_style(i)
        xs = [p["concurrency"] for p in line["points"]]
        rate.plot(xs, [p["aggregate_tok_s"] for p in line["points"]], marker=style["marker"],
                  color=style["color"], label=text(line["label"]))  # fmt: skip
        for p in line["points"]:
            if p["speedup_vs_c1"] is not None:
                rate.annotate(text(f"{p['speedup_vs_c1']:.2g}x"), (p["concurrency"], p["aggregate_tok_s"]),
                              textcoords="offset points", xytext=(4, -10), fontsize=6)  # fmt: skip
        latency.plot(xs, [p["ttft_ms"] for p in line["points"]], marker=style["marker"], color=style["color"])
        latency.plot(xs, [p["itl_ms"] for p in line["points"]], marker=style["marker"], color=style["color"],
                     linestyle="--")  # fmt: skip
    for ax in (rate, latency):
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_xlabel(text("concurrent requests"))
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3, which="both")
    rate.set_ylabel(text("aggregate output tokens/s"))
    latency.set_ylabel(text("ms (solid: time to first token; dashed: inter-token latency)"))
    rate.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=1)
    fig.suptitle(title(data))
    return fig


def memory_headroom(frame: pd.DataFrame) -> dict | None:
    """Peak memory of every newest receipt that ran under a cap, against that cap."""
    bars = []
    for row in newest(frame).itertuples():
        mem = row.receipt["memory_cap"]
        if not mem or mem.get("cap_gib") is None:
            continue
        peak = mem.get("peak_reserved_gib", mem["peak_rss_gib"])
        bars.append({"label": f"{row.suite}: {row.name}", "peak_gib": peak, "cap_gib": mem["cap_gib"],
                     "measure": "peak reserved" if "peak_reserved_gib" in mem else "peak RSS",
                     "hardware_id": row.hardware_id, "receipt": row.path})  # fmt: skip
    if not bars:
        return None
    bars.sort(key=lambda b: (natural_key(b["label"]), b["hardware_id"]))
    return {"title": "Peak memory against the cap", "bars": bars}


def draw_headroom(data: dict) -> plt.Figure:
    bars = data["bars"]
    fig, ax = plt.subplots(figsize=(6.4, 0.9 + 0.3 * len(bars)), layout="constrained")
    y = list(range(len(bars)))
    ax.barh(y, [b["cap_gib"] for b in bars], color=NEUTRAL, label=text("cap"))
    measures = sorted({b["measure"] for b in bars})
    ax.barh(y, [b["peak_gib"] for b in bars], color=series_style(0)["color"], height=0.5,
            label=text(" / ".join(measures)))  # fmt: skip
    ax.set_yticks(y, [text(b["label"]) for b in bars], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(text("GiB"))
    ax.set_title(title(data))
    fig.legend(loc="outside lower center", ncol=2)
    return fig


def _newest_suite(frame: pd.DataFrame, suite: str) -> pd.DataFrame:
    rows = newest(frame)
    return rows[rows["suite"] == suite] if not rows.empty else rows


def kernel_bandwidth(frame: pd.DataFrame) -> dict | None:
    """Achieved bandwidth of every timed kernel variant as % of the measured copy bandwidth; receipts marked
    `"comparable": false` (the Triton interpreter on a CPU) are left out."""
    bars = []
    for row in _newest_suite(frame, "kernels").itertuples():
        receipt = row.receipt
        fraction = receipt["derived"].get("fraction_of_copy")
        if fraction is None or receipt["config"].get("comparable") is False:
            continue
        cfg = receipt["config"]
        label = f"{cfg['op']}.{cfg['variant']} {cfg['shape']['name']}"
        bars.append({"label": label, "hardware_id": row.hardware_id, "percent_of_copy": 100 * fraction,
                     "achieved_gbs": receipt["derived"]["achieved_gbs"],
                     "copy_gbs": receipt["derived"]["copy_bandwidth_gbs"], "receipt": row.path})  # fmt: skip
    if not bars:
        return None
    bars.sort(key=lambda b: (b["hardware_id"], natural_key(b["label"])))
    return {"title": "Kernel bandwidth, % of measured copy bandwidth", "bars": bars}


def draw_kernel_bandwidth(data: dict) -> plt.Figure:
    bars = data["bars"]
    fig, ax = plt.subplots(figsize=(7.2, 1.0 + 0.3 * len(bars)), layout="constrained")
    y = list(range(len(bars)))
    hardware = sorted({b["hardware_id"] for b in bars})
    colors = [series_style(hardware.index(b["hardware_id"]))["color"] for b in bars]
    ax.barh(y, [b["percent_of_copy"] for b in bars], color=colors)
    ax.set_yticks(y, [text(b["label"]) for b in bars], fontsize=6)
    ax.invert_yaxis()
    ax.axvline(100, color="#222222", linewidth=0.8, linestyle="--")
    if len(hardware) > 1:
        _key(ax, hardware, fontsize=6, loc="lower right")
    ax.set_xlabel(text("% of copy bandwidth (Triton-interpreter runs on a CPU excluded)"))
    ax.set_title(title(data))
    ax.grid(axis="x", alpha=0.3)
    return fig


def _plan_order(plan: dict) -> tuple[str, int]:
    return plan["name"], plan["group_size"]


def plan_weight_bytes(frame: pd.DataFrame) -> dict | None:
    """Stored bytes of Kimi-Linear-48B per tensor class under each plan and group size (the accuracy
    receipts' `full_weight_bytes_*`; one bar per plan, whichever model the receipt measured)."""
    plans: dict[tuple, dict] = {}
    for row in _newest_suite(frame, "accuracy").itertuples():
        derived = row.receipt["derived"]
        parts = {
            k.removeprefix("full_weight_bytes_"): v
            for k, v in derived.items()
            if k.startswith("full_weight_bytes_")
        }
        if parts:
            plan = row.receipt["config"]["plan"]
            plans.setdefault(_plan_order(plan), {"plan": plan_label(plan), "gb": {k: v / 1e9 for k, v in sorted(parts.items())},
                                                 "hardware_id": row.hardware_id, "receipt": row.path})  # fmt: skip
    if not plans:
        return None
    return {"title": "Kimi-Linear-48B stored weight bytes by tensor class, per plan",
            "plans": [plans[k] for k in sorted(plans)]}  # fmt: skip


def _stacked_bars(
    ax: plt.Axes,
    labels: list[str],
    parts: list[dict[str, float]],
    keys: list[str],
    fontsize: float | None = None,
) -> None:
    """One horizontal bar per label, made of its `parts` in `keys` order (one style per key), top down."""
    y = list(range(len(labels)))
    left = [0.0] * len(labels)
    for i, key in enumerate(keys):
        widths = [p.get(key, 0.0) for p in parts]
        style = series_style(i)
        ax.barh(y, widths, left=left, color=style["color"], hatch=style["hatch"], edgecolor="white",
                linewidth=0.3, label=text(key))  # fmt: skip
        left = [a + w for a, w in zip(left, widths, strict=True)]
    ax.set_yticks(y, [text(label) for label in labels], fontsize=fontsize)
    ax.invert_yaxis()


def draw_plan_weight_bytes(data: dict) -> plt.Figure:
    plans = data["plans"]
    # Largest class first; equal sizes by name, so the order (and so the colours) never depends on a hash.
    classes = sorted(
        {c for p in plans for c in p["gb"]}, key=lambda c: (-max(p["gb"].get(c, 0) for p in plans), c)
    )
    fig, ax = plt.subplots(figsize=(7.2, 1.2 + 0.4 * len(plans)), layout="constrained")
    _stacked_bars(ax, [p["plan"] for p in plans], [p["gb"] for p in plans], classes)
    ax.set_xlabel(text("GB (1e9 bytes)"))
    ax.set_title(title(data))
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(axis="x", alpha=0.3)
    return fig


def quantisation_quality(frame: pd.DataFrame) -> dict | None:
    """Mean / max KL and top-1 agreement of each plan and group size, per model, weights and hardware."""
    points = []
    for row in _newest_suite(frame, "accuracy").itertuples():
        receipt = row.receipt
        derived, cfg = receipt["derived"], receipt["config"]
        points.append({"plan": plan_label(cfg["plan"]), "order": _plan_order(cfg["plan"]),
                       "model": f"{cfg['model']}, {weights_label(cfg)}",
                       "kl_mean_nats": derived["kl_mean_nats"], "kl_max_nats": derived["kl_max_nats"],
                       "top1_agreement": derived["top1_agreement"], "hardware_id": row.hardware_id,
                       "receipt": row.path})  # fmt: skip
    if not points:
        return None
    points.sort(key=lambda p: (p["model"], p["hardware_id"], p["order"]))
    return {"title": "Quantised vs unquantised: next-token KL and top-1 agreement", "points": points}


def draw_quantisation_quality(data: dict) -> plt.Figure:
    points = data["points"]
    fig, (kl, top1) = plt.subplots(
        1, 2, figsize=(9.0, 1.4 + 0.4 * len(points)), sharey=True, layout="constrained"
    )
    y = list(range(len(points)))
    models = sorted({p["model"] for p in points})
    labels = [text(p["plan"] + (f"\n{p['model']}" if len(models) > 1 else "")) for p in points]
    kl.barh(y, [p["kl_mean_nats"] for p in points], color=series_style(0)["color"], label=text("mean"))
    kl.scatter([p["kl_max_nats"] for p in points], y, color=series_style(3)["color"], marker="|", s=80,
               label=text("max"), zorder=3)  # fmt: skip
    kl.set_xlabel(text("KL(unquantised ‖ quantised), nats"))
    kl.legend(fontsize=7)
    top1.barh(y, [p["top1_agreement"] for p in points], color=series_style(2)["color"])
    top1.set_xlim(0, 1)
    top1.set_xlabel(text("top-1 agreement"))
    kl.set_yticks(y, labels, fontsize=6)
    kl.invert_yaxis()
    for ax in (kl, top1):
        ax.grid(axis="x", alpha=0.3, which="both")
    fig.suptitle(title(data | {"title": data["title"] + (f" — {models[0]}" if len(models) == 1 else "")}))
    return fig


def llamacpp_vs_engine(frame: pd.DataFrame) -> dict | None:
    """Decode and prefill tokens/s (medians) of our engine, llama-bench and llama-server on each GGUF type,
    from the llama.cpp receipts (which carry the engine's medians of the same run)."""
    groups: dict[tuple, dict] = {}
    for row in _newest_suite(frame, "llamacpp").itertuples():
        receipt = row.receipt
        if "gguf_type" not in receipt["config"]:
            continue
        cfg, med = receipt["config"], {k: v["median"] for k, v in receipt["summary"].items()}
        label = (f"{cfg['model']}, {weights_label(cfg)}: prompt {cfg['prompt_tokens']}, "
                 f"{cfg['generated_tokens']} generated, {cfg['threads']} thread(s)")  # fmt: skip
        group = groups.setdefault(
            (label, row.hardware_id), {"label": label, "hardware_id": row.hardware_id, "bars": {}}
        )
        engine = f"engine {cfg['engine'].get('label', cfg['engine']['dtype'])}"  # dense / INT4 counterpart
        group["bars"][engine] = {
            "decode_tok_s": receipt["derived"]["engine_decode_tok_s"],
            "prefill_tok_s": receipt["derived"]["engine_prefill_tok_s"],
            "receipt": row.path,
        }
        group["bars"][f"llama-bench {cfg['gguf_type']}"] = {
            "decode_tok_s": med["tg_tok_s"],
            "prefill_tok_s": med["pp_tok_s"],
            "receipt": row.path,
        }
        group["bars"][f"llama-server {cfg['gguf_type']}"] = {"decode_tok_s": med["server_decode_tok_s"],
                                                             "prefill_tok_s": med["server_prompt_tok_s"],
                                                             "receipt": row.path}  # fmt: skip
    if not groups:
        return None
    series = [g | {"bars": [{"name": k, **v} for k, v in sorted(g["bars"].items())]}
              for _, g in sorted(groups.items())]  # fmt: skip
    return {
        "title": "Same model, same machine: our engine against llama.cpp (median tokens/s)",
        "series": series,
    }


def draw_llamacpp(data: dict) -> plt.Figure:
    rows = [(s, b) for s in data["series"] for b in s["bars"]]
    fig, axes = plt.subplots(1, 2, figsize=(9.0, 1.6 + 0.4 * len(rows)), sharey=True, layout="constrained")
    y = list(range(len(rows)))
    kinds = ["engine", "llama-bench", "llama-server"]
    colors = [series_style(kinds.index(b["name"].split(" ")[0]))["color"] for _, b in rows]
    for ax, metric, name in zip(axes, ("decode_tok_s", "prefill_tok_s"), ("decode", "prefill"), strict=True):
        values = [b[metric] for _, b in rows]
        ax.barh(y, values, color=colors)
        for yi, value in zip(y, values, strict=True):
            ax.annotate(f"{value:.4g}", (value, yi), xytext=(3, 0), textcoords="offset points", va="center",
                        fontsize=7)  # fmt: skip
        ax.set_xlim(0, max(values) * 1.18)
        ax.set_xlabel(text(f"{name} tokens/s"))
        ax.grid(axis="x", alpha=0.3)
    several = len(data["series"]) > 1
    axes[0].set_yticks(
        y, [text(b["name"] + (f"\n{s['label']}" if several else "")) for s, b in rows], fontsize=7
    )
    axes[0].invert_yaxis()
    heading = data["title"] if several else f"{data['title']}\n{data['series'][0]['label']}"
    fig.suptitle(title(data | {"title": heading}))
    return fig


def decode_time_split(frame: pd.DataFrame) -> dict | None:
    """Median milliseconds per decode step spent in each model component, per profile receipt."""
    rows = _newest_suite(frame, "profile")
    bars = [
        {
            "label": row.name,
            "parts": {k: v["median"] for k, v in row.receipt["summary"].items()},
            "hardware_id": row.hardware_id,
            "receipt": row.path,
        }
        for row in sorted(rows.itertuples(), key=lambda r: (natural_key(r.name), r.hardware_id))
    ]
    return {"title": "Where a decode step's time goes (median ms per step)", "bars": bars} if bars else None


def draw_time_split(data: dict) -> plt.Figure:
    bars = data["bars"]
    components = list(dict.fromkeys(k for b in bars for k in b["parts"]))
    fig, ax = plt.subplots(figsize=(8.4, 1.8 + 0.6 * len(bars)), layout="constrained")
    _stacked_bars(ax, [b["label"] for b in bars], [b["parts"] for b in bars], components, fontsize=7)
    ax.set_xlabel(text("ms per decode step"))
    ax.set_title(title(data))
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def proxy_turn_steps(frame: pd.DataFrame) -> dict | None:
    """Where one proxied streamed turn's k3 time goes: the median µs of each step (`micro` receipts
    of benchmarks/test_k3_turn.py), stacked in the order k3 runs them, one bar per dialect."""
    bars: dict[tuple[str, str], dict] = {}
    for row in _newest_suite(frame, "micro").itertuples():
        cfg = row.receipt["config"]
        if cfg.get("area") != "k3" or "step" not in cfg:
            continue
        bar = bars.setdefault(
            (cfg["dialect"], row.hardware_id),
            {"label": f"{cfg['dialect']} ({cfg['capture']})", "hardware_id": row.hardware_id, "steps": {},
             "receipts": {}},
        )  # fmt: skip
        bar["steps"][cfg["step"]] = (cfg["step_index"], row.receipt["summary"]["call_us"]["median"])
        bar["receipts"][cfg["step"]] = row.path
    if not bars:
        return None
    out = []
    for key in sorted(bars):
        bar = bars[key]
        ordered = sorted(bar["steps"].items(), key=lambda item: item[1][0])
        parts = {step: median for step, (_, median) in ordered}
        out.append({"label": bar["label"], "hardware_id": bar["hardware_id"], "parts": parts,
                    "total_us": sum(parts.values()), "receipts": bar["receipts"]})  # fmt: skip
    return {"title": "Where a proxied turn's microseconds go (median µs per step, streamed tool-call turn)",
            "bars": out}  # fmt: skip


def draw_turn_steps(data: dict) -> plt.Figure:
    bars = data["bars"]
    steps = list(dict.fromkeys(k for b in bars for k in b["parts"]))
    fig, ax = plt.subplots(figsize=(8.4, 1.8 + 0.6 * len(bars)), layout="constrained")
    _stacked_bars(ax, [b["label"] for b in bars], [b["parts"] for b in bars], steps, fontsize=7)
    for y, bar in enumerate(bars):
        ax.annotate(text(f"{bar['total_us']:.4g} µs"), (bar["total_us"], y), xytext=(3, 0),
                    textcoords="offset points", va="center", fontsize=7)  # fmt: skip
    ax.set_xlim(0, max(b["total_us"] for b in bars) * 1.15)
    ax.set_xlabel(text("µs of k3 code per turn (sum of the step medians)"))
    ax.set_title(title(data))
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def perplexity_vs_bits(frame: pd.DataFrame) -> dict | None:
    """Held-out perplexity against stored bits per weight on trained (or real) weights: our INT4 plans and
    llama.cpp's quants of the same checkpoint, on the same tokens (`harness.quality` chooses the panels)."""
    panels = quality_panels(newest(frame))
    if not panels:
        return None
    return {"title": "Held-out perplexity against bits per weight (trained weights)", "panels": panels}


def draw_perplexity_vs_bits(data: dict) -> plt.Figure:
    """One panel per checkpoint (each its own perplexity scale): the Pareto frontier of both toolchains
    joined, every llama.cpp quant and our plans on the frontier labelled, our other plans faded and
    unlabelled (RESULTS.md's table names each)."""
    panels = data["panels"]
    fig, axes = plt.subplots(1, len(panels), figsize=(1.0 + 5.2 * len(panels), 4.4), layout="constrained",
                             squeeze=False)  # fmt: skip
    labels = []
    for ax, panel in zip(axes[0], panels, strict=True):
        points = panel["points"]
        for index, source in enumerate((OURS, LLAMA_CPP)):
            style = {
                "color": series_style(index)["color"],
                "marker": "o" if source == OURS else "s",
                "zorder": 3,
            }
            shown = [p for p in points if p["source"] == source and (p["frontier"] or source == LLAMA_CPP)]
            faded = [p for p in points if p["source"] == source and p not in shown]
            ax.scatter([p["bits_per_weight"] for p in shown], [p["perplexity"] for p in shown],
                       label=text(source), **style)  # fmt: skip
            ax.scatter([p["bits_per_weight"] for p in faded], [p["perplexity"] for p in faded], alpha=0.4,
                       **style)  # fmt: skip
            # Labels above for llama.cpp, alternately above and below for our frontier, then parted from
            # each other and from the markers (part_labels).
            for i, p in enumerate(shown):
                offset = (4, -9) if source == OURS and i % 2 else (4, 4)
                labels.append(ax.annotate(text(p["label"]), (p["bits_per_weight"], p["perplexity"]),
                                          fontsize=6, xytext=offset, textcoords="offset points",
                                          arrowprops=LEADER))  # fmt: skip
        frontier = [p for p in points if p["frontier"]]
        ax.plot([p["bits_per_weight"] for p in frontier], [p["perplexity"] for p in frontier], color=NEUTRAL,
                linewidth=0.8, label=text("Pareto frontier"), zorder=2)  # fmt: skip
        # Bits on a log scale: the quants crowd between 4 and 6 bits, F16 sits at 16.
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(matplotlib.ticker.FixedLocator([4, 5, 6, 8, 12, 16]))
        ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        if panel["reference"] is not None:
            ax.axhline(panel["reference"], color=NEUTRAL, linewidth=0.8, linestyle="--",
                       label=text("unquantised"))  # fmt: skip
        ax.set_title(text(panel["panel"]), fontsize=8)
        ax.set_xlabel(text("stored bits per weight (every tensor counted)"))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    axes[0][0].set_ylabel(text("held-out perplexity"))
    fig.suptitle(title(data))
    part_labels(fig, labels)
    return fig


def _serve_series(frame: pd.DataFrame) -> dict[tuple[str, str, str], list]:
    """Closed-loop `serve` receipts (a concurrency, no rate) grouped per (endpoint label, dialect,
    hardware), x rising."""
    series: dict[tuple[str, str, str], list] = {}
    for row in _newest_suite(frame, "serve").itertuples():
        cfg = row.receipt["config"]
        if cfg.get("rate") is None and cfg.get("concurrency"):
            series.setdefault((cfg["label"], cfg["dialect"], row.hardware_id), []).append(row)
    return {
        key: sorted(rows, key=lambda r: r.receipt["config"]["concurrency"])
        for key, rows in sorted(series.items())
    }


def _median(receipt: dict, metric: str) -> float | None:
    stats = receipt["summary"].get(metric)
    return stats["median"] if stats else None


def serve_latency(frame: pd.DataFrame) -> dict | None:
    """Median TTFT, TPOT and E2E against concurrency, one line per (endpoint, dialect) of `serve` receipts."""
    lines = []
    for (label, dialect, hardware_id), rows in _serve_series(frame).items():
        points = [{"concurrency": r.receipt["config"]["concurrency"], "receipt": r.path,
                   **{m: _median(r.receipt, m) for m in ("ttft_ms", "tpot_ms", "e2e_ms")},
                   "errors": r.receipt["derived"]["errors"]} for r in rows]  # fmt: skip
        lines.append({"label": f"{label} · {dialect}", "hardware_id": hardware_id, "points": points})
    if not lines:
        return None
    return {"title": "Serving latency against concurrency (medians of successful requests)", "series": lines}


def draw_serve_latency(data: dict) -> plt.Figure:
    fig, axes = plt.subplots(1, 3, figsize=(10.0, 3.8), layout="constrained")
    for i, line in enumerate(data["series"]):
        style = series_style(i)
        for ax, key in zip(axes, ("ttft_ms", "tpot_ms", "e2e_ms"), strict=True):
            points = [p for p in line["points"] if p[key] is not None]
            ax.plot([p["concurrency"] for p in points], [p[key] for p in points], marker=style["marker"],
                    color=style["color"], label=text(line["label"]))  # fmt: skip
    for ax, label in zip(axes, ("TTFT (ms)", "TPOT (ms)", "end-to-end latency (ms)"), strict=True):
        _log2_axes(ax, "concurrent requests", label)
    axes[0].legend(fontsize=6)
    fig.suptitle(title(data))
    return fig


def serve_pareto(frame: pd.DataFrame) -> dict | None:
    """Output tok/s per user (1000 / median TPOT) against the system's output tok/s, one line per
    (endpoint, dialect) through its concurrency levels: the throughput-interactivity trade-off."""
    lines = []
    for (label, dialect, hardware_id), rows in _serve_series(frame).items():
        points = [{"concurrency": r.receipt["config"]["concurrency"], "receipt": r.path,
                   "system_tok_s": r.receipt["derived"]["output_tok_s"],
                   "user_tok_s": r.receipt["derived"]["tok_s_per_user"]}
                  for r in rows if "tok_s_per_user" in r.receipt["derived"]]  # fmt: skip
        if points:
            lines.append({"label": f"{label} · {dialect}", "hardware_id": hardware_id, "points": points})
    if not lines:
        return None
    return {"title": "Serving Pareto: output tok/s per user against system output tok/s", "series": lines}


def draw_serve_pareto(data: dict) -> plt.Figure:
    fig, ax = plt.subplots(figsize=(6.4, 4.4), layout="constrained")
    for i, line in enumerate(data["series"]):
        style = series_style(i)
        xs = [p["system_tok_s"] for p in line["points"]]
        ys = [p["user_tok_s"] for p in line["points"]]
        ax.plot(xs, ys, marker=style["marker"], color=style["color"], label=text(line["label"]))
        for p in line["points"]:
            ax.annotate(text(f"c{p['concurrency']}"), (p["system_tok_s"], p["user_tok_s"]), fontsize=6,
                        xytext=(3, 3), textcoords="offset points")  # fmt: skip
    ax.set_xlabel(text("system output tok/s"))
    ax.set_ylabel(text("output tok/s per user (1000 / median TPOT)"))
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)
    ax.set_title(title(data))
    return fig


FIGURES: list[Figure] = [
    Figure(
        "harness_selfcheck",
        suite_medians("harness", "encode_us", "Harness self-check: encoding one SSE event", "time per event"),
        draw_bars,
    ),
    Figure("decode_throughput", decode_throughput, draw_decode),
    Figure("batching_concurrency", batching_concurrency, draw_batching),
    Figure("memory_headroom", memory_headroom, draw_headroom),
    Figure("decode_time_split", decode_time_split, draw_time_split),
    Figure(
        "proxy_overhead",
        suite_medians(
            "proxy", "added_ms", "Latency k3 adds per turn, through the proxy minus direct", "added latency"
        ),
        draw_bars,
    ),
    Figure("proxy_vs_peers", proxy_vs_peers, draw_bars),
    Figure("proxy_load", proxy_load, draw_proxy_load),
    Figure("proxy_turn_steps", proxy_turn_steps, draw_turn_steps),
    Figure("kernel_bandwidth", kernel_bandwidth, draw_kernel_bandwidth),
    Figure("plan_weight_bytes", plan_weight_bytes, draw_plan_weight_bytes),
    Figure("quantisation_quality", quantisation_quality, draw_quantisation_quality),
    Figure("llamacpp_vs_engine", llamacpp_vs_engine, draw_llamacpp),
    Figure("perplexity_vs_bits", perplexity_vs_bits, draw_perplexity_vs_bits),
    Figure("serve_latency", serve_latency, draw_serve_latency),
    Figure("serve_pareto", serve_pareto, draw_serve_pareto),
]


def _leaves(data: Any, key: str) -> list:
    """Every value stored under `key` anywhere in the figure's data, in order."""
    if isinstance(data, dict):
        return [v for k, v in data.items() if k == key] + [x for v in data.values() for x in _leaves(v, key)]
    if isinstance(data, list):
        return [x for v in data for x in _leaves(v, key)]
    return []


def _annotate(data: dict, frame: pd.DataFrame) -> dict:
    """Name the hardware once when a single machine is shown, and add the caption: which receipts (short
    ids), measured at which commits, on which hardware."""
    by_path = {row.path: row for row in frame.itertuples()}
    rows = [by_path[p] for p in dict.fromkeys(_leaves(data, "receipt"))]
    hardware = sorted({row.hardware_id for row in rows})
    commits = sorted({row.commit for row in rows})
    ids = ", ".join(short_id(row.receipt) for row in sorted(rows, key=lambda r: r.path))
    caption = (f"{data['title']}. Hardware: {', '.join(hardware)}. {len(rows)} receipt(s) under results/: {ids}. "
               f"Commit(s): {', '.join(commits)}. Regenerate with `python scripts/make_figures.py`.")  # fmt: skip
    if len(hardware) > 1:  # several machines: each series names its own
        data = data | {key: [_with_hardware(item) for item in data[key]]
                       for key in ("series", "bars", "points") if isinstance(data.get(key), list)}  # fmt: skip
    return data | {"hardware": hardware[0] if len(hardware) == 1 else None, "caption": caption}


def _with_hardware(item: dict) -> dict:
    if isinstance(item, dict) and "hardware_id" in item and "label" in item:
        return item | {"label": f"{item['label']} · {item['hardware_id']}"}
    return item


def build_all(results_dir: Path | None = None) -> dict[str, dict]:
    """Every figure's data from the receipts (figures no receipt feeds are left out)."""
    frame = load_frame(results_dir)
    out = {}
    for figure in FIGURES:
        data = figure.build(frame)
        if data is not None:
            out[figure.name] = _annotate(data, frame)
    return out


def data_json(data: dict) -> str:
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def write_all(results_dir: Path | None = None, out_dir: Path | None = None) -> list[Path]:
    """Regenerate every figure: <name>.png, <name>.pdf and <name>.json in docs/figures/."""
    check_renderer()
    out_dir = Path(out_dir or FIGURES_DIR)
    out_dir.mkdir(parents=True, exist_ok=True)
    by_name = {f.name: f for f in FIGURES}
    written = []
    for name, data in build_all(results_dir).items():
        with plt.rc_context(STYLE):
            fig = by_name[name].draw(data)
            written += save(fig, out_dir / name, heading(data), data["caption"])
        (out_dir / f"{name}.json").write_text(data_json(data))
        written.append(out_dir / f"{name}.json")
    return written
