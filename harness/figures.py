"""Figures regenerated from receipts only, written as PNG + PDF + the JSON data they plot.

A figure is a `build(frame) -> data | None` (pure data taken from receipts; None when no receipt feeds it)
and a `draw(data) -> Figure`. The JSON sidecar is what the audit compares with a fresh build, so stale
figures fail it. Output is byte-deterministic for the same receipts: fixed font, no timestamps in files.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from harness.hardware import REPO_ROOT  # noqa: E402
from harness.report import accuracy_weights_kind, load_frame, newest  # noqa: E402

FIGURES_DIR = REPO_ROOT / "docs" / "figures"
STYLE = {
    "font.family": "DejaVu Sans",  # ships with matplotlib: same glyphs on every machine
    "font.size": 9,
    "svg.hashsalt": "local-kimi",
    "figure.dpi": 100,
    "savefig.dpi": 150,
}
PNG_METADATA = {"Software": None}
PDF_METADATA = {"Creator": None, "Producer": None, "CreationDate": None}


@dataclass(frozen=True)
class Figure:
    name: str
    build: Callable[[pd.DataFrame], dict | None]
    draw: Callable[[dict], plt.Figure]


def _bar(label: str, row: Any, metric: str) -> dict:
    """One bar of `draw_bars`: a receipt row's median and p10/p90 of `metric`, its unit and path."""
    stats = row.receipt["summary"][metric]
    return {"label": label, "median": stats["median"], "p10": stats["p10"], "p90": stats["p90"],
            "unit": row.receipt["units"][metric], "receipt": row.path}  # fmt: skip


def suite_medians(suite: str, metric: str) -> Callable[[pd.DataFrame], dict | None]:
    """Median and p10/p90 of one metric for every (name, hardware) of a suite, newest receipts."""

    def build(frame: pd.DataFrame) -> dict | None:
        rows = newest(frame)
        rows = rows[rows["suite"] == suite]
        bars = []
        for row in rows.itertuples():
            if metric not in row.receipt["summary"]:
                continue
            bars.append(_bar(f"{row.name}\n{row.hardware_id}", row, metric))
        if not bars:
            return None
        return {"title": f"{suite}: {metric} (median, p10–p90)", "metric": metric, "bars": bars}

    return build


def draw_bars(data: dict) -> plt.Figure:
    bars = data["bars"]
    fig, ax = plt.subplots(figsize=(6.4, 0.9 + 0.6 * len(bars)))
    y = range(len(bars))
    medians = [b["median"] for b in bars]
    errors = [[b["median"] - b["p10"] for b in bars], [b["p90"] - b["median"] for b in bars]]
    ax.barh(list(y), medians, xerr=errors, color="#3b6ea5", ecolor="#222222", capsize=3)
    ax.set_yticks(list(y), [b["label"] for b in bars])
    ax.invert_yaxis()
    ax.set_xlabel(f"{data['metric']} ({bars[0]['unit']})")
    ax.set_title(data["title"])
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def proxy_vs_peers(frame: pd.DataFrame) -> dict | None:
    """Latency k3 and each peer proxy add to the same turn over loopback (`proxy-peers` receipts)."""
    rows = newest(frame)
    rows = rows[(rows["suite"] == "proxy") & rows["name"].str.startswith("peers.")]
    bars = []
    for row in rows.sort_values("name").itertuples():
        receipt = row.receipt
        for proxy in ("k3", *sorted(receipt["config"]["peers"])):
            if f"{proxy}_added_ms" in receipt["summary"]:  # else the proxy does not support this dialect
                label = f"{row.name.removeprefix('peers.')} · {proxy}\n{row.hardware_id}"
                bars.append(_bar(label, row, f"{proxy}_added_ms"))
    if not bars:
        return None
    return {"title": "Added per turn over loopback (median, p10–p90)", "metric": "added",
            "bars": bars}  # fmt: skip


