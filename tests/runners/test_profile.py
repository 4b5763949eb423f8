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


def test_profile_prefill_splits_each_prefill_and_sums_to_its_time(tmp_path):
    result = CliRunner().invoke(
        main, ["profile", "--synthetic", "tiny", "--prefill", "40", "--steps", "2", "--kda-kernel", "torch",
               "--results", str(tmp_path), "--no-regenerate"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    (receipt,) = map(load_receipt, receipt_paths(tmp_path))
    assert receipt["suite"] == "profile-prefill" and receipt["config"]["prompt_tokens"] == 40
    samples = receipt["samples"]
    assert {"kda_attention", "mla_attention", "moe_experts", "lm_head"} <= set(samples)
    assert all(len(v) == 2 for v in samples.values())
    assert all(x > 0 for k, v in samples.items() if k != "other" for x in v)
    assert receipt["units"]["kda_attention"] == "ms/prefill"
    assert receipt["config"]["kda_prefill_kernel"] == "torch" and receipt["name"].endswith(".p40.kda-torch")


def test_count_kernels_writes_a_kernel_count_receipt_without_a_gpu(tmp_path):
    result = CliRunner().invoke(
        main,
        ["profile", "--count-kernels", "--synthetic", "tiny", "--context", "8", "--results", str(tmp_path)],
    )
    assert result.exit_code == 0, result.output
    (receipt,) = map(load_receipt, receipt_paths(tmp_path))
    assert receipt["suite"] == "kernel-count" and receipt["config"]["device"] == "meta"
    for batch in (1, 8):
        samples = {k: v[0] for k, v in receipt["samples"].items() if k.endswith(f"_b{batch}")}
        assert (
            samples[f"kernels_b{batch}"]
            == samples[f"aten_kernels_b{batch}"] + samples[f"triton_launches_b{batch}"]
        )
        triton = receipt["config"]["breakdown"][f"b{batch}"]["triton"]
        # One x permute per quantised GEMV, split-K reduced inside the GEMV kernel: no extra sum or copy.
        gemvs = triton["_gemv_kernel"] + triton["_grouped_swiglu_kernel"]
        assert (
            triton["_permute_kernel"] <= gemvs
            and sum(triton.values()) == samples[f"triton_launches_b{batch}"]
        )
