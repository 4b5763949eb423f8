import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from engine.codec import dequantize, quantize
from engine.quant.artifact import Artifact, ArtifactVerificationError
from engine.quant.build import build_artifact
from engine.quant.manifest import ArtifactError, read_manifest, sha256_file, sha256_tensor, write_manifest
from engine.quant.plan import PlanError, make_plan
from engine.quant.source import SourceCheckpoint
from engine.quant.verify import verify_artifact
from tests.quant.tiny_checkpoint import TINY, write_checkpoint

REPO = Path(__file__).resolve().parents[2]
SHARD_BYTES = 150_000


@pytest.fixture(scope="module")
def artifact(tiny_checkpoint, tmp_path_factory) -> Path:
    destination = tmp_path_factory.mktemp("artifact") / "int4"
    build_artifact(tiny_checkpoint, destination, make_plan("default"), max_shard_bytes=SHARD_BYTES)
    return destination


@pytest.fixture
def damaged(artifact, tmp_path) -> Path:
    """A private copy of the artifact a test may damage."""
    copy = tmp_path / "copy"
    shutil.copytree(artifact, copy)
    return copy


def _rewrite_shard(directory: Path, shard: str, change) -> None:
    path = directory / shard
    with safe_open(path, "pt") as f:
        tensors = {key: f.get_tensor(key) for key in f.keys()}
    change(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})


def test_artifact_holds_stacked_banks_and_exact_codes(artifact, tiny_checkpoint):
    art = Artifact.open(artifact)
    with SourceCheckpoint(tiny_checkpoint) as source:
        bank = art.expert_bank(2, "w1")
        assert bank.routed == 6 and bank.shared_slot == 6
        assert bank.weight.format == "int4" and bank.weight.data.shape == (7, 64, 64)
        assert bank.weight.scales.shape == (7, 64, 4)
        for slot, name in [(4, "experts.4.w1"), (6, "shared_experts.gate_proj")]:
            weight = source.tensor(f"model.layers.2.block_sparse_moe.{name}.weight")
            expected = quantize(weight, "int4", 32, rounding="signed")  # the plans' default
            assert torch.equal(bank.weight.data[slot], expected.data)
            assert torch.equal(bank.weight.scales[slot], expected.scales)
        down = art.expert_bank(1, "w2")
        assert down.weight.shape == (7, 128, 64)
        q = art.linear("model.layers.2.self_attn.kv_b_proj.weight")
        assert q.format == "int4" and q.shape == (128, 64)
        for kept in [
            "lm_head.weight",
            "model.layers.0.self_attn.A_log",
            "model.layers.1.block_sparse_moe.gate.weight",
        ]:
            assert torch.equal(art.tensor(kept), source.tensor(kept))
        assert art.tensor("model.layers.0.self_attn.dt_bias").dtype == torch.float32
        assert art.linear("lm_head.weight").format == "dense"


def test_manifest_records_plan_codec_shapes_and_hashes(artifact, tiny_checkpoint):
    manifest = read_manifest(artifact)
    assert manifest["plan"]["name"] == "default" and manifest["codec"]["group_size"] == 32
    assert "low nibble" in manifest["codec"]["int4"]["packing"]
    with SourceCheckpoint(tiny_checkpoint) as source:
        assert len(source.shards) >= 3
        assert set(manifest["source"]["files_sha256"]) == {"model.safetensors.index.json", *source.shards}
    assert manifest["source"]["layout_checked_against_config"] is True
    entry = manifest["tensors"]["model.layers.1.block_sparse_moe.expert_bank.w3"]
    assert entry["shape"] == [7, 64, 128] and entry["sources"][-1].endswith("shared_experts.up_proj.weight")
    assert len(entry["source_sha256"]) == 7
    assert (artifact / "config.json").is_file() and "config.json" in manifest["auxiliary_files"]
    for shard, meta in manifest["shards"].items():
        size = (artifact / shard).stat().st_size
        keys = len(safe_open(artifact / shard, "pt").keys())
        assert meta["bytes"] == size and (size <= SHARD_BYTES + 20_000 or keys == 1)  # bounded shards


def test_clean_artifact_verifies_against_its_source(artifact):
    report = verify_artifact(artifact, sample=None)
    assert report.ok, report.summary()
    assert report.source_used is not None and len(report.roundtrips) == 133
    assert max(r.worst_ratio for r in report.roundtrips) <= 1.0


def test_flipped_byte_is_named(damaged):
    manifest = read_manifest(damaged)
    record = manifest["tensors"]["model.layers.0.self_attn.o_proj.weight"]["parts"]["codes"]
    path = damaged / record["shard"]
    header_len = int.from_bytes(path.read_bytes()[:8], "little")
    start = json.loads(path.read_bytes()[8 : 8 + header_len])[record["key"]]["data_offsets"][0]
    data = bytearray(path.read_bytes())
    data[8 + header_len + start + 5] ^= 0x10
    path.write_bytes(bytes(data))
    report = verify_artifact(damaged)
    assert not report.ok
    problems = [str(p) for p in report.problems]
    assert any(record["shard"] in p and "sha256" in p for p in problems)
    assert any(p.startswith("model.layers.0.self_attn.o_proj.weight [codes]") for p in problems), problems


