"""Synthetic checkpoints: real layout, names, dtypes and realistic scales; the full-size plan; the CLIs."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors import safe_open

from engine import gguf_export
from engine.cli import main
from engine.model.checkpoint_spec import checkpoint_tensors
from engine.model.presets import FULL, SMALL, TINY, WIDE
from engine.quant import make_plan, quantized_meta_model
from engine.synth import init_synthetic_weights, plan_shards, synthetic_tensor, write_synthetic_checkpoint

REPO = Path(__file__).resolve().parents[2]


def read_all(directory: Path) -> dict[str, torch.Tensor]:
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    out = {}
    for shard in sorted(set(index["weight_map"].values())):
        with safe_open(str(directory / shard), framework="pt") as f:
            out.update({k: f.get_tensor(k) for k in f.keys()})
    return out


def test_layout_names_and_dtypes_match_the_real_checkpoint(tiny_dir):
    files = {p.name for p in tiny_dir.iterdir()}
    assert {"config.json", "model.safetensors.index.json", "tiktoken.model", "tokenizer_config.json"} <= files
    shards = sorted(f for f in files if f.endswith(".safetensors"))
    assert len(shards) >= 2 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    tensors = read_all(tiny_dir)
    specs = checkpoint_tensors(TINY)
    assert set(tensors) == {s.name for s in specs}
    for spec in specs:
        assert tensors[spec.name].shape == spec.shape, spec.name
        assert tensors[spec.name].dtype == spec.dtype, spec.name
    fp32 = {n for n, t in tensors.items() if t.dtype == torch.float32}
    assert fp32 == {n for n in tensors if n.endswith(("A_log", "dt_bias"))}
    index = json.loads((tiny_dir / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == sum(s.nbytes for s in specs)


def test_initialisation_scales_are_realistic(tiny_dir):
    t = {k: v.float() for k, v in read_all(tiny_dir).items()}
    q = t["model.layers.0.self_attn.q_proj.weight"]
    assert abs(q.std().item() - TINY.hidden_size**-0.5) < 0.1 * TINY.hidden_size**-0.5
    o = t["model.layers.0.self_attn.o_proj.weight"]  # output projections: half the std
    assert abs(o.std().item() - 0.5 * TINY.kda_dim**-0.5) < 0.05 * TINY.kda_dim**-0.5
    norm = t["model.layers.0.input_layernorm.weight"]
    assert 0.9 < norm.mean() < 1.1 and 0 < norm.std() < 0.2
    a_log = t["model.layers.0.self_attn.A_log"]
    assert (a_log >= 0).all() and (a_log <= torch.log(torch.tensor(16.0))).all() and a_log.std() > 0
    dt = torch.nn.functional.softplus(t["model.layers.0.self_attn.dt_bias"])
    assert (dt > 0.9e-3).all() and (dt < 0.11).all()
    bias = t["model.layers.1.block_sparse_moe.gate.e_score_correction_bias"]
    assert 0 < bias.abs().max() < 0.5
    for name, tensor in t.items():
        assert tensor.std() > 0, f"{name} is constant"
        assert not (0.9 < tensor.std() < 1.1 and abs(tensor.mean()) < 0.1), f"{name} is unit-variance noise"


def test_same_seed_same_weights_other_seed_different():
    spec = checkpoint_tensors(TINY)[5]
    assert torch.equal(synthetic_tensor(spec, 7), synthetic_tensor(spec, 7))
    assert not torch.equal(synthetic_tensor(spec, 7), synthetic_tensor(spec, 8))


def test_full_plan_has_the_real_counts():
    specs = checkpoint_tensors(FULL)
    assert len(specs) == 20_493
    assert sum(s.nbytes for s in specs) == 98_245_528_576
    assert sum(s.dtype == torch.float32 for s in specs) == 40
    shards = plan_shards(specs, 4 << 30)
    assert all(sum(s.nbytes for s in shard) <= 4 << 30 for shard in shards)
    assert [s for shard in shards for s in shard] == specs


def test_small_preset_is_a_few_hundred_megabytes():
    total = sum(s.nbytes for s in checkpoint_tensors(SMALL))
    assert 50e6 < total < 400e6


def test_in_memory_synthetic_weights_equal_the_written_ones(tiny_model):
    from engine.model import KimiLinearForCausalLM

    model = KimiLinearForCausalLM(TINY, dtype=torch.float32)
    init_synthetic_weights(model, seed=1234)  # the conftest checkpoint's seed
    for (name, a), (_, b) in zip(model.state_dict().items(), tiny_model.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


def test_refuses_to_overwrite(tmp_path):
    (tmp_path / "keep.txt").write_text("x")
    with pytest.raises(Exception, match="not empty"):
        write_synthetic_checkpoint(TINY, tmp_path, seed=0)


def test_cli_synth_and_export(tmp_path):
    runner = CliRunner()
    out = tmp_path / "tiny"
    done = runner.invoke(main, ["synth", "--config", "tiny", "--seed", "3", "--out", str(out)])
    assert done.exit_code == 0, done.output
    assert "synthetic weights" in done.output
    assert json.loads((out / "synthetic.json").read_text())["seed"] == 3
    gguf_path = tmp_path / "tiny.gguf"
    done = runner.invoke(main, ["export-gguf", str(out), "--out", str(gguf_path)])
    assert done.exit_code == 0, done.output
    assert gguf_path.stat().st_size > 0
    again = runner.invoke(main, ["synth", "--config", "tiny", "--out", str(out)])
    assert again.exit_code != 0 and "not empty" in again.output
    assert runner.invoke(main, ["synth", "--config", "tiny"]).exit_code == 2  # --out required


def test_cli_entry_point_full_dry_run():
    done = subprocess.run(
        [sys.executable, "-m", "engine", "synth", "--config", "full", "--dry-run"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr
    assert "tensors: 20493 (20453 bfloat16, 40 float32)" in done.stdout
    assert "bytes: 98,245,528,576" in done.stdout
    assert "parameters: 49,122,681,728" in done.stdout


def test_wide_preset_has_the_real_widths_in_four_layers():
    """Checked on shapes alone: `wide` is ~3.3 GB in BF16, too big to write in a unit test."""
    different = {"num_hidden_layers", "full_attn_layers", "num_experts"}
    special = {"bos_token_id", "eos_token_id", "pad_token_id"}  # the synthetic tokenizer's
    for field in dataclasses.fields(FULL):
        if field.name not in different | special:
            assert getattr(WIDE, field.name) == getattr(FULL, field.name), field.name
    assert (WIDE.num_hidden_layers, WIDE.full_attn_layers, WIDE.first_k_dense_replace) == (4, (3,), 1)
    assert (WIDE.num_experts, WIDE.num_experts_per_token, WIDE.num_shared_experts) == (32, 8, 1)
    shapes = {s.name: tuple(s.shape) for s in checkpoint_tensors(WIDE)}
    assert shapes["model.embed_tokens.weight"] == shapes["lm_head.weight"] == (163_840, 2304)
    assert shapes["model.layers.0.mlp.gate_proj.weight"] == (9216, 2304)
    assert shapes["model.layers.0.self_attn.q_proj.weight"] == (32 * 128, 2304)
    assert shapes["model.layers.3.self_attn.q_proj.weight"] == (32 * 192, 2304)
    assert shapes["model.layers.3.self_attn.kv_b_proj.weight"] == (32 * 256, 512)
    assert shapes["model.layers.1.block_sparse_moe.experts.31.w1.weight"] == (1024, 2304)
    assert "model.layers.1.block_sparse_moe.experts.32.w1.weight" not in shapes
    assert 3.2e9 < sum(s.nbytes for s in checkpoint_tensors(WIDE)) < 3.4e9


def test_wide_preset_quantises_and_exports_on_meta():
    """The INT4 model's structure and the GGUF tensor list for `wide`, nothing allocated."""
    model = quantized_meta_model(WIDE, make_plan("default"), dtype=torch.bfloat16)
    bank = model.model.layers[1].block_sparse_moe.experts
    assert bank.slots == 33 and bank.w1_codes.shape == (33, 1024, 1152)
    names = [entry.name for entry in gguf_export._entries(WIDE)]
    assert "blk.1.ffn_gate_exps.weight" in names and "blk.3.attn_k_b.weight" in names
