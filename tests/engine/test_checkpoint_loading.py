"""Config parsing and checkpoint loading: aliases, layouts, and clear errors that name the bad tensor."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.model import Checkpoint, CheckpointError, ConfigError, KimiLinearConfig, load_model
from engine.model.presets import FULL, TINY


def real_config_json() -> dict:
    """Kimi-Linear-48B-A3B's config.json fields as the checkpoint spells them."""
    return {
        "model_type": "kimi_linear",
        "vocab_size": 163840,
        "hidden_size": 2304,
        "intermediate_size": 9216,
        "moe_intermediate_size": 1024,
        "num_hidden_layers": 27,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "head_dim": 72,
        "q_lora_rank": None,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "mla_use_nope": True,
        "num_experts": 256,
        "num_experts_per_token": 8,
        "num_shared_experts": 1,
        "moe_renormalize": True,
        "moe_router_activation_func": "sigmoid",
        "routed_scaling_factor": 2.446,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "use_grouped_topk": True,
        "num_expert_group": 1,
        "topk_group": 1,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "bos_token_id": 163584,
        "eos_token_id": 163586,
        "pad_token_id": 163839,
        "num_nextn_predict_layers": 0,
        "linear_attn_config": {
            "num_heads": 32,
            "head_dim": 128,
            "short_conv_kernel_size": 4,
            "full_attn_layers": [4, 8, 12, 16, 20, 24, 27],
            "kda_layers": [1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15, 17, 18, 19, 21, 22, 23, 25, 26],
        },
    }


def test_real_config_parses_to_the_full_preset():
    assert KimiLinearConfig.from_hf_dict(real_config_json()) == FULL
    assert FULL.full_attn_layers == (3, 7, 11, 15, 19, 23, 26)
    assert len(FULL.kda_layers) == 20


def test_transformers_aliases_are_accepted():
    raw = real_config_json()
    for ours, theirs in [
        ("num_experts", "num_local_experts"),
        ("num_experts_per_token", "num_experts_per_tok"),
        ("num_shared_experts", "n_shared_experts"),
        ("moe_renormalize", "norm_topk_prob"),
    ]:
        raw[theirs] = raw.pop(ours)
    assert KimiLinearConfig.from_hf_dict(raw) == FULL


def test_to_hf_dict_round_trips():
    assert KimiLinearConfig.from_hf_dict(TINY.to_hf_dict()) == TINY
    assert KimiLinearConfig.from_hf_dict(FULL.to_hf_dict()) == FULL


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"q_lora_rank": 1536}, "q_lora_rank"),
        ({"mla_use_nope": False}, "NoPE"),
        ({"moe_router_activation_func": "softmax"}, "sigmoid"),
        ({"num_expert_group": 8}, "grouped top-k"),
        ({"tie_word_embeddings": True}, "tied"),
        ({"model_type": "llama"}, "kimi_linear"),
        ({"linear_attn_config": {"full_attn_layers": [4], "kda_layers": [1, 2]}}, "partition"),
        ({"linear_attn_config": {}}, "full_attn_layers"),
    ],
)
def test_unsupported_configs_are_refused(change, message):
    raw = real_config_json()
    raw.update(change)
    with pytest.raises(ConfigError, match=message):
        KimiLinearConfig.from_hf_dict(raw)


def test_missing_field_is_named():
    raw = real_config_json()
    del raw["kv_lora_rank"]
    with pytest.raises(ConfigError, match="lacks kv_lora_rank"):
        KimiLinearConfig.from_hf_dict(raw)


@pytest.fixture
def broken_dir(tiny_dir, tmp_path):
    """A private copy of the tiny checkpoint to damage."""
    return shutil.copytree(tiny_dir, tmp_path / "ckpt")


def rewrite_shard_holding(directory, name, edit):
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    shard = directory / index["weight_map"][name]
    tensors = load_file(str(shard))
    edit(tensors)
    save_file(tensors, str(shard), metadata={"format": "pt"})


def test_missing_tensor_is_named(broken_dir):
    name = "model.layers.2.self_attn.dt_bias"
    rewrite_shard_holding(broken_dir, name, lambda t: t.pop(name))
    with pytest.raises(CheckpointError, match=rf"{name} is indexed to .* but is not in that file"):
        Checkpoint.open(broken_dir)
    index_path = broken_dir / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    del index["weight_map"][name]
    index_path.write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=rf"1 tensor\(s\) missing, e.g. {name}"):
        Checkpoint.open(broken_dir)


