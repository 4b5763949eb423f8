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

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from harness.hardware import REPO_ROOT  # noqa: E402
from harness.report import load_frame, newest  # noqa: E402

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


def suite_medians(suite: str, metric: str) -> Callable[[pd.DataFrame], dict | None]:
    """Median and p10/p90 of one metric for every (name, hardware) of a suite, newest receipts."""

    def build(frame: pd.DataFrame) -> dict | None:
        rows = newest(frame)
        rows = rows[rows["suite"] == suite]
        bars = []
        for row in rows.itertuples():
            stats = row.receipt["summary"].get(metric)
            if stats is None:
                continue
            bars.append(
                {
                    "label": f"{row.name}\n{row.hardware_id}",
                    "median": stats["median"],
                    "p10": stats["p10"],
                    "p90": stats["p90"],
                    "unit": row.receipt["units"][metric],
                    "receipt": row.path,
                }
            )
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


FIGURES: list[Figure] = [
    Figure("harness_selfcheck", suite_medians("harness", "encode_us"), draw_bars),
    Figure("decode_throughput", decode_throughput, draw_decode),
    Figure("memory_headroom", memory_headroom, draw_headroom),
    Figure("proxy_overhead", suite_medians("proxy", "added_ms"), draw_bars),
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