def decode_throughput(frame: pd.DataFrame) -> dict | None:
    """Decode tok/s against context length, one line per (model, dtype, batch, hardware), with its roofline."""
    rows = newest(frame)
    rows = rows[rows["suite"] == "decode"]
    series: dict[str, dict] = {}
    for row in rows.itertuples():
        receipt = row.receipt
        cfg = receipt["config"]
        label = f"{cfg['model']} {cfg['dtype']} b{cfg['batch']} · {row.hardware_id}"
        line = series.setdefault(label, {"label": label, "points": []})
        line["points"].append(
            {
                "context": cfg["context"],
                "tok_s": receipt["summary"]["decode_tok_s"]["median"],
                "roofline_tok_s": receipt["derived"]["roofline_tok_s"],
                "receipt": row.path,
            }
        )
    if not series:
        return None
    for line in series.values():
        line["points"].sort(key=lambda p: p["context"])
    return {"title": "Decode tokens/s by context (median; dashed: roofline)",
            "series": sorted(series.values(), key=lambda s: s["label"])}  # fmt: skip


def draw_decode(data: dict) -> plt.Figure:
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for i, line in enumerate(data["series"]):
        color = f"C{i % 10}"
        xs = [p["context"] for p in line["points"]]
        ax.plot(xs, [p["tok_s"] for p in line["points"]], marker="o", color=color, label=line["label"])
        ax.plot(xs, [p["roofline_tok_s"] for p in line["points"]], linestyle="--", color=color, alpha=0.6)
    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("decode tokens/s")
    ax.set_title(data["title"])
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def memory_headroom(frame: pd.DataFrame) -> dict | None:
    """Peak memory of every newest receipt that ran under a cap, against that cap."""
    rows = newest(frame)
    bars = []
    for row in rows.itertuples():
        mem = row.receipt["memory_cap"]
        if not mem or mem.get("cap_gib") is None:
            continue
        peak = mem.get("peak_reserved_gib", mem["peak_rss_gib"])
        bars.append({"label": f"{row.name}\n{row.hardware_id}", "peak_gib": peak, "cap_gib": mem["cap_gib"],
                     "measure": "peak reserved" if "peak_reserved_gib" in mem else "peak RSS",
                     "receipt": row.path})  # fmt: skip
    if not bars:
        return None
    return {"title": "Peak memory against the cap", "bars": bars}