def test_swapped_tensors_are_named_as_swapped(damaged):
    manifest = read_manifest(damaged)
    a = manifest["tensors"]["model.layers.1.input_layernorm.weight"]["parts"]["tensor"]
    b = manifest["tensors"]["model.layers.1.post_attention_layernorm.weight"]["parts"]["tensor"]
    assert a["shard"] == b["shard"]

    def swap(tensors):
        tensors[a["key"]], tensors[b["key"]] = tensors[b["key"]], tensors[a["key"]]

    _rewrite_shard(damaged, a["shard"], swap)
    problems = [str(p) for p in verify_artifact(damaged).problems]
    assert any(
        "input_layernorm" in p and "post_attention_layernorm.weight (swapped)" in p for p in problems
    ), problems


def _swap_bank_slots_keeping_hashes(directory: Path) -> None:
    """Swap slots 2 and 3 of layer 3's w2 bank and re-record every hash: a mislabelling builder."""
    manifest = read_manifest(directory)
    codes = manifest["tensors"]["model.layers.3.block_sparse_moe.expert_bank.w2"]["parts"]["codes"]

    def swap(tensors):
        bank = tensors[codes["key"]].clone()
        bank[[2, 3]] = bank[[3, 2]]
        tensors[codes["key"]] = bank

    _rewrite_shard(directory, codes["shard"], swap)
    with safe_open(directory / codes["shard"], "pt") as f:
        codes["sha256"] = sha256_tensor(f.get_tensor(codes["key"]))
    manifest["shards"][codes["shard"]]["sha256"] = sha256_file(directory / codes["shard"])
    manifest["shards"][codes["shard"]]["bytes"] = (directory / codes["shard"]).stat().st_size
    write_manifest(directory, manifest)


def test_swapped_experts_with_consistent_hashes_fail_the_round_trip(damaged):
    """A builder bug that mislabels experts is invisible to hashes; the round trip names the slots."""
    _swap_bank_slots_keeping_hashes(damaged)
    assert verify_artifact(damaged, use_recorded_source=False, sample=None).ok  # hashes alone cannot tell
    problems = [str(p) for p in verify_artifact(damaged, sample=None).problems]
    named = {p.split(" (")[0] for p in problems}
    assert named == {
        "model.layers.3.block_sparse_moe.expert_bank.w2 slot 2",
        "model.layers.3.block_sparse_moe.expert_bank.w2 slot 3",
    }, problems


def test_missing_shard_and_unlisted_tensor(damaged):
    manifest = read_manifest(damaged)
    first, last = list(manifest["shards"])[0], list(manifest["shards"])[-1]
    (damaged / last).unlink()
    _rewrite_shard(damaged, first, lambda t: t.update(extra=torch.zeros(3)))
    problems = [str(p) for p in verify_artifact(damaged).problems]
    assert f"{last}: shard file is missing" in problems
    assert f"{first}:extra: tensor not listed in the manifest" in problems


def test_loader_refuses_a_damaged_artifact_unless_told(damaged):
    manifest = read_manifest(damaged)
    record = manifest["tensors"]["model.norm.weight"]["parts"]["tensor"]
    _rewrite_shard(damaged, record["shard"], lambda t: t[record["key"]].mul_(2))
    with pytest.raises(ArtifactVerificationError, match="model.norm.weight"):
        Artifact.open(damaged)
    with pytest.warns(UserWarning, match="without verification"):
        art = Artifact.open(damaged, verify=False)
    assert art.tensor("model.norm.weight").shape == (128,)


