"""results/RESULTS.md, regenerated from receipts only (jinja2 template, pandas for the selection)."""

from __future__ import annotations

from pathlib import Path

import jinja2
import pandas as pd

from harness.quality import quality_panels
from harness.receipt import RESULTS_DIR, load_receipt, receipt_paths, short_id
from harness.summary import COLUMNS, DIRTY_MARK, not_measured, summary_rows, weights_kind

TEMPLATES = Path(__file__).parent / "templates"

# Suites in reading order, with the sentence that introduces each section.
SUITES = {
    "decode": ("Decode throughput", "Engine decode tokens/s at batch 1 under the memory cap."),
    "prefill": ("Prefill", "Time to first token and prefill tokens/s per prompt length."),
    "kernels": ("Kernels", "Each kernel variant against its reference: achieved bandwidth."),
    "proxy": (
        "Proxy overhead",
        "Latency k3 adds per request and per streamed event, through the proxy minus direct.",
    ),
    "micro": (
        "Microbenchmarks",
        "pytest-benchmark cases of each step of a proxied turn and of the engine's per-token host work.",
    ),
    "accuracy": ("Accuracy", "Quantised against unquantised model on the same weights and prompts."),
    "llamacpp": ("llama.cpp head to head", "The same model and machine, our engine against llama.cpp."),
    "llamacpp_quality": (
        "llama.cpp quants: perplexity",
        "llama.cpp's F16 / Q8_0 / Q4_0 / Q4_K_M of the same checkpoint on the accuracy runner's tokens "
        "(compare with the accuracy section's perplexity_candidate at its bits_per_weight).",
    ),
    "serve": (
        "Serving benchmark",
        "`python -m runners serve`: TTFT (first visible and first token of any kind), ITL, TPOT, end-to-end "
        "latency, output tok/s and goodput per endpoint, dialect and concurrency or request rate; errors "
        "are counted and kept out of the latencies (docs/METHODS.md).",
    ),
    "profile-prefill": (
        "Prefill time split",
        "`python -m runners profile --prefill N`: milliseconds of one prompt's prefill per model component "
        "(timing hooks; `other` is the rest of the forward pass).",
    ),
    "batching": (
        "Batching",
        "`python -m runners batching`: aggregate output tok/s, TTFT and ITL at each concurrency, requests "
        "decoded together in one step; `speedup_vs_c1` against concurrency 1 in the same run.",
    ),
    "profile": (
        "Profile",
        "`python -m runners profile`: milliseconds of one eager decode step per model component (timing "
        "hooks; `other` is the rest of the step).",
    ),
    "kernel-count": (
        "Kernel-count",
        "`python -m runners profile --count-kernels`: kernels one decode step launches (aten ops, Triton launches, "
        "split-K sums), counted on the meta device at the full model's shapes.",
    ),
    "training": (
        "Training",
        "`kimi-engine train`: the training receipt of each checkpoint trained here (loss of every step, "
        "held-out perplexity and bits per byte, wall time).",
    ),
    "conformance": (
        "Conformance",
        "`nox -s conformance`: the real clients (Claude Code, Codex, opencode, aider, the SDKs) driven "
        "through k3 against a scripted upstream; wall seconds of each case, and how many passed.",
    ),
    "harness": (
        "Harness self-check",
        "A small real measurement that proves the receipt → report → figures → audit path.",
    ),
}


def load_frame(results_dir: Path | None = None) -> pd.DataFrame:
    """One row per receipt: where it came from, when, and the receipt itself."""
    root = Path(results_dir or RESULTS_DIR)
    rows = []
    for path in receipt_paths(root):
        receipt = load_receipt(path)
        rows.append(
            {
                "suite": receipt["suite"],
                "name": receipt["name"],
                "hardware_id": receipt["hardware"]["hardware_id"],
                "created": receipt["created"],
                "commit": _commit_label(receipt["hardware"].get("git", {})),
                "path": path.relative_to(root).as_posix(),
                "receipt": receipt,
            }
        )
    columns = ["suite", "name", "hardware_id", "created", "commit", "path", "receipt"]
    return pd.DataFrame(rows, columns=columns)


def _commit_label(git: dict) -> str:
    label = (git.get("commit") or "unknown")[:10]
    return f"{label}+dirty" if git.get("dirty") else label


def newest(frame: pd.DataFrame) -> pd.DataFrame:
    """The newest receipt per (suite, name, hardware)."""
    if frame.empty:
        return frame
    ordered = frame.sort_values(["suite", "name", "hardware_id", "created", "path"])
    return ordered.groupby(["suite", "name", "hardware_id"], sort=True).tail(1).reset_index(drop=True)


def find_receipt(target: str, results_dir: Path | None = None) -> Path:
    """A receipt path relative to results/, or `latest:SUITE/HARDWARE_ID/NAME` for the newest of that name."""
    root = Path(results_dir or RESULTS_DIR)
    if not target.startswith("latest:"):
        path = root / target
        if not path.exists():
            raise FileNotFoundError(f"no receipt {target}")
        return path
    try:
        suite, hardware_id, name = target[len("latest:") :].split("/", 2)
    except ValueError:
        raise ValueError(f"expected latest:SUITE/HARDWARE_ID/NAME, got {target!r}") from None
    frame = load_frame(root)
    rows = frame[(frame.suite == suite) & (frame.hardware_id == hardware_id) & (frame.name == name)]
    if rows.empty:
        raise FileNotFoundError(f"no receipt named '{name}' for {suite} on {hardware_id}")
    return root / newest(rows).iloc[0]["path"]


