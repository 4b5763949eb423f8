"""Statistical verdicts on receipts' raw samples: is a change real, and does a re-run reproduce a claim?

`compare_samples` gives a percentile-bootstrap confidence interval of the ratio of medians (new / old); a
change is significant when the whole interval lies on one side of 1. The resampling uses a fixed seed, so
the same receipts always give the same verdict. `reproduction_tolerance` serves the re-run check (in the spirit of
MLPerf's compliance re-runs): the new median must lie within the old receipt's own spread.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass

CONFIDENCE = 0.95
RESAMPLES = 2000
# A receipt whose samples barely vary (a deterministic count, a single sample) still allows this much.
REPRODUCE_FLOOR = 0.02


@dataclass(frozen=True)
class Comparison:
    ratio: float  # median(new) / median(old)
    low: float  # confidence interval of the ratio
    high: float
    confidence: float

    def direction(self, higher_is_better: bool) -> str:
        """'worse', 'better' or 'no significant change' (the interval contains 1)."""
        if self.low > 1:
            return "better" if higher_is_better else "worse"
        if self.high < 1:
            return "worse" if higher_is_better else "better"
        return "no significant change"

    def __str__(self) -> str:
        return (
            f"ratio of medians {self.ratio:.4f}, {self.confidence:.0%} CI [{self.low:.4f}, {self.high:.4f}]"
        )


def compare_samples(
    old: list[float], new: list[float], *, resamples: int = RESAMPLES, seed: int = 0
) -> Comparison:
    """Bootstrap CI of median(new) / median(old), resampling each receipt's samples independently."""
    if not old or not new:
        raise ValueError("both receipts need samples of the metric")
    base = statistics.median(old)
    if base <= 0:
        raise ValueError(f"the old median is {base:g}: a ratio of medians needs a positive base")
    rng = random.Random(seed)
    ratios = []
    for _ in range(resamples):
        denominator = statistics.median(rng.choices(old, k=len(old)))
        if denominator > 0:  # a resample at or below zero has no meaningful ratio
            ratios.append(statistics.median(rng.choices(new, k=len(new))) / denominator)
    ratios.sort()
    tail = (1 - CONFIDENCE) / 2
    low = ratios[int(tail * (len(ratios) - 1))]
    high = ratios[int((1 - tail) * (len(ratios) - 1))]
    return Comparison(statistics.median(new) / base, low, high, CONFIDENCE)


def reproduction_tolerance(summary: dict) -> float:
    """How far a re-run's median may lie from this summary's median: its p10–p90 width (the spread of
    single samples, wider than the median's own), at least REPRODUCE_FLOOR of the median."""
    return max(summary["p90"] - summary["p10"], REPRODUCE_FLOOR * abs(summary["median"]))


def regression_pct(old: float, new: float, higher_is_better: bool) -> tuple[float, float]:
    """(new/old, how many percent worse new is; negative when better)."""
    ratio = new / old
    return ratio, (1 - ratio if higher_is_better else ratio - 1) * 100


@dataclass(frozen=True)
class Verdict:
    """A percentage judgement of one value, with the statistical one where both receipts carry samples."""

    old: float
    new: float
    ratio: float
    regression: float  # percent, negative when better
    allowed: float  # percent
    higher_is_better: bool
    comparison: Comparison | None

    @property
    def regressed(self) -> bool:
        """Beyond the allowance, and (with samples) a real change: the whole CI on the worse side of 1."""
        significant = self.comparison is None or self.comparison.direction(self.higher_is_better) == "worse"
        return self.regression > self.allowed and significant

    def __str__(self) -> str:
        stats = (f"{self.comparison}: {self.comparison.direction(self.higher_is_better)}" if self.comparison
                 else "no samples: percentage only")  # fmt: skip
        outcome = "REGRESSED" if self.regressed else "ok"
        return (f"base {self.old:.6g}, new {self.new:.6g}, ratio {self.ratio:.4f} ({self.regression:+.1f}% "
                f"regression, allowed {self.allowed:g}%); {stats} — {outcome}")  # fmt: skip


def verdict(
    old: float,
    new: float,
    allowed: float,
    higher_is_better: bool,
    old_samples: list[float] | None = None,
    new_samples: list[float] | None = None,
) -> Verdict:
    """Judge `new` against `old`; with both sample lists (and a positive old median), also the bootstrap CI
    of their ratio of medians."""
    ratio, regression = regression_pct(old, new, higher_is_better)
    usable = old_samples and new_samples and statistics.median(old_samples) > 0
    comparison = compare_samples(old_samples, new_samples) if usable and old_samples and new_samples else None
    return Verdict(old, new, ratio, regression, allowed, higher_is_better, comparison)
