from pathlib import Path

from click.testing import CliRunner

from harness.receipt import load_receipt, receipt_paths
from runners.cli import main
from tests.runners.runner_support import shards_sha256


def test_the_training_runner_records_a_receipt_and_reuses_the_cache(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(30):
        (corpus / f"m{i}.py").write_text("".join(f"z{j} = {i} - {j}\n" for j in range(40)))
    args = ["training", "--steps", "2", "--corpus", str(corpus), "--cache-dir", str(tmp_path / "cache"),
            "--results", str(tmp_path / "results"), "--no-regenerate"]  # fmt: skip
    for _ in range(2):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.output
    first, second = sorted(
        (load_receipt(p) for p in receipt_paths(tmp_path / "results")), key=lambda r: r["created"]
    )
    assert first["suite"] == "training" and first["name"] == "tiny.seed0.steps2"
    assert (
        not first["config"]["cached"] and second["config"]["cached"] and "from the cache" in second["notes"]
    )
    assert first["derived"]["steps"] == 2 and len(first["samples"]["loss_nats"]) == 2
    assert first["derived"]["heldout_ppl"] < first["derived"]["uniform_ppl"]
    # the same cached weights, and their digest is the file's
    checkpoint = Path(first["config"]["checkpoint"])
    assert (
        first["config"]["weights_sha256"] == second["config"]["weights_sha256"] == shards_sha256(checkpoint)
    )
