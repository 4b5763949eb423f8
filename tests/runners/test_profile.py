from click.testing import CliRunner

from harness.receipt import load_receipt, receipt_paths
from runners.cli import main


def test_profile_splits_every_step_by_component(tmp_path):
    result = CliRunner().invoke(
        main, ["profile", "--synthetic", "tiny", "--context", "8", "--steps", "3", "--results", str(tmp_path),
               "--no-regenerate"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    (receipt,) = map(load_receipt, receipt_paths(tmp_path))
    samples = receipt["samples"]
    # tiny has KDA and MLA layers, a dense first layer, MoE layers with a shared expert, and a head.
    assert {"kda_attention", "mla_attention", "moe_router", "moe_experts", "shared_expert", "dense_mlp",
            "lm_head", "other"} <= set(samples)  # fmt: skip
    assert all(len(v) == 3 for v in samples.values())
    assert all(x > 0 for k, v in samples.items() if k != "other" for x in v)