def test_misshaped_tensor_is_named(broken_dir):
    name = "model.layers.1.block_sparse_moe.experts.3.w2.weight"

    def shrink(tensors):
        tensors[name] = tensors[name][:, :-1].contiguous()

    rewrite_shard_holding(broken_dir, name, shrink)
    with pytest.raises(CheckpointError, match=rf"{name} in .* has shape \[128, 63\], expected \[128, 64\]"):
        load_model(broken_dir)


def test_unexpected_tensor_is_named(broken_dir):
    name = "model.layers.0.self_attn.q_proj.bias"
    index_path = broken_dir / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"][name] = index["weight_map"]["model.layers.0.self_attn.q_proj.weight"]
    index_path.write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=rf"unexpected tensor\(s\) .* {name}"):
        Checkpoint.open(broken_dir)


def test_missing_shard_and_missing_index(broken_dir):
    shard = sorted(broken_dir.glob("model-*.safetensors"))[0]
    shard.unlink()
    with pytest.raises(CheckpointError, match=f"shard .*{shard.name} listed in the index does not exist"):
        Checkpoint.open(broken_dir)
    (broken_dir / "model.safetensors.index.json").unlink()
    with pytest.raises(CheckpointError, match="neither"):
        Checkpoint.open(broken_dir)


def test_single_file_checkpoint_loads_the_same_weights(tiny_dir, tiny_model, tmp_path):
    single = tmp_path / "single"
    single.mkdir()
    tensors = {}
    for shard in tiny_dir.glob("model-*.safetensors"):
        tensors.update(load_file(str(shard)))
    save_file(tensors, str(single / "model.safetensors"), metadata={"format": "pt"})
    shutil.copy(tiny_dir / "config.json", single / "config.json")
    model = load_model(single, dtype=torch.float32)
    for (name, a), (_, b) in zip(model.state_dict().items(), tiny_model.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


def test_loaded_values_are_the_checkpoint_values(tiny_dir, tiny_model):
    checkpoint = Checkpoint.open(tiny_dir)
    assert checkpoint.synthetic is not None and checkpoint.synthetic["synthetic"] is True
    tensors = dict(checkpoint.tensors())
    assert len(tensors) == len(checkpoint.specs)
    experts = tiny_model.model.layers[2].block_sparse_moe.experts
    assert torch.equal(experts.w3[5], tensors["model.layers.2.block_sparse_moe.experts.5.w3.weight"].float())
    assert torch.equal(
        tiny_model.model.layers[1].self_attn.A_log, tensors["model.layers.1.self_attn.A_log"]
    )  # FP32 stays exact


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda data: data[: len(data) - 100], id="truncated"),
        pytest.param(lambda data: b"", id="empty"),
        pytest.param(lambda data: b"\x10\x00\x00\x00\x00\x00\x00\x00not a json header", id="bad-header"),
    ],
)
def test_a_shard_that_is_not_safetensors_is_one_clear_error_naming_it(broken_dir, damage):
    shard = sorted(broken_dir.glob("model-*.safetensors"))[0]
    shard.write_bytes(damage(shard.read_bytes()))
    with pytest.raises(CheckpointError) as refused:
        Checkpoint.open(broken_dir)
    message = str(refused.value)
    assert str(shard) in message and "not a readable safetensors file" in message and "\n" not in message


def test_a_tensor_of_the_wrong_dtype_is_named(broken_dir):
    name = "model.layers.0.self_attn.q_proj.weight"

    def to_int(tensors):
        tensors[name] = tensors[name].to(torch.int8)

    rewrite_shard_holding(broken_dir, name, to_int)
    with pytest.raises(CheckpointError, match=rf"{name} in .* has dtype I8, expected a float type"):
        Checkpoint.open(broken_dir)


def test_serve_reports_a_broken_shard_in_one_line(broken_dir):
    from click.testing import CliRunner

    from engine.cli import main

    shard = sorted(broken_dir.glob("model-*.safetensors"))[0]
    shard.write_bytes(shard.read_bytes()[:-100])
    result = CliRunner().invoke(main, ["serve", "--weights", str(broken_dir), "--device", "cpu"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.startswith("Error: ") and shard.name in result.output
    assert result.output.count("\n") == 1
