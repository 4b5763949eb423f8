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


FIGURES: list[Figure] = [
    Figure("harness_selfcheck", suite_medians("harness", "encode_us"), draw_bars),
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
