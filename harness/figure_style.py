"""The one look of every figure: fonts, palette, text escaping and byte-stable saving.

Text is Computer Modern through matplotlib's mathtext by default (the fonts ship with matplotlib, so every
machine draws the same glyphs); `USE_TEX=1` renders it through a LaTeX install instead. Every string a
figure shows goes through `text()`, which escapes it for whichever renderer is active: matplotlib's cmr10
maps some ASCII (`_ < > { } | ~ \\`) and Latin-1 code points to other glyphs, so those become mathtext.
PDFs embed TrueType fonts (`pdf.fonttype` 42), and neither PNG nor PDF carries a date or a version, so
the same receipts give the same bytes in any process.

Colours are the Okabe–Ito palette (distinguishable with the common colour-vision deficiencies); past its
eight colours `series_style` adds hatches (bars) and marker shapes (lines), so no two series look alike.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.text  # noqa: E402
import matplotlib.transforms  # noqa: E402
from matplotlib.typing import RcKeyType  # noqa: E402

USE_TEX = os.environ.get("USE_TEX") == "1"
# The Computer Modern fonts matplotlib ships carry a zero creation date; fontTools warns on every subset.
logging.getLogger("fontTools.ttLib.tables._h_e_a_d").setLevel(logging.ERROR)

PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#56B4E9", "#CC79A7", "#F0E442", "#000000")
HATCHES = ("", "//", "..", "xx", "\\\\")
MARKERS = ("o", "s", "^", "D", "v")
NEUTRAL = "#BBBBBB"  # caps, reference lines: never a series colour
LEADER = {
    "arrowstyle": "-",
    "color": NEUTRAL,
    "linewidth": 0.5,
    "shrinkA": 0,
    "shrinkB": 3,
}  # label -> marker

_COMMON: dict[RcKeyType, Any] = {
    "font.size": 9,
    "axes.titlesize": 9,
    "legend.fontsize": 7,
    "figure.dpi": 100,
    "savefig.dpi": 150,
    "pdf.fonttype": 42,
    "ps.fonttype": 42,
    "svg.hashsalt": "local-kimi",
    "axes.prop_cycle": plt.cycler(color=PALETTE),
    "hatch.linewidth": 0.6,
}
STYLE: dict[RcKeyType, Any] = _COMMON | (
    {"text.usetex": True, "font.family": "serif", "text.latex.preamble": r"\usepackage{textcomp}"}
    if USE_TEX
    else {
        # cmr10 first, DejaVu Serif for glyphs it lacks (en dash, arrows); maths in Computer Modern too.
        "font.family": ["cmr10", "DejaVu Serif"],
        "mathtext.fontset": "cm",
        "axes.formatter.use_mathtext": True,  # cmr10 has no minus sign of its own
    }
)

# Characters cmr10 would draw as another glyph, as mathtext; and the same characters for LaTeX.
_MATHTEXT = {"_": r"$\_$", "<": "$<$", ">": "$>$", "{": r"$\{$", "}": r"$\}$", "|": "$|$", "~": r"$\sim$",
             "\\": r"$\backslash$", "^": r"$\hat{}$", '"': "''", "`": "'", "$": r"\$", "µ": r"$\mu$",
             "°": r"$^\circ$", "±": r"$\pm$", "²": "$^2$", "³": "$^3$", "‖": r"$\Vert$", "×": r"$\times$",
             "·": r"$\cdot$", "≥": r"$\geq$", "≤": r"$\leq$", "→": r"$\to$", "−": "$-$"}  # fmt: skip
_LATEX = {"_": r"\_", "%": r"\%", "&": r"\&", "#": r"\#", "$": r"\$", "{": r"\{", "}": r"\}",
          "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "\\": r"\textbackslash{}", "<": r"\textless{}",
          ">": r"\textgreater{}", "|": r"\textbar{}", "µ": r"\textmu{}", "°": r"\textdegree{}",
          "±": r"\textpm{}", "‖": r"$\Vert$", "×": r"$\times$", "·": r"$\cdot$", "≥": r"$\geq$",
          "≤": r"$\leq$", "→": r"$\to$", "−": "$-$", "–": "--", "—": "---"}  # fmt: skip


def check_renderer() -> None:
    """Fail early and clearly when USE_TEX=1 asks for a LaTeX that is not installed."""
    if USE_TEX and not (shutil.which("latex") and shutil.which("dvipng")):
        raise RuntimeError("USE_TEX=1 renders through LaTeX, which needs `latex` and `dvipng` on PATH; "
                           "install a TeX distribution or unset USE_TEX to use mathtext")  # fmt: skip


def text(s: str) -> str:
    """`s` as the active renderer must receive it to show exactly `s`."""
    table = _LATEX if USE_TEX else _MATHTEXT
    return "".join(table.get(ch, ch) for ch in s)


def series_style(i: int) -> dict:
    """Colour plus, past the palette, a hatch and a marker: distinct for the first 40 series."""
    cycle, colour = divmod(i, len(PALETTE))
    return {
        "color": PALETTE[colour],
        "hatch": HATCHES[cycle % len(HATCHES)],
        "marker": MARKERS[cycle % len(MARKERS)],
    }


def part_labels(fig: plt.Figure, labels: list, *, lines: int = 3) -> None:
    """Place each annotation in `labels` where it covers no label placed before it and no marker of its
    axes: its own offset first, then a line lower or higher, then the same left of its point (points a
    fraction of a bit apart otherwise print their names over each other). Where every place is taken, the
    one covering least. Give the annotations a leader line (`arrowprops`) so a moved label still points
    at its marker. Call it once the figure's content is final: it lays the figure out to measure."""
    fig.draw_without_rendering()  # positions final; extents then measure with the figure's own renderer
    placed: list = []
    for label in labels:
        markers = _marker_boxes(label.axes)
        inside = label.axes.get_window_extent()

        def text_box(label=label):  # the text alone: an annotation's own extent includes its leader line
            return matplotlib.text.Text.get_window_extent(label)

        dx, dy = label.xyann
        width = text_box().width * 72 / fig.dpi
        line = (text_box().height + 1) * 72 / fig.dpi
        shifts = [0.0] + [sign * k * line for k in range(1, lines + 1) for sign in (-1, 1)]
        best = None
        # Nearest places first: right of the point, then left of it, at each height.
        for x, shift in ((x, shift) for shift in shifts for x in (dx, -dx - width)):
            label.xyann = (x, dy + shift)
            box = text_box()
            outside = box.width * box.height - _overlap(box, inside)  # past the axes: over ticks, labels
            cover = sum(_overlap(box, other) for other in placed + markers) + 10 * outside
            if best is None or cover < best[0]:
                best = (cover, label.xyann, box)
            if cover == 0:
                break
        assert best is not None  # the first place is always measured
        label.xyann = best[1]
        placed.append(best[2])


