"""The receipt of a run, and docs/CLIENTS.md rendered from it (and only from it)."""

from harness.receipt import load_receipt
from runners.conformance import report
from runners.conformance.scenarios import CASES, Result


def results():
    chosen = [CASES[0], CASES[1]]
    return [
        Result(
            chosen[0], True, 1.25, traffic=["HEAD / -> 200", "POST /v1/messages -> 200"], engine=["agent"]
        ),
        Result(
            chosen[1], False, 2.5, "engine request #2 | lacks 'x'", traffic=["HEAD / -> 200"], engine=["side"]
        ),
    ]


def test_receipt_holds_verdicts_versions_and_seconds(tmp_path):
    path = report.write(results(), tmp_path, 60.0, results_dir=tmp_path / "results")
    receipt = load_receipt(path)
    first, second = CASES[0].key, CASES[1].key
    assert receipt["suite"] == "conformance" and receipt["samples"] == {first: [1.25], second: [2.5]}
    assert receipt["units"][first] == "s"
    assert receipt["derived"] == {"cases": 2.0, "passed": 1.0, "failed": 1.0}
    cases = receipt["config"]["cases"]
    assert cases[first]["passed"] and not cases[second]["passed"] and "lacks" in cases[second]["problem"]
    assert receipt["config"]["clients"]["claude-code"] == {
        "package": "@anthropic-ai/claude-code",
        "version": "2.1.197",
    }


def test_docs_table_comes_from_the_newest_receipt(tmp_path):
    results_dir = tmp_path / "results"
    assert "No conformance receipt yet" in report.render(results_dir)
    report.write(results()[:1], tmp_path, 60.0, results_dir=results_dir)
    newest = report.write(results(), tmp_path, 60.0, results_dir=results_dir)
    page = report.render(results_dir)
    assert newest.relative_to(results_dir).as_posix() in page
    assert "1 of 2 cases pass" in page
    assert "| Claude Code | 2.1.197 | anthropic | plain | yes | pass | 1.2 |" in page
    assert "`` engine request #2 | lacks 'x' ``" in page  # evidence keeps its spaces and pipes
    assert "| Claude Code | HEAD / -> 200<br>POST /v1/messages -> 200 | agent, side |" in page


def test_setup_blocks_are_the_ones_the_runs_use():
    page = report.render()
    assert "export ANTHROPIC_BASE_URL=http://127.0.0.1:8080" in page
    assert 'base_url = "http://127.0.0.1:8080/v1"' in page and 'wire_api = "responses"' in page
    assert '"npm": "@ai-sdk/openai-compatible"' in page and '"npm": "@ai-sdk/anthropic"' in page
    assert "aider --model openai/kimi-linear" in page


def test_committed_docs_match_the_newest_receipt():
    assert report.DOC.read_text() == report.render(), (
        "docs/CLIENTS.md is stale: python -m runners.conformance docs"
    )
