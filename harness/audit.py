"""The audit: every number the project shows must come from a receipt, and say which.

Findings, each with a kind:
- `bad-receipt`      a receipt does not load (schema, field, type, summary or hash defect)
- `stale-report`     results/RESULTS.md differs from what the receipts regenerate
- `stale-figure`     a figure's data differs from a fresh build, or its PNG/PDF is missing
- `orphan-figure`    a figure file that no receipt produces any more
- `bad-marker`       a receipt marker whose receipt or field does not exist, or has no number before it
- `mismatch`         a number in the docs that differs from its receipt at the precision it is written with
- `unbacked`         a measured-looking number (tok/s, ms, GB/s, %, GiB ...) with no receipt marker
- `dirty-receipt`    a number backed by a receipt measured on a tree with uncommitted changes (`+dirty`):
                     no reader can rebuild it from a commit; re-measure on a clean one
- `bad-citation`     a `cited:` marker that names neither a public source nor a file of this repository
- `stale-claims`     docs/CLAIMS.md differs from what `kimi-harness claims` generates
- `implausible-claim` a published claim (harness/claims.py) above its computed ceiling with no stated
                     reason (speculation, batching), or a fit the plan contradicts

A marker follows the number it backs, on the same line:
    113.8 tok/s <!-- receipt: decode/NVIDIA-H200/20261129T...-x.json#summary.tok_s.median -->
The path is relative to results/; `latest:SUITE/HARDWARE_ID/NAME` picks the newest receipt of that name.
`*100` after the field scales it (a fraction shown as a percentage). A number quoted from someone else's
work is marked `<!-- cited: where it comes from -->` instead: a public source (a URL, `arXiv:ID`,
`doi:ID`, `github.com/OWNER/REPO PATH`) or a file of this repository, named first (`docs/REFERENCE.md §2`), and one that is arithmetic rather than a
measurement (a tensor's size from its shape, pinned by a test) `<!-- computed: how -->`.
Speeds and times (tok/s, GB/s, ms, µs, "x faster") always look measured; sizes, percentages and ratios
(GiB, MB, %, 1.5×) look measured on a line that speaks of hardware or speed (GPU, decode, bandwidth ...).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

from harness import figures, report
from harness.receipt import ReceiptError, is_dirty, load_receipt, receipt_paths, resolve_field
from harness.reproduce import reproductions

MARKER = re.compile(r"<!--\s*(receipt|cited|computed):\s*(.*?)\s*-->")
NUMBER = re.compile(r"(?<![\w.])[-+]?\d[\d,]*(?:\.\d+)?")
_VALUE = r"(?<![\w.])(\d[\d,]*(?:\.\d+)?)"
# Speeds and times always read as measurements ...
SPEED = re.compile(_VALUE + r"\s*(tok/s|tokens/s|ms\b|µs|us\b|GB/s|GiB/s|TB/s|x faster|× faster)")
# ... sizes, percentages and ratios only on a line that speaks of hardware or speed.
AMOUNT = re.compile(_VALUE + r"(\s*(GiB|GB|MiB|MB)\b|\s*%|×)")
HARDWARE_OR_SPEED = re.compile(
    r"\b(H100|H200|L40S|A100|GPU|CPU|decode|prefill|throughput|bandwidth|latency|roofline|faster|slower|"
    r"speed|peak|overhead|measured|tok/s)",
    re.IGNORECASE,
)
CODE_SPAN = re.compile(r"`[^`]*`")
PUBLIC_SOURCE = re.compile(
    r"https?://\S+|\barXiv:\s*\d{4}\.\d{4,5}|\bdoi:\s*10\.\d+/\S+"
    r"|\b(github\.com|gitlab\.com|huggingface\.co)/[\w.-]+/[\w.-]+",
    re.IGNORECASE,
)
DOC_GLOBS = ("README.md", "docs/*.md")


@dataclass(frozen=True)
class Finding:
    kind: str
    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.where}: {self.message}"


def run_audit(root: Path) -> list[Finding]:
    results_dir = root / "results"
    findings = _check_receipts(results_dir)
    if findings:
        # Regeneration needs every receipt readable; the receipt findings say what to fix first.
        return findings
    findings += _check_report(results_dir)
    findings += _check_figures(results_dir, root / "docs" / "figures")
    for pattern in DOC_GLOBS:
        for doc in sorted(root.glob(pattern)):
            findings += check_document(doc, results_dir, doc.relative_to(root).as_posix(), root=root)
    if (root / "harness" / "claims.py").exists():  # a checkout of this project, not a bare results tree
        findings += check_claims(root)
    return findings


def check_claims(root: Path) -> list[Finding]:
    """Each published claim against its computed ceiling, and docs/CLAIMS.md against a fresh render."""
    from harness import claims

    checks = claims.check_all()
    findings = [
        Finding("implausible-claim", f"harness/claims.py claim {n}", msg)
        for n, msg in claims.findings(checks)
    ]
    page = root / claims.CLAIMS_DOC
    if not page.exists() or page.read_text() != claims.render(checks):
        findings.append(
            Finding(
                "stale-claims",
                claims.CLAIMS_DOC.as_posix(),
                f"differs from the claims: run `{claims.REGENERATE}`",
            )
        )
    return findings


def _check_receipts(results_dir: Path) -> list[Finding]:
    findings = []
    for path in receipt_paths(results_dir):
        try:
            load_receipt(path)
        except ReceiptError as exc:
            findings.append(Finding("bad-receipt", path.relative_to(results_dir).as_posix(), str(exc)))
    return findings


def _check_report(results_dir: Path) -> list[Finding]:
    page = results_dir / "RESULTS.md"
    expected = report.render(results_dir)
    if not page.exists():
        return [Finding("stale-report", "results/RESULTS.md", "missing: run `kimi-harness report`")]
    if page.read_text() != expected:
        return [
            Finding(
                "stale-report", "results/RESULTS.md", "differs from the receipts: run `kimi-harness report`"
            )
        ]
    return []


def _check_figures(results_dir: Path, figures_dir: Path) -> list[Finding]:
    findings = []
    expected = figures.build_all(results_dir)
    for name, data in expected.items():
        where = f"docs/figures/{name}"
        sidecar = figures_dir / f"{name}.json"
        if not sidecar.exists() or sidecar.read_text() != figures.data_json(data):
            findings.append(
                Finding("stale-figure", where, "data differs from the receipts: run `nox -s figures`")
            )
        for ext in ("png", "pdf"):
            if not (figures_dir / f"{name}.{ext}").exists():
                findings.append(Finding("stale-figure", f"{where}.{ext}", "missing: run `nox -s figures`"))
    if figures_dir.exists():
        for path in sorted(figures_dir.iterdir()):
            if path.suffix in (".png", ".pdf", ".json") and path.stem not in expected:
                findings.append(
                    Finding("orphan-figure", f"docs/figures/{path.name}", "no receipt produces it")
                )
    return findings


def check_document(doc: Path, results_dir: Path, where: str, root: Path | None = None) -> list[Finding]:
    """Findings in one Markdown file; `cited:` paths are looked up in `root` (default: results' parent)."""
    root = root or results_dir.parent
    findings = []
    for lineno, line in _prose_lines(doc.read_text().splitlines(keepends=True)):
        findings += _check_line(line, results_dir, root, f"{where}:{lineno}")
    return findings


def _prose_lines(lines: list[str]):
    """(line number, line) for lines outside fenced code blocks, which show commands, not claims."""
    in_fence = False
    for lineno, line in enumerate(lines, 1):
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
        elif not in_fence:
            yield lineno, line


def _marker_segments(line: str):
    """(marker match, the text between the previous marker and this one) for each marker on a line."""
    start = 0
    for match in MARKER.finditer(line):
        yield match, line[start : match.start()]
        start = match.end()


def _check_line(line: str, results_dir: Path, root: Path, where: str) -> list[Finding]:
    findings = []
    start = 0
    line = CODE_SPAN.sub("", line)  # code spans show commands and marker syntax, never claims
    for match, segment in _marker_segments(line):
        start = match.end()
        if match.group(1) == "cited":
            findings += _check_citation(match.group(2), root, where)
        if match.group(1) != "receipt":
            continue
        numbers = NUMBER.findall(segment)
        if not numbers:
            findings.append(Finding("bad-marker", where, "a receipt marker with no number before it"))
            continue
        findings += _check_number(numbers[-1], match.group(2), results_dir, where)
        # Other measured-looking numbers in the same segment are not covered by this marker.
        findings += _measured_looking(segment[: segment.rfind(numbers[-1])], line, where)
    findings += _measured_looking(line[start:], line, where)
    return findings


def _measured_looking(text: str, line: str, where: str) -> list[Finding]:
    matches = list(SPEED.finditer(text))
    if HARDWARE_OR_SPEED.search(line):
        matches += AMOUNT.finditer(text)
    return [_unbacked(m, where) for m in sorted(matches, key=lambda m: m.start())]


def _unbacked(match: re.Match, where: str) -> Finding:
    return Finding("unbacked", where, f"'{match.group(0)}' looks measured but names no receipt")


def _check_citation(source: str, root: Path, where: str) -> list[Finding]:
    """A citation names a public source, or a file of this repository first (then what part of it)."""
    if PUBLIC_SOURCE.search(source):
        return []
    first = source.split()[0] if source.split() else ""
    path = (root / first).resolve()
    if first and path.is_relative_to(root.resolve()) and path.exists():
        return []
    return [Finding("bad-citation", where, f"'{source}' names no public source (URL, arXiv:ID, doi:ID, "
                    "github.com/OWNER/REPO PATH) and no file of this repository")]  # fmt: skip


def _check_number(shown: str, spec: str, results_dir: Path, where: str) -> list[Finding]:
    try:
        receipt, value = marked_receipt(spec, results_dir)
    except (ReceiptError, KeyError, ValueError, FileNotFoundError) as exc:
        return [Finding("bad-marker", where, f"'{spec}': {exc}")]
    if is_dirty(receipt):
        git = receipt["hardware"].get("git", {})
        state = (
            f"{(git.get('commit') or 'unknown')[:10]}+dirty"
            if git.get("dirty")
            else "an unrecorded tree state"
        )
        return [Finding("dirty-receipt", where, f"{shown} comes from {receipt['id']}, measured at {state}: "
                        "re-measure on a clean commit")]  # fmt: skip
    text = shown.replace(",", "").lstrip("+")
    decimals = len(text.split(".")[1]) if "." in text else 0
    # The doc may round the receipt's value to the precision it shows, and no further.
    if abs(Decimal(text) - Decimal(repr(value))) > Decimal(5) * Decimal(10) ** (-decimals - 1):
        return [Finding("mismatch", where, f"shows {shown} but the receipt says {value} ({spec})")]
    return []


def marked_receipt(spec: str, results_dir: Path) -> tuple[dict, float]:
    """Resolve `PATH#FIELD[*SCALE]` or `latest:SUITE/HW/NAME#FIELD[*SCALE]` to (the receipt, the number)."""
    target, _, field = spec.partition("#")
    if not field:
        raise ValueError("expected PATH#FIELD")
    field, _, scale = field.partition("*")
    receipt = load_receipt(report.find_receipt(target.strip(), results_dir))
    value = resolve_field(receipt, field.strip())
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ValueError(f"field '{field}' is not a number")
    return receipt, value * float(scale) if scale else value


def marker_value(spec: str, results_dir: Path) -> float:
    return marked_receipt(spec, results_dir)[1]


def reproduced_claims(root: Path) -> list[str]:
    """One line per receipt-backed number in README.md: the clean re-runs that reproduce its receipt on
    its hardware, or that none does yet."""
    results_dir = root / "results"
    lines = []
    for lineno, line in _prose_lines((root / "README.md").read_text().splitlines(keepends=True)):
        for match, segment in _marker_segments(CODE_SPAN.sub("", line)):
            numbers = NUMBER.findall(segment)
            if match.group(1) != "receipt" or not numbers:
                continue
            claim = f"README.md:{lineno}: {numbers[-1]} ({match.group(2)})"
            try:
                receipt, _ = marked_receipt(match.group(2), results_dir)
            except (ReceiptError, KeyError, ValueError, FileNotFoundError) as exc:
                lines.append(f"{claim}: unresolvable ({exc})")
                continue
            found = reproductions(receipt, results_dir)
            hardware = receipt["hardware"]["hardware_id"]
            caveat = " (the cited receipt itself is from a dirty tree)" if is_dirty(receipt) else ""
            if found:
                names = ", ".join(p.relative_to(results_dir).as_posix() for p, _ in found)
                lines.append(f"{claim}: reproduced on {hardware} by {names}{caveat}")
            else:
                lines.append(f"{claim}: no passing reproduction on {hardware} yet{caveat}")
    return lines


def sync_document(doc: Path, results_dir: Path) -> int:
    """Rewrite each receipt-marked number in place with its receipt's value (same precision); returns changes."""
    changed = 0
    lines = doc.read_text().splitlines(keepends=True)
    for lineno, line in _prose_lines(lines):
        out, start = [], 0
        spans = [m.span() for m in CODE_SPAN.finditer(line)]
        for match in MARKER.finditer(line):
            if match.group(1) != "receipt" or any(a <= match.start() < b for a, b in spans):
                continue
            segment = line[start : match.start()]
            numbers = list(NUMBER.finditer(segment))
            if numbers:
                num = numbers[-1]
                shown = num.group(0)
                decimals = len(shown.split(".")[1]) if "." in shown else 0
                fresh = f"{marker_value(match.group(2), results_dir):,.{decimals}f}"
                if "," not in shown:
                    fresh = fresh.replace(",", "")
                changed += fresh != shown
                segment = segment[: num.start()] + fresh + segment[num.end() :]
            out.append(segment + match.group(0))
            start = match.end()
        out.append(line[start:])
        lines[lineno - 1] = "".join(out)
    doc.write_text("".join(lines))
    return changed
