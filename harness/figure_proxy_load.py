"""The proxy load figure: turns/s and k3's CPU per turn against the number of streaming clients."""

from __future__ import annotations

import matplotlib.pyplot as plt
import matplotlib.ticker
import pandas as pd

from harness.report import newest


def proxy_load(frame: pd.DataFrame) -> dict | None:
    """One series per (client kind, hardware) from the newest `load.*` proxy receipts, x = clients."""
    rows = newest(frame)
    rows = rows[(rows["suite"] == "proxy") & rows["name"].str.startswith("load.")]
    series: dict[str, dict] = {}
    for row in rows.itertuples():
        receipt = row.receipt
        cfg, derived = receipt["config"], receipt["derived"]
        label = f"{cfg['client']} clients · {row.hardware_id}"
        line = series.setdefault(label, {"label": label, "points": []})
        line["points"].append(
            {
                "clients": cfg["clients"],
                "turns_per_s": derived["turns_per_s"],
                "k3_cpu_ms_per_turn": derived["k3_cpu_ms_per_turn"],
                "latency_p99_ms": derived["latency_p99_ms"],
                "errors": derived["errors"],
                "receipt": row.path,
            }
        )
    if not series:
        return None
    for line in series.values():
        line["points"].sort(key=lambda p: p["clients"])
    return {
        "title": "k3 under load: keep-alive clients streaming 64-delta turns back to back",
        "series": sorted(series.values(), key=lambda s: s["label"]),
    }


def draw_proxy_load(data: dict) -> plt.Figure:
    fig, (rate, cpu) = plt.subplots(1, 2, figsize=(8.0, 3.6))
    for i, line in enumerate(data["series"]):
        xs = [p["clients"] for p in line["points"]]
        style = {"marker": "o", "color": f"C{i % 10}", "label": line["label"]}
        rate.plot(xs, [p["turns_per_s"] for p in line["points"]], **style)
        cpu.plot(xs, [p["k3_cpu_ms_per_turn"] for p in line["points"]], **style)
    for ax, label in ((rate, "completed turns/s"), (cpu, "k3 CPU ms per turn")):
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_xlabel("concurrent streaming clients")
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3, which="both")
    rate.legend(fontsize=7)
    fig.suptitle(data["title"], fontsize=9)
    fig.tight_layout()
    return fig
