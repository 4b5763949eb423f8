"""docs/CLAIMS.md and the audit rule: a published speed above its computed ceiling fails the audit unless
it states a reason the ceiling leaves out (speculation, batching); a fit the plan contradicts fails too."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from harness import claims
from harness.audit import check_claims, run_audit
from harness.claims import Claim, check, findings
from harness.cli import main

REPO = Path(__file__).resolve().parents[2]
# The ceiling of this setup is 350.54 tok/s (tests/harness/test_plan.py works it out by hand).
L40S = dict(model="kimi-linear-48b", hardware="1xL40S", context=17, source="github.com/a/b README.md")


def _decode(value: float, reason: str | None = None) -> Claim:
    return Claim(99, "a test claim", f"{value} tok/s", kind="decode", value=value, reason=reason, **L40S)


def test_the_committed_page_is_fresh_and_every_published_claim_passes():
    assert check_claims(REPO) == []


def test_a_claim_above_its_ceiling_without_a_reason_fails():
    result = check(_decode(400.0))
    assert result.above_ceiling and "above its computed batch-1 ceiling (350.54 tok/s)" in result.finding
    assert findings([result]) == [(99, result.finding)]
    assert check(_decode(350.0)).finding is None  # just under the ceiling: consistent


@pytest.mark.parametrize("reason", ["speculation: drafted tokens", "batching: 16 streams"])
def test_a_stated_reason_lets_a_claim_exceed_its_batch1_ceiling(reason):
    result = check(_decode(900.0, reason))
    assert result.above_ceiling and result.finding is None


def test_a_reason_the_rule_does_not_know_is_no_reason():
    assert check(_decode(900.0, "tuning: a very good kernel")).finding is not None


def test_speed_on_hardware_it_does_not_fit_fails():
    claim = Claim(98, "t", "t", "github.com/a/b", "kimi-k3", "8xB200", "decode", 10.0, context=36_000)
    assert "the model does not fit" in check(claim).finding


def test_a_fit_the_plan_contradicts_fails():
    claim = Claim(97, "t", "t", "github.com/a/b", "kimi-k3", "8xB200", "fits", context=36_000)
    assert "says it fits, but the plan needs 1,570.42 GB of 1,440.00 GB" in check(claim).finding
    assert check(Claim(97, "t", "t", "github.com/a/b", "kimi-k3", "8xB200", "does not fit")).finding is None


def test_the_audit_and_the_claims_command_fail_on_a_bad_claim(monkeypatch, tmp_path):
    monkeypatch.setattr(claims, "CLAIMS", [_decode(400.0)])
    (tmp_path / "harness").mkdir()
    (tmp_path / "harness" / "claims.py").write_text("")  # marks a checkout: the audit checks its claims
    (tmp_path / "docs").mkdir()
    kinds = {f.kind for f in run_audit(tmp_path)}
    assert {"implausible-claim", "stale-claims"} <= kinds
    result = CliRunner().invoke(main, ["claims", "--root", str(tmp_path)])
    assert result.exit_code == 1 and "claim 99" in result.output
    assert "**Audit finding**: claims 400.0 tok/s" in (tmp_path / "docs" / "CLAIMS.md").read_text()


def test_a_hand_edited_page_is_stale(tmp_path):
    (tmp_path / "docs").mkdir()
    page = (REPO / "docs" / "CLAIMS.md").read_text().replace("350.54", "360.00")
    (tmp_path / "docs" / "CLAIMS.md").write_text(page)
    assert [f.kind for f in check_claims(tmp_path)] == ["stale-claims"]


def test_claims_cannot_be_malformed():
    with pytest.raises(ValueError, match="kind"):
        Claim(1, "t", "t", "s", "kimi-k3", "8xB300", "fast")
    with pytest.raises(ValueError, match="value"):
        Claim(1, "t", "t", "s", "kimi-k3", "8xB300", "decode")
