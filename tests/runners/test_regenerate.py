from harness.figures import FIGURES_DIR
from harness.selfcheck import run_selfcheck
from runners.regenerate import regenerate


def test_a_scratch_run_regenerates_next_to_its_receipts_not_in_the_project(tmp_path):
    before = {p.name: p.read_bytes() for p in FIGURES_DIR.iterdir()}
    run_selfcheck(repeats=2, batch=10, results_dir=tmp_path)
    regenerate(tmp_path)
    assert (tmp_path / "RESULTS.md").exists()
    assert (tmp_path / "figures" / "harness_selfcheck.png").exists()
    assert {p.name: p.read_bytes() for p in FIGURES_DIR.iterdir()} == before
