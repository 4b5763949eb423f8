"""The Summary that opens RESULTS.md: the numbers readers ask for, one row per configuration and hardware.

Rows come from the newest receipts of four suites: decode (tok/s, % of roofline, TTFT), llama.cpp (our
engine's decode speed and its ratio to llama-bench on the same model), the peer proxies (latency k3 and
each peer add to the same turn) and accuracy (KL and top-1 of a quantisation plan). A cell a suite does
not measure stays empty. Every row links its receipt by short id; a receipt from a dirty tree is marked,
since the audit refuses it as backing for a number in README.md or docs/. `not_measured` lists what no
receipt covers yet.
"""

from __future__ import annotations

import re

import pandas as pd

from harness.receipt import is_dirty, short_id

COLUMNS = ("decode tok/s", "% of roofline", "× llama.cpp decode", "TTFT ms", "proxy added ms", "KL / top-1")
DIRTY_MARK = "†"
SYNTHETIC_WEIGHTS = "random (stress test)"
# The suites a reader expects measured (on a GPU, with real weights); harness and conformance are not speeds.
MEASURED_SUITES = ("decode", "prefill", "kernels", "proxy", "accuracy", "llamacpp")


def natural_key(label: str) -> list:
    """Sort key that orders the numbers inside labels by value: ctx17 < ctx256 < ctx1024."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", label)]


def weights_kind(config: dict) -> str:
    """trained | real | random. Receipts from before `weights_kind` existed said it in `weights`, and
    older ones in nothing, but a synthetic model only has random weights."""
    if "weights_kind" in config:
        return config["weights_kind"]
    weights = config.get("weights")
    if weights is None:
        return "random" if str(config.get("model", "")).startswith("synthetic") else "real"
    return "random" if "synthetic" in weights.lower() else "real"


def weights_label(config: dict) -> str:
    """Which weights a receipt measured, in words; random ones are a stress test, not a quality result."""
    kind = weights_kind(config)
    if kind == "random":
        return SYNTHETIC_WEIGHTS
    return "trained here" if kind == "trained" else config.get("weights") or "not recorded"


def plan_label(plan: dict) -> str:
    """``label gG``: the plan's name, with its rounding when that is not the named plan's own (the accuracy
    runner records it as ``label``; receipts before that used each plan's own)."""
    return f"{plan.get('label', plan['name'])} g{plan['group_size']}"


def config_label(cfg: dict) -> str:
    """An engine configuration in words: model, weights format, dtype, kernels, threads, batch."""
    plan = cfg.get("plan")
    parts = [
        cfg["model"],
        f"INT4 {plan['name']} g{plan['group_size']}" if plan else "dense",
        cfg["dtype"].upper(),
    ]
    if cfg.get("kernels"):
        parts.append(f"kernels {cfg['kernels']}")
    if cfg.get("threads") is not None:
        parts.append(f"{cfg['threads']} thread{'s' if cfg['threads'] != 1 else ''}")
    if "batch" in cfg:
        parts.append(f"batch {cfg['batch']}")
    return ", ".join(parts)


def _median(receipt: dict, metric: str) -> float | None:
    stats = receipt["summary"].get(metric)
    return stats["median"] if stats else None


def _decode(receipt: dict, fmt) -> tuple[str, dict]:
    cfg = receipt["config"]
    fraction = receipt["derived"].get("fraction_of_roofline")
    ttft = _median(receipt, "ttft_ms")
    return f"decode: {config_label(cfg)}, context {cfg['context']}", {
        "decode tok/s": fmt(_median(receipt, "decode_tok_s")),
        "% of roofline": f"{fmt(100 * fraction)}%" if fraction is not None else "",
        "TTFT ms": fmt(ttft) if ttft is not None else "",
    }


def _llamacpp(receipt: dict, fmt) -> tuple[str, dict] | None:
    cfg = receipt["config"]
    if "gguf_type" not in cfg:
        return None  # the engine's own half of a pair; its llama.cpp receipt carries its medians
    engine = cfg["engine"].get("label", cfg["engine"]["dtype"])
    label = (f"llama.cpp: {cfg['model']}, engine {engine} against {cfg['gguf_type']}, prompt {cfg['prompt_tokens']}, "
             f"{cfg['generated_tokens']} generated, {cfg['threads']} thread(s)")  # fmt: skip
    return label, {
        "decode tok/s": fmt(receipt["derived"]["engine_decode_tok_s"]),
        "× llama.cpp decode": f"{fmt(receipt['derived']['engine_over_llama_bench_decode'])}×",
    }


def _peers(receipt: dict, fmt) -> tuple[str, dict] | None:
    cfg = receipt["config"]
    if cfg.get("mode") != "peers":
        return None
    shown = [(p, _median(receipt, f"{p}_added_ms")) for p in ("k3", *sorted(cfg["peers"]))]
    cell = " / ".join(f"{p} {fmt(v)}" if v is not None else f"{p} n/a" for p, v in shown)
    kind = "stream" if cfg["stream"] else "json"
    return f"proxy: {cfg['dialect']} {kind} over loopback, k3 against {', '.join(sorted(cfg['peers']))}", {
        "proxy added ms": cell
    }


def _accuracy(receipt: dict, fmt) -> tuple[str, dict]:
    cfg, derived = receipt["config"], receipt["derived"]
    return f"accuracy: {cfg['model']}, plan {plan_label(cfg['plan'])}", {
        "KL / top-1": f"{fmt(derived['kl_mean_nats'])} nats / {fmt(derived['top1_agreement'])}"
    }


ROW_BUILDERS = {"decode": _decode, "llamacpp": _llamacpp, "proxy": _peers, "accuracy": _accuracy}


def summary_rows(latest: pd.DataFrame, fmt) -> list[dict]:
    """The Summary table's rows from the newest receipts, suite by suite, names in natural order."""
    rows = []
    for suite, build in ROW_BUILDERS.items():
        chosen = latest[latest["suite"] == suite] if not latest.empty else latest
        for row in sorted(chosen.itertuples(), key=lambda r: (natural_key(r.name), r.hardware_id)):
            built = build(row.receipt, fmt)
            if built is None:
                continue
            label, cells = built
            dirty = is_dirty(row.receipt)
            rows.append({
                "configuration": label,
                "hardware_id": row.hardware_id,
                "weights": weights_label(row.receipt["config"]) if "model" in row.receipt["config"] else "",
                "cells": [cells.get(column, "") for column in COLUMNS],
                "short_id": short_id(row.receipt) + (DIRTY_MARK if dirty else ""),
                "path": row.path,
                "dirty": dirty,
            })  # fmt: skip
    return rows


def not_measured(latest: pd.DataFrame, titles: dict[str, str]) -> list[str]:
    """What no receipt covers yet: a suite without receipts, without GPU receipts, or with random weights only
    (`titles`: suite -> its section title)."""
    gaps = []
    receipts = list(latest["receipt"]) if not latest.empty else []
    if not any(r["hardware"].get("gpus") for r in receipts):
        gaps.append("No GPU receipts at all: every number on this page was measured on a CPU.")
    for suite in MEASURED_SUITES:
        title = titles.get(suite, suite)
        own = [r for r in receipts if r["suite"] == suite]
        if not own:
            gaps.append(f"{title} (`{suite}`): no receipts yet.")
            continue
        if any(r["hardware"].get("gpus") for r in receipts) and not any(
            r["hardware"].get("gpus") for r in own
        ):
            gaps.append(f"{title} (`{suite}`): no GPU receipts yet.")
        if "model" in own[0]["config"] and all(weights_label(r["config"]) == SYNTHETIC_WEIGHTS for r in own):
            gaps.append(
                f"{title} (`{suite}`): random weights only (a stress test); no real checkpoint measured."
            )
    return gaps
