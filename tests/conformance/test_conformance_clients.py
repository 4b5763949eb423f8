"""Every client x scenario, with the real pinned program, through k3 (`$K3_REPO` picks another checkout)."""

import pytest

from runners.conformance.scenarios import CASES


@pytest.mark.conformance
@pytest.mark.parametrize("case", CASES, ids=[c.key for c in CASES])
def test_client_through_k3(driver, case):
    result = driver.run(case)
    if not result.passed:
        pytest.fail(result.headline() + "\n" + "\n".join(result.details), pytrace=False)