def draw_headroom(data: dict) -> plt.Figure:
    bars = data["bars"]
    fig, ax = plt.subplots(figsize=(6.4, 0.9 + 0.45 * len(bars)))
    y = list(range(len(bars)))
    ax.barh(y, [b["cap_gib"] for b in bars], color="#dddddd", label="cap")
    ax.barh(y, [b["peak_gib"] for b in bars], color="#3b6ea5", height=0.5, label="peak")
    ax.set_yticks(y, [b["label"] for b in bars], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("GiB")
    ax.set_title(data["title"])
    ax.legend(fontsize=7)
    fig.tight_layout()
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
    bars.sort(key=lambda b: (b["hardware_id"], b["label"]))
    return {
        "title": "Kernel bandwidth, % of measured copy bandwidth",
        "bars": bars,
    }


def draw_kernel_bandwidth(data: dict) -> plt.Figure:
    bars = data["bars"]
    fig, ax = plt.subplots(figsize=(7.2, 1.0 + 0.3 * len(bars)), layout="constrained")
    y = list(range(len(bars)))
    hardware = sorted({b["hardware_id"] for b in bars})
    colors = [f"C{hardware.index(b['hardware_id']) % 10}" for b in bars]
    ax.barh(y, [b["percent_of_copy"] for b in bars], color=colors)
    ax.set_yticks(y, [b["label"] for b in bars], fontsize=6)
    ax.invert_yaxis()
    ax.axvline(100, color="#222222", linewidth=0.8, linestyle="--")
    for i, hw in enumerate(hardware):
        ax.barh([], [], color=f"C{i % 10}", label=hw)
    ax.legend(fontsize=6, loc="lower right")
    ax.set_xlabel("% of copy bandwidth (Triton-interpreter runs on a CPU excluded)")
    ax.set_title(data["title"])
    ax.grid(axis="x", alpha=0.3)
    return fig


def _plan_label(plan: dict) -> str:
    return f"{plan['name']} g{plan['group_size']}"


def _plan_order(plan: dict) -> tuple[str, int]:
    return plan["name"], plan["group_size"]


def plan_weight_bytes(frame: pd.DataFrame) -> dict | None:
    """Stored bytes of Kimi-Linear-48B per tensor class under each plan and group size (the accuracy
    receipts' `full_weight_bytes_*`; one bar per plan, whichever model the receipt measured)."""
    plans: dict[str, dict] = {}
    for row in _newest_suite(frame, "accuracy").itertuples():
        derived = row.receipt["derived"]
        parts = {
            k.removeprefix("full_weight_bytes_"): v
            for k, v in derived.items()
            if k.startswith("full_weight_bytes_")
        }
        if parts:
            plan = row.receipt["config"]["plan"]
            plans.setdefault(_plan_order(plan), {"plan": _plan_label(plan), "gb": {k: v / 1e9 for k, v in sorted(parts.items())},
                                     "receipt": row.path})  # fmt: skip
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
    """One horizontal bar per label, made of its `parts` in `keys` order (one colour per key), top down."""
    y = list(range(len(labels)))
    left = [0.0] * len(labels)
    for i, key in enumerate(keys):
        widths = [p.get(key, 0.0) for p in parts]
        ax.barh(y, widths, left=left, color=f"C{i % 10}", label=key)
        left = [a + w for a, w in zip(left, widths, strict=True)]
    ax.set_yticks(y, labels, fontsize=fontsize)
    ax.invert_yaxis()


def draw_plan_weight_bytes(data: dict) -> plt.Figure:
    plans = data["plans"]
    classes = sorted(
        {c for p in plans for c in p["gb"]}, key=lambda c: -max(p["gb"].get(c, 0) for p in plans)
    )
    fig, ax = plt.subplots(figsize=(7.2, 1.2 + 0.4 * len(plans)))
    _stacked_bars(ax, [p["plan"] for p in plans], [p["gb"] for p in plans], classes)
    ax.set_xlabel("GB (1e9 bytes)")
    ax.set_title(data["title"])
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def quantisation_quality(frame: pd.DataFrame) -> dict | None:
    """Mean / max KL and top-1 agreement of each plan and group size, per model and hardware."""
    points = []
    for row in _newest_suite(frame, "accuracy").itertuples():
        receipt = row.receipt
        derived = receipt["derived"]
        points.append({"plan": _plan_label(receipt["config"]["plan"]), "order": _plan_order(receipt["config"]["plan"]),
                       "model": f"{receipt['config']['model']} ({accuracy_weights_kind(receipt)} weights) · {row.hardware_id}",
                       "kl_mean_nats": derived["kl_mean_nats"], "kl_max_nats": derived["kl_max_nats"],
                       "top1_agreement": derived["top1_agreement"], "receipt": row.path})  # fmt: skip
    if not points:
        return None
    points.sort(key=lambda p: (p["model"], p["order"]))
    return {"title": "Quantised vs unquantised: next-token KL and top-1 agreement", "points": points}


def draw_quantisation_quality(data: dict) -> plt.Figure:
    points = data["points"]
    fig, (kl, top1) = plt.subplots(
        1, 2, figsize=(9.0, 1.4 + 0.4 * len(points)), sharey=True, layout="constrained"
    )
    y = list(range(len(points)))
    labels = [f"{p['plan']}\n{p['model']}" for p in points]
    kl.barh(y, [p["kl_mean_nats"] for p in points], color="#3b6ea5", label="mean")
    kl.scatter(
        [p["kl_max_nats"] for p in points], y, color="#c44e52", marker="|", s=80, label="max", zorder=3
    )
    kl.set_xlabel("KL(unquantised ‖ quantised), nats")
    kl.legend(fontsize=7)
    top1.barh(y, [p["top1_agreement"] for p in points], color="#55a868")
    top1.set_xlim(0, 1)
    top1.set_xlabel("top-1 agreement")
    kl.set_yticks(y, labels, fontsize=6)
    kl.invert_yaxis()
    for ax in (kl, top1):
        ax.grid(axis="x", alpha=0.3, which="both")
    fig.suptitle(data["title"])
    return fig


def llamacpp_vs_engine(frame: pd.DataFrame) -> dict | None:
    """Decode and prefill tokens/s (medians) of our engine, llama-bench and llama-server on each GGUF type,
    from the llama.cpp receipts (which carry the engine's medians of the same run)."""
    groups: dict[str, dict] = {}
    for row in _newest_suite(frame, "llamacpp").itertuples():
        receipt = row.receipt
        if "gguf_type" not in receipt["config"]:
            continue
        cfg, med = receipt["config"], {k: v["median"] for k, v in receipt["summary"].items()}
        key = f"{cfg['model']} p{cfg['prompt_tokens']} n{cfg['generated_tokens']} t{cfg['threads']} · {row.hardware_id}"
        group = groups.setdefault(key, {"label": key, "bars": {}})
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
    series = [{"label": g["label"], "bars": [{"name": k, **v} for k, v in sorted(g["bars"].items())]}
              for _, g in sorted(groups.items())]  # fmt: skip
    return {
        "title": "Same model, same machine: our engine against llama.cpp (median tokens/s)",
        "series": series,
    }


def draw_llamacpp(data: dict) -> plt.Figure:
    rows = [(s["label"], b) for s in data["series"] for b in s["bars"]]
    fig, axes = plt.subplots(1, 2, figsize=(9.0, 1.4 + 0.45 * len(rows)), sharey=True, layout="constrained")
    y = list(range(len(rows)))
    colors = ["#c44e52" if b["name"].startswith("engine") else "#3b6ea5" for _, b in rows]
    for ax, metric, title in zip(axes, ("decode_tok_s", "prefill_tok_s"), ("decode", "prefill"), strict=True):
        values = [b[metric] for _, b in rows]
        ax.barh(y, values, color=colors)
        for yi, value in zip(y, values, strict=True):
            ax.annotate(f"{value:.4g}", (value, yi), xytext=(3, 0), textcoords="offset points", va="center",
                        fontsize=7)  # fmt: skip
        ax.set_xlim(0, max(values) * 1.15)
        ax.set_xlabel(f"{title} tokens/s")
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(y, [f"{b['name']}\n{label}" for label, b in rows], fontsize=6)
    axes[0].invert_yaxis()
    fig.suptitle(data["title"])
    return fig


def decode_time_split(frame: pd.DataFrame) -> dict | None:
    """Median milliseconds per decode step spent in each model component, per profile receipt."""
    rows = newest(frame)
    rows = rows[rows["suite"] == "profile"]
    bars = [
        {
            "label": f"{row.name}\n{row.hardware_id}",
            "parts": {k: v["median"] for k, v in row.receipt["summary"].items()},
            "receipt": row.path,
        }
        for row in rows.itertuples()
    ]
    return {"title": "Where a decode step's time goes (median ms per step)", "bars": bars} if bars else None


def draw_time_split(data: dict) -> plt.Figure:
    bars = data["bars"]
    components = list(dict.fromkeys(k for b in bars for k in b["parts"]))
    fig, ax = plt.subplots(figsize=(8.4, 1.8 + 0.6 * len(bars)))
    _stacked_bars(ax, [b["label"] for b in bars], [b["parts"] for b in bars], components, fontsize=7)
    ax.set_xlabel("ms per decode step")
    ax.set_title(data["title"])
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return fig


def perplexity_vs_bits(frame: pd.DataFrame) -> dict | None:
    """Held-out perplexity against stored bits per weight on trained (or real) weights: our INT4 plans
    (accuracy receipts) and llama.cpp's quants (llamacpp_quality receipts) of the same checkpoint, on the
    same tokens. Random-weight receipts are left out (a stress test, not a model)."""
    series: dict[tuple[str, str], list[dict]] = {}
    references: dict[str, float] = {}
    for row in _newest_suite(frame, "accuracy").itertuples():
        receipt = row.receipt
        if accuracy_weights_kind(receipt) == "random" or "bits_per_weight" not in receipt["derived"]:
            continue
        model = f"{receipt['config']['model']} · {row.hardware_id}"
        references[model] = receipt["derived"]["perplexity_reference"]
        series.setdefault((model, "ours"), []).append(
            {"label": _plan_label(receipt["config"]["plan"]), "bits_per_weight": receipt["derived"]["bits_per_weight"],
             "perplexity": receipt["derived"]["perplexity_candidate"], "receipt": row.path})  # fmt: skip
    for row in _newest_suite(frame, "llamacpp_quality").itertuples():
        receipt = row.receipt
        if accuracy_weights_kind(receipt) == "random":
            continue
        model = f"{receipt['config']['model']} · {row.hardware_id}"
        series.setdefault((model, "llama.cpp"), []).append(
            {"label": receipt["config"]["gguf_type"].upper(), "bits_per_weight": receipt["derived"]["bits_per_weight"],
             "perplexity": receipt["derived"]["perplexity"], "receipt": row.path})  # fmt: skip
    if not series:
        return None
    out = [{"model": model, "source": source, "points": sorted(points, key=lambda p: p["bits_per_weight"])}
           for (model, source), points in sorted(series.items())]  # fmt: skip
    return {"title": "Held-out perplexity against bits per weight (trained weights)", "series": out,
            "references": [{"model": m, "perplexity": p} for m, p in sorted(references.items())]}  # fmt: skip


def draw_perplexity_vs_bits(data: dict) -> plt.Figure:
    fig, ax = plt.subplots(figsize=(7.2, 4.2), layout="constrained")
    models = sorted({s["model"] for s in data["series"]})
    for s in data["series"]:
        color = f"C{models.index(s['model']) % 10}"
        marker = "o" if s["source"] == "ours" else "s"
        xs, ys = [p["bits_per_weight"] for p in s["points"]], [p["perplexity"] for p in s["points"]]
        ax.scatter(xs, ys, color=color, marker=marker, label=f"{s['source']} · {s['model']}", zorder=3)
        for p in s["points"]:
            ax.annotate(p["label"], (p["bits_per_weight"], p["perplexity"]), fontsize=6,
                        xytext=(3, 3), textcoords="offset points")  # fmt: skip
    for ref in data["references"]:
        color = f"C{models.index(ref['model']) % 10}" if ref["model"] in models else "#222222"
        ax.axhline(ref["perplexity"], color=color, linewidth=0.8, linestyle="--",
                   label=f"unquantised · {ref['model']}")  # fmt: skip
    ax.set_xlabel("stored bits per weight (every tensor counted)")
    ax.set_ylabel("held-out perplexity")
    ax.set_title(data["title"])
    ax.legend(fontsize=6)
    ax.grid(alpha=0.3)
    return fig


FIGURES: list[Figure] = [
    Figure("harness_selfcheck", suite_medians("harness", "encode_us"), draw_bars),
    Figure("decode_throughput", decode_throughput, draw_decode),
    Figure("memory_headroom", memory_headroom, draw_headroom),
    Figure("decode_time_split", decode_time_split, draw_time_split),
    Figure("proxy_overhead", suite_medians("proxy", "added_ms"), draw_bars),
    Figure("proxy_vs_peers", proxy_vs_peers, draw_bars),
    Figure("kernel_bandwidth", kernel_bandwidth, draw_kernel_bandwidth),
    Figure("plan_weight_bytes", plan_weight_bytes, draw_plan_weight_bytes),
    Figure("quantisation_quality", quantisation_quality, draw_quantisation_quality),
    Figure("llamacpp_vs_engine", llamacpp_vs_engine, draw_llamacpp),
    Figure("perplexity_vs_bits", perplexity_vs_bits, draw_perplexity_vs_bits),
]


def build_all(results_dir: Path | None = None) -> dict[str, dict]:
    """Every figure's data from the receipts (figures no receipt feeds are left out)."""
    frame = load_frame(results_dir)
    out = {}
    for figure in FIGURES:
        data = figure.build(frame)
        if data is not None:
            out[figure.name] = data
    return out


def data_json(data: dict) -> str:
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def write_all(results_dir: Path | None = None, out_dir: Path | None = None) -> list[Path]:
    """Regenerate every figure: <name>.png, <name>.pdf and <name>.json in docs/figures/."""
    out_dir = Path(out_dir or FIGURES_DIR)
    out_dir.mkdir(parents=True, exist_ok=True)
    by_name = {f.name: f for f in FIGURES}
    written = []
    for name, data in build_all(results_dir).items():
        with plt.rc_context(STYLE):
            fig = by_name[name].draw(data)
            fig.savefig(out_dir / f"{name}.png", metadata=PNG_METADATA)
            fig.savefig(out_dir / f"{name}.pdf", metadata=PDF_METADATA)
            plt.close(fig)
        (out_dir / f"{name}.json").write_text(data_json(data))
        written += [out_dir / f"{name}.{ext}" for ext in ("png", "pdf", "json")]
    return written