def _marker_boxes(ax) -> list:
    """Display-space boxes of every scatter marker on `ax`."""
    radius = matplotlib.rcParams["lines.markersize"] / 2 * ax.figure.dpi / 72
    boxes = []
    for collection in ax.collections:
        for x, y in collection.get_offset_transform().transform(collection.get_offsets()):
            boxes.append(matplotlib.transforms.Bbox([[x - radius, y - radius], [x + radius, y + radius]]))
    return boxes


def _overlap(a, b) -> float:
    """Area two display boxes share."""
    w = min(a.x1, b.x1) - max(a.x0, b.x0)
    h = min(a.y1, b.y1) - max(a.y0, b.y0)
    return max(w, 0.0) * max(h, 0.0)


def save(fig: plt.Figure, stem: Path, title: str, caption: str) -> list[Path]:
    """`stem`.png and `stem`.pdf, with the title and caption as metadata and nothing that varies."""
    png, pdf = stem.with_suffix(".png"), stem.with_suffix(".pdf")
    fig.savefig(png, metadata={"Software": None, "Title": title, "Description": caption})
    fig.savefig(pdf, metadata={"Creator": None, "Producer": None, "CreationDate": None, "Title": title,
                               "Subject": caption})  # fmt: skip
    plt.close(fig)
    return [png, pdf]
