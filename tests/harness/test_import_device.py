import io
import json
import tarfile

import pytest
from click.testing import CliRunner

from harness.cli import main
from harness.receipt import load_receipt, receipt_paths


def _tar(tmp_path, members: dict[str, bytes]):
    path = tmp_path / "gpu-check-receipts.tar"
    with tarfile.open(path, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_receipts_land_under_results_by_their_own_id(make_receipt, tmp_path):
    made = [make_receipt(name="copy"), make_receipt(suite="kernels", name="w4a16_gemv.triton@lm_head:B1")]
    members = {f"results/{p.relative_to(make_receipt.results)}": p.read_bytes() for p in made}
    members["log.txt"] = b"the run's log\n"
    members["results/elsewhere/../../../escape.json"] = made[0].read_bytes()  # placed by its id, not here
    tar = _tar(tmp_path, members)
    results = tmp_path / "imported"
    first = CliRunner().invoke(main, ["import-device", str(tar), "--results", str(results)])
    assert first.exit_code == 0, first.output
    assert "2 receipts imported, 1 already there" in first.output
    imported = receipt_paths(results)
    assert sorted(p.relative_to(results) for p in imported) == sorted(
        p.relative_to(make_receipt.results) for p in made
    )
    assert all(load_receipt(p) for p in imported)
    assert not (tmp_path / "escape.json").exists()
    again = CliRunner().invoke(main, ["import-device", str(tar), "--results", str(results)])
    assert "0 receipts imported, 3 already there" in again.output


@pytest.mark.parametrize("defect", ["edited", "id"])
def test_a_bad_receipt_is_refused_before_anything_is_written(make_receipt, tmp_path, defect):
    good = make_receipt(name="good")
    receipt = json.loads(good.read_bytes())
    if defect == "edited":
        receipt["config"]["seed"] = -1.0
    else:
        receipt["id"] = "../../outside"
        from harness.receipt import content_hash

        receipt["sha256"] = content_hash(receipt)
    tar = _tar(
        tmp_path, {"results/a.json": good.read_bytes(), "results/b.json": json.dumps(receipt).encode()}
    )
    results = tmp_path / "imported"
    run = CliRunner().invoke(main, ["import-device", str(tar), "--results", str(results)])
    assert run.exit_code == 1 and "results/b.json" in run.output
    assert ("sha256" if defect == "edited" else "'id'") in run.output
    assert not results.exists()
