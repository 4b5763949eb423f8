"""Each audit finding, planted in a temporary copy of a clean project."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness import figures, report
from harness.audit import run_audit
from harness.cli import main
from harness.receipt import load_receipt
from tests.harness.conftest import HARDWARE

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def project(tmp_path, make_receipt):
    """A clean project: receipts, regenerated RESULTS.md and figures, docs quoting one number."""
    path = make_receipt(samples={"encode_us": [1.25, 1.5, 2.0]})
    root = tmp_path
    (root / "results" / "RESULTS.md").write_text(report.render(root / "results"))
    figures.write_all(root / "results", root / "docs" / "figures")
    rel = path.relative_to(root / "results").as_posix()
    (root / "README.md").write_text(
        "# demo\n\nEncoding an event takes 1.50 µs <!-- receipt: " + rel + "#summary.encode_us.median -->.\n"
        "The peer adds 0.23 ms per request <!-- cited: https://github.com/RightNow-AI/local-kimi/blob/main/README.md -->.\n"
        "```\nnox -s bench-decode  # prints 100 tok/s inside a code block: not a claim\n```\n"
        "Run `curl --max-time 5%` in code spans freely.\n"
    )
    (root / "docs" / "NOTES.md").write_text("Port 8080 and 3 layers are not measurements.\n")
    return root, path


def kinds(root):
    return sorted(f.kind for f in run_audit(root))


def test_clean_project_passes(project):
    root, _ = project
    assert run_audit(root) == []
    result = CliRunner().invoke(main, ["audit", "--root", str(root)])
    assert result.exit_code == 0 and "audit: clean" in result.output


def test_tampered_receipt(project):
    root, path = project
    receipt = json.loads(path.read_text())
    receipt["samples"]["encode_us"][0] = 0.5
    path.write_text(json.dumps(receipt))
    assert kinds(root) == ["bad-receipt"]
    result = CliRunner().invoke(main, ["audit", "--root", str(root)])
    assert result.exit_code == 1 and "bad-receipt" in result.output


def test_stale_report_when_a_receipt_is_added(project, make_receipt):
    root, _ = project
    make_receipt(suite="proxy", name="chat")
    assert "stale-report" in kinds(root)


def test_hand_edited_report(project):
    root, _ = project
    page = root / "results" / "RESULTS.md"
    page.write_text(page.read_text().replace("| 1.5 |", "| 1.4 |"))
    assert kinds(root) == ["stale-report"]


def test_stale_missing_and_orphan_figures(project):
    root, _ = project
    figdir = root / "docs" / "figures"
    data = json.loads((figdir / "harness_selfcheck.json").read_text())
    data["bars"][0]["median"] = 99
    (figdir / "harness_selfcheck.json").write_text(json.dumps(data))
    (figdir / "harness_selfcheck.pdf").unlink()
    shutil.copy(figdir / "harness_selfcheck.png", figdir / "old_figure.png")
    assert kinds(root) == ["orphan-figure", "stale-figure", "stale-figure"]


def test_number_that_differs_from_its_receipt(project):
    root, _ = project
    readme = root / "README.md"
    readme.write_text(readme.read_text().replace("1.50 µs", "1.60 µs"))
    findings = run_audit(root)
    assert [f.kind for f in findings] == ["mismatch"]
    assert "README.md:3" in findings[0].where and "1.60" in findings[0].message


def test_rounding_is_only_as_loose_as_the_shown_precision(project):
    root, _ = project
    readme = root / "README.md"
    readme.write_text(readme.read_text().replace("1.50 µs", "1.5 µs"))
    assert kinds(root) == []
    readme.write_text(readme.read_text().replace("1.5 µs", "2 µs"))  # 1.5 rounds to 2 at 0 decimals
    assert kinds(root) == []
    readme.write_text(readme.read_text().replace("2 µs", "1.499 µs"))
    assert kinds(root) == ["mismatch"]


def test_bad_markers(project):
    root, path = project
    rel = path.relative_to(root / "results").as_posix()
    (root / "docs" / "BAD.md").write_text(
        f"a <!-- receipt: {rel}#summary.nope.median -->\n"
        "b 3 ms <!-- receipt: harness/none.json#summary.x -->\n"
        f"c 3 ms <!-- receipt: {rel} -->\n"
    )
    assert kinds(root) == ["bad-marker"] * 3


def test_unbacked_measured_numbers(project):
    root, _ = project
    (root / "docs" / "CLAIMS.md").write_text(
        "Decode runs at 150 tok/s on an H200.\nIt reaches 81.5% of copy bandwidth using 31 GiB.\n"
    )
    findings = run_audit(root)
    assert [f.kind for f in findings] == ["unbacked"] * 3
    assert {f.where for f in findings} == {"docs/CLAIMS.md:1", "docs/CLAIMS.md:2"}


def test_sizes_and_ratios_look_measured_only_next_to_hardware_or_speed_words(project):
    root, _ = project
    (root / "docs" / "SIZES.md").write_text(
        "Shards hold at most 4 GiB each and the plan keeps 2% of tensors.\n"  # not a claim
        "Decode reads 2.4 GB per token, 1.5× less than before.\n"  # two claims
        "The H200 has 141 GB <!-- cited: https://www.nvidia.com/en-us/data-center/h200/ --> and the state is 40 MiB <!-- computed: shapes -->.\n"
    )
    findings = run_audit(root)
    assert [(f.kind, f.where) for f in findings] == [("unbacked", "docs/SIZES.md:2")] * 2


def test_a_marker_backs_only_its_own_number(project):
    root, path = project
    rel = path.relative_to(root / "results").as_posix()
    (root / "docs" / "TWO.md").write_text(
        f"9 ms then 1.5 µs <!-- receipt: {rel}#summary.encode_us.median -->\n"
    )
    assert kinds(root) == ["unbacked"]


def test_latest_marker_and_scaled_field(project, make_receipt):
    root, _ = project
    make_receipt(name="frac", samples={"f": [0.25, 0.5, 0.75]}, units={"f": "fraction"})
    (root / "results" / "RESULTS.md").write_text(report.render(root / "results"))
    figures.write_all(root / "results", root / "docs" / "figures")
    (root / "docs" / "PCT.md").write_text(
        "Half: 50% <!-- receipt: latest:harness/cpu-2c-Test-CPU/frac#summary.f.median*100 -->\n"
    )
    assert kinds(root) == []


def test_sync_docs_rewrites_numbers_from_receipts(project):
    root, path = project
    readme = root / "README.md"
    readme.write_text(readme.read_text().replace("1.50 µs", "7.00 µs"))
    assert kinds(root) == ["mismatch"]
    result = CliRunner().invoke(main, ["sync-docs", str(readme), "--results", str(root / "results")])
    assert result.exit_code == 0 and "1 number(s) updated" in result.output
    assert "1.50 µs" in readme.read_text()
    assert kinds(root) == []


def test_compare_flags_regressions(make_receipt):
    base = make_receipt(name="b", samples={"ms": [1.0, 1.0, 1.0]}, units={"ms": "ms"})
    slower = make_receipt(name="n", samples={"ms": [1.3, 1.3, 1.3]}, units={"ms": "ms"})
    runner = CliRunner()
    args = ["compare", str(base), str(slower), "--metric", "summary.ms.median"]
    ok = runner.invoke(main, [*args, "--max-regression", "50"])
    assert ok.exit_code == 0 and "ratio 1.3000" in ok.output
    bad = runner.invoke(main, [*args, "--max-regression", "10"])
    assert bad.exit_code == 1
    # Higher-is-better metrics regress when they fall.
    assert runner.invoke(main, [*args, "--max-regression", "10", "--higher-is-better"]).exit_code == 0
    missing = runner.invoke(main, ["compare", str(base), str(slower), "--metric", "summary.x.median",
                                   "--max-regression", "10"])  # fmt: skip
    assert missing.exit_code != 0 and "no field 'x'" in missing.output
    assert load_receipt(base)["summary"]["ms"]["median"] == 1.0


def test_real_measurement_end_to_end(tmp_path, monkeypatch):
    """A real (small) measurement → receipts → RESULTS.md → figures → a doc citing it → a clean audit."""
    from harness import hardware
    from harness.selfcheck import run_selfcheck

    # As if measured on a clean commit, whatever state this checkout is in while the tests run.
    monkeypatch.setattr(hardware, "git_state", lambda: {"commit": "0" * 40, "dirty": False})

    orjson_path, json_path = run_selfcheck(repeats=3, batch=50, results_dir=tmp_path / "results")
    runner = CliRunner()
    assert runner.invoke(main, ["report", "--results", str(tmp_path / "results")]).exit_code == 0
    out = tmp_path / "docs" / "figures"
    assert (
        runner.invoke(main, ["figures", "--results", str(tmp_path / "results"), "--out", str(out)]).exit_code
        == 0
    )
    rel = orjson_path.relative_to(tmp_path / "results").as_posix()
    (tmp_path / "README.md").write_text(
        f"orjson: 0.000 µs <!-- receipt: {rel}#summary.encode_us.median -->\n"
    )
    assert kinds(tmp_path) == ["mismatch"]  # the placeholder differs from the measurement
    runner.invoke(main, ["sync-docs", str(tmp_path / "README.md"), "--results", str(tmp_path / "results")])
    assert kinds(tmp_path) == []
    assert load_receipt(json_path)["summary"]["encode_us"]["n"] == 3


@pytest.mark.parametrize("dirty", [True, None])
def test_a_number_from_a_dirty_tree_is_refused(project, make_receipt, dirty):
    root, _ = project
    dirty_hardware = HARDWARE | {"git": {"commit": "fedcba9876543210", "dirty": dirty}}
    path = make_receipt(name="dirty", samples={"encode_us": [2.0, 2.0]}, hardware=dirty_hardware)
    (root / "results" / "RESULTS.md").write_text(report.render(root / "results"))
    figures.write_all(root / "results", root / "docs" / "figures")
    rel = path.relative_to(root / "results").as_posix()
    (root / "docs" / "D.md").write_text(
        f"It takes 2.0 µs <!-- receipt: {rel}#summary.encode_us.median -->.\n"
    )
    findings = run_audit(root)
    assert [(f.kind, f.where) for f in findings] == [("dirty-receipt", "docs/D.md:1")]
    assert path.stem in findings[0].message
    assert ("fedcba9876+dirty" in findings[0].message) == bool(dirty)


def test_citations_name_a_public_source_or_a_file_here(project):
    root, _ = project
    (root / "docs" / "C.md").write_text(
        "a 1 ms <!-- cited: https://example.org/paper.pdf -->\n"
        "b 1 ms <!-- cited: arXiv:2510.26692 §4 -->\n"
        "c 1 ms <!-- cited: github.com/RightNow-AI/local-kimi README.md -->\n"
        "d 1 ms <!-- cited: docs/NOTES.md -->\n"
        "e 1 ms <!-- cited: shared/reference/k3-behaviour.md §10 -->\n"  # not in the repository
        "f 1 ms <!-- cited: ../outside.md -->\n"
        "g 1 ms <!-- cited: vendor sheet -->\n"
    )
    (root / "outside.md").touch()
    findings = run_audit(root)
    assert [(f.kind, f.where) for f in findings] == [
        ("bad-citation", "docs/C.md:5"), ("bad-citation", "docs/C.md:6"), ("bad-citation", "docs/C.md:7")
    ]  # fmt: skip


def test_the_audit_checks_the_checkout_it_runs_in(tmp_path):
    """In a checkout with a planted defect, `python -m harness audit` run from a subdirectory (no --root)
    audits that checkout and finds it. (The real repository's own audit is CI's `nox -s audit`.)"""
    copy = tmp_path / "copy"
    (copy / "docs").mkdir(parents=True)
    (copy / "results").mkdir()
    subprocess.run(["git", "init", "-q", str(copy)], check=True)
    readme = copy / "README.md"
    readme.write_text("# A project\n\nDecode runs at 999 tok/s on an H200.\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-m", "harness", "audit"], cwd=copy / "docs", env=env,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 1, out.stdout + out.stderr
    assert "unbacked: README.md:3: '999 tok/s'" in out.stdout
    assert str(copy.resolve()) in out.stderr


def test_outside_a_checkout_the_audit_asks_for_a_root(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "GIT_CEILING_DIRECTORIES": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "harness", "audit"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 2 and "--root" in out.stderr
