"""Perplexity against bits per weight: our INT4 plans (accuracy receipts) and llama.cpp's quants
(llamacpp_quality receipts) of the same trained checkpoint, scored on the same held-out tokens.

`quality_panels` is the one selection both RESULTS.md's table and the `perplexity_vs_bits` figure show:
one panel per (checkpoint, machine, evaluation set) — perplexities on other tokens do not compare — and,
per preset and machine, only the newest checkpoint (an older recipe's model is history, not a result).
Random-weight receipts are left out: a stress test, not a model.
"""

from __future__ import annotations

import pandas as pd

from harness.summary import plan_label, weights_kind

OURS, LLAMA_CPP = "ours", "llama.cpp"


def _panel(config: dict, hardware_id: str) -> str:
    return f"{config['model']} · {hardware_id} · {config['sequences']} x {config['seq_len']} tokens"


def _preset(model: str) -> str:
    """`small-016324e6f4ca9587` -> `small`: a trained checkpoint is named preset-recipe hash."""
    return model.rsplit("-", 1)[0]


def on_frontier(points: list[dict]) -> list[bool]:
    """Whether each point is Pareto-optimal: no other point has fewer-or-equal bits and lower perplexity
    (or equal perplexity at fewer bits)."""

    def beaten(p: dict, q: dict) -> bool:
        fewer_bits, lower = q["bits_per_weight"] <= p["bits_per_weight"], q["perplexity"] <= p["perplexity"]
        strictly = q["bits_per_weight"] < p["bits_per_weight"] or q["perplexity"] < p["perplexity"]
        return fewer_bits and lower and strictly

    return [not any(beaten(p, q) for q in points if q is not p) for p in points]


def quality_panels(latest: pd.DataFrame) -> list[dict]:
    """Panels from the newest receipts (one per suite, name and hardware): each with its `panel` title,
    `model`, `hardware_id`, the unquantised `reference` perplexity (None without an accuracy receipt) and
    `points` ({source, label, bits_per_weight, perplexity, frontier, receipt}) by bits."""
    panels: dict[str, dict] = {}
    for row in latest.itertuples() if not latest.empty else ():
        receipt = row.receipt
        cfg, derived = receipt["config"], receipt["derived"]
        if row.suite not in ("accuracy", "llamacpp_quality") or weights_kind(cfg) == "random":
            continue
        if "bits_per_weight" not in derived:  # accuracy receipts from before the perplexity runner
            continue
        panel = panels.setdefault(_panel(cfg, row.hardware_id), {
            "model": cfg["model"], "hardware_id": row.hardware_id, "reference": None, "created": "", "points": [],
        })  # fmt: skip
        panel["created"] = max(panel["created"], row.created)
        if row.suite == "accuracy":
            panel["reference"] = derived["perplexity_reference"]
            point = {
                "source": OURS,
                "label": plan_label(cfg["plan"]),
                "perplexity": derived["perplexity_candidate"],
            }
        else:
            point = {
                "source": LLAMA_CPP,
                "label": cfg["gguf_type"].upper(),
                "perplexity": derived["perplexity"],
            }
        panel["points"].append(point | {"bits_per_weight": derived["bits_per_weight"], "receipt": row.path})
    newest: dict[tuple[str, str], str] = {}
    for name, panel in sorted(panels.items()):
        key = (_preset(panel["model"]), panel["hardware_id"])
        if key not in newest or panel["created"] > panels[newest[key]]["created"]:
            newest[key] = name
    out = []
    for name in sorted(newest.values()):
        panel = panels[name]
        points = sorted(panel["points"], key=lambda p: (p["bits_per_weight"], p["source"], p["label"]))
        points = [p | {"frontier": f} for p, f in zip(points, on_frontier(points), strict=True)]
        out.append({"panel": name, "model": panel["model"], "hardware_id": panel["hardware_id"],
                    "reference": panel["reference"], "points": points})  # fmt: skip
    return out