def test_group_64_and_int8_head(tiny_checkpoint, tmp_path):
    plan = make_plan("default", group_size=64, lm_head="int8")
    build_artifact(tiny_checkpoint, tmp_path / "a", plan, max_shard_bytes=SHARD_BYTES)
    art = Artifact.open(tmp_path / "a")
    head = art.linear("lm_head.weight")
    assert head.format == "int8" and head.scales.shape == (TINY.vocab_size, TINY.hidden_size // 64)
    with SourceCheckpoint(tiny_checkpoint) as source:
        error = (dequantize(head) - source.tensor("lm_head.weight").float()).abs().max()
    assert 0 < error < 0.01
    assert art.expert_bank(1, "w1").weight.group_size == 64
    assert verify_artifact(tmp_path / "a", sample=None).ok


@pytest.mark.parametrize("rounding,code_range", [("signed", [-8, 7]), ("absmax", [-7, 7])])
def test_each_rounding_is_recorded_and_verifies_and_a_swap_fails(
    tiny_checkpoint, tmp_path, rounding, code_range
):
    """The plans' default (signed, negative scales allowed) and absmax: the manifest names the rounding and
    its code range, verify bounds every element by that rounding's step, and swapped slots fail it."""
    build_artifact(
        tiny_checkpoint, tmp_path / "a", make_plan("default", rounding=rounding), max_shard_bytes=SHARD_BYTES
    )
    manifest = read_manifest(tmp_path / "a")
    assert manifest["plan"]["rounding"] == rounding and manifest["codec"]["int4"]["code_range"] == code_range
    bank = Artifact.open(tmp_path / "a").expert_bank(1, "w1").weight
    assert bool((bank.scales < 0).any()) == (rounding == "signed")
    report = verify_artifact(tmp_path / "a", sample=None)
    assert report.ok and 0.5 < max(r.worst_ratio for r in report.roundtrips) <= 1, report.summary()
    _swap_bank_slots_keeping_hashes(tmp_path / "a")
    assert not verify_artifact(tmp_path / "a", sample=None).ok


def test_mse_rounding_artifact_verifies_and_a_swap_fails_its_bound(tiny_checkpoint, tmp_path):
    """The searched scales keep the artifact's layout; verify bounds each group by the absmax encoding's error."""
    build_artifact(tiny_checkpoint, tmp_path / "a", make_plan("int4-embed-mse"), max_shard_bytes=SHARD_BYTES)
    manifest = read_manifest(tmp_path / "a")
    assert manifest["plan"]["rounding"] == "mse" and manifest["codec"]["int4"]["code_range"] == [-8, 7]
    assert manifest["tensors"]["model.embed_tokens.weight"]["precision"] == "int4"
    report = verify_artifact(tmp_path / "a", sample=None)
    assert report.ok and 0 < max(r.worst_ratio for r in report.roundtrips) <= 1, report.summary()
    assert verify_artifact(tmp_path / "a", use_recorded_source=False, sample=None).ok
    _swap_bank_slots_keeping_hashes(tmp_path / "a")
    named = {str(p).split(" (")[0] for p in verify_artifact(tmp_path / "a", sample=None).problems}
    assert named == {f"model.layers.3.block_sparse_moe.expert_bank.w2 slot {s}" for s in (2, 3)}


def test_refuses_unknown_tensors_and_leaves_nothing_behind(tmp_path):
    source = write_checkpoint(tmp_path / "src", shards=1)
    (source / "config.json").unlink()
    save_file(
        {"model.layers.0.self_attn.mystery_proj.weight": torch.zeros(4, 32)},
        str(source / "extra.safetensors"),
    )
    index = json.loads((source / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.layers.0.self_attn.mystery_proj.weight"] = "extra.safetensors"
    (source / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(PlanError, match="mystery_proj"):
        build_artifact(source, tmp_path / "out", make_plan("default"))
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()


def test_checkpoint_must_match_its_config(tmp_path):
    source = write_checkpoint(tmp_path / "src", shards=2)
    config = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(json.dumps(config | {"num_experts": 7}))
    with pytest.raises(ArtifactError, match=r"missing model\.layers\.1\.block_sparse_moe\.experts\.6\.w1"):
        build_artifact(source, tmp_path / "out", make_plan("default"))


def test_refuses_to_overwrite(artifact, tiny_checkpoint, tmp_path):
    with pytest.raises(ArtifactError, match="exists"):
        build_artifact(tiny_checkpoint, artifact, make_plan("default"))
    (tmp_path / "precious").mkdir()
    with pytest.raises(ArtifactError, match="not an artifact"):
        build_artifact(tiny_checkpoint, tmp_path / "precious", make_plan("default"), overwrite=True)


def _engine(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "engine", *args], cwd=REPO, capture_output=True, text=True, timeout=120
    )


def test_cli_quantize_then_verify(tiny_checkpoint, tmp_path):
    destination = tmp_path / "cli"
    result = _engine(
        "quantize", str(tiny_checkpoint), str(destination), "--plan", "int4-head", "--shard-mib", "1"
    )
    assert result.returncode == 0, result.stderr
    assert "source tensors quantised" in result.stdout and result.stdout.rstrip().endswith("OK")
    assert read_manifest(destination)["plan"]["precisions"]["lm_head"] == "int4"

    path = destination / next(iter(read_manifest(destination)["shards"]))
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(bytes(data))
    result = _engine("verify", str(destination), "--no-source")
    assert result.returncode == 1
    assert "PROBLEM" in result.stdout and "FAILED" in result.stdout


def test_cli_reports_bad_input_cleanly(tiny_checkpoint, tmp_path):
    result = _engine("quantize", str(tiny_checkpoint), str(tmp_path / "x"), "--group-size", "48")
    assert result.returncode == 1 and "power of two" in result.stderr and "Traceback" not in result.stderr