def fmt(value: float) -> str:
    """Four significant digits, thousands separated, never scientific notation for ordinary values."""
    if value != value:  # NaN
        return "nan"
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 1 or magnitude == 0:
        return f"{value:.4g}"
    return f"{value:.3g}"


def _section(suite: str, rows: pd.DataFrame) -> dict:
    title, description = SUITES.get(suite, (suite.capitalize(), ""))
    metric_rows, derived_rows, notes = [], [], []
    for row in rows.itertuples():
        receipt = row.receipt
        base = {
            "name": row.name,
            "hardware_id": row.hardware_id,
            "commit": row.commit,
            "short_id": short_id(receipt),
            "path": row.path,
        }
        for metric, stats in receipt["summary"].items():
            metric_rows.append(
                base
                | {
                    "metric": metric,
                    "median": fmt(stats["median"]),
                    "p10": fmt(stats["p10"]),
                    "p90": fmt(stats["p90"]),
                    "n": stats["n"],
                    "unit": receipt["units"][metric],
                }
            )
        for metric, value in receipt["derived"].items():
            unit = receipt["units"].get(metric, "")
            derived_rows.append(base | {"metric": metric, "value": fmt(value), "unit": unit})
        if receipt["notes"]:
            notes.append(f"{row.name} on {row.hardware_id}: {receipt['notes']}")
    return {
        "title": title,
        "description": description,
        "metric_rows": metric_rows,
        "derived_rows": derived_rows,
        "notes": notes,
    }


# Accuracy on random weights measures the codec, not a model (no logit margins): its own section, last.
ACCURACY_BY_WEIGHTS = {
    "trained": ("Accuracy (trained weights)", "Quantised against unquantised model on weights trained here "
                "(`kimi-engine train`), on held-out text."),
    "real": ("Accuracy (real weights)", "Quantised against unquantised model on the real weights."),
    "random": ("Accuracy stress test (random weights)", "Quantised against unquantised model on synthetic "
               "random weights: no logit margins, so these numbers stress the codec and say nothing about a "
               "trained model's quantisation damage."),
}  # fmt: skip


def _accuracy_sections(rows: pd.DataFrame) -> list[dict]:
    kinds = rows["receipt"].map(lambda r: weights_kind(r["config"]))
    sections = []
    for kind, (title, description) in ACCURACY_BY_WEIGHTS.items():
        if (kinds == kind).any():
            section = _section("accuracy", rows[kinds == kind])
            sections.append(section | {"title": title, "description": description})
    return sections


def _quality_tables(latest: pd.DataFrame) -> list[dict]:
    """One table per quality panel: every quantisation of one checkpoint, ours and llama.cpp's, by bits."""
    ids = {row.path: short_id(row.receipt) for row in latest.itertuples()}
    tables = []
    for panel in quality_panels(latest):
        reference = panel["reference"]
        rows = [{"source": p["source"], "label": p["label"], "bits": fmt(p["bits_per_weight"]),
                 "perplexity": fmt(p["perplexity"]),
                 "relative": f"{(p['perplexity'] / reference - 1) * 100:+.2f}%" if reference is not None else "",
                 "frontier": "yes" if p["frontier"] else "", "short_id": ids[p["receipt"]], "path": p["receipt"]}
                for p in panel["points"]]  # fmt: skip
        tables.append(
            {
                "panel": panel["panel"],
                "reference": None if reference is None else fmt(reference),
                "rows": rows,
            }
        )
    return tables


def templates(directory: Path) -> jinja2.Environment:
    """The project's Markdown templates: strict (a missing value fails), block tags leave no blank lines."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(directory),
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
    )


def render(results_dir: Path | None = None) -> str:
    frame = load_frame(results_dir)
    latest = newest(frame)
    suites = [s for s in SUITES if s in set(latest["suite"])] + sorted(set(latest["suite"]) - set(SUITES))
    sections = []
    for suite in suites:
        rows = latest[latest["suite"] == suite]
        sections += _accuracy_sections(rows) if suite == "accuracy" else [_section(suite, rows)]
    return (
        templates(TEMPLATES)
        .get_template("RESULTS.md.j2")
        .render(
            sections=sections,
            n_receipts=len(frame),
            summary=summary_rows(latest, fmt),
            columns=COLUMNS,
            dirty_mark=DIRTY_MARK,
            gaps=not_measured(latest, {suite: title for suite, (title, _) in SUITES.items()}),
            quality=_quality_tables(latest),
        )
    )


def write_report(results_dir: Path | None = None) -> Path:
    root = Path(results_dir or RESULTS_DIR)
    out = root / "RESULTS.md"
    root.mkdir(parents=True, exist_ok=True)
    out.write_text(render(root))
    return out
