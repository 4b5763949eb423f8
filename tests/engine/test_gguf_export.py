"""The GGUF exporter's file, read back with the gguf package (llama.cpp runs it in test_oracle_llamacpp)."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from engine.gguf_export import ExportError, export_gguf
from engine.model import Checkpoint


@pytest.fixture(scope="module")
def exported(tiny_dir, tmp_path_factory):
    path = export_gguf(tiny_dir, tmp_path_factory.mktemp("gguf") / "tiny.gguf")
    return gguf.GGUFReader(str(path))


def field(reader, key):
    f = reader.fields[key]
    values = [f.parts[i] for i in f.data]
    if f.types[0] == gguf.GGUFValueType.STRING:
        return bytes(values[0]).decode()
    flat = [v.tolist()[0] if len(v) == 1 else v.tolist() for v in values]
    return flat if f.types[0] == gguf.GGUFValueType.ARRAY else flat[0]


def test_metadata(exported, tiny_model):
    cfg = tiny_model.config
    arch = "kimi-linear"
    assert field(exported, "general.architecture") == arch
    assert field(exported, f"{arch}.attention.head_count_kv") == [0, 0, 0, 1]
    assert field(exported, f"{arch}.attention.key_length") == cfg.kv_lora_rank + cfg.qk_rope_head_dim
    assert field(exported, f"{arch}.attention.key_length_mla") == cfg.qk_head_dim
    assert field(exported, f"{arch}.kda.head_dim") == cfg.kda_head_dim
    assert field(exported, f"{arch}.expert_gating_func") == 2  # sigmoid
    assert field(exported, f"{arch}.expert_used_count") == cfg.num_experts_per_token
    assert abs(field(exported, f"{arch}.expert_weights_scale") - cfg.routed_scaling_factor) < 1e-6
    assert field(exported, "tokenizer.ggml.eos_token_id") == cfg.eos_token_id


def test_tensors_are_converted_as_llamacpp_expects(exported, tiny_dir):
    ckpt = dict(Checkpoint.open(tiny_dir).tensors())
    tensors = {t.name: t for t in exported.tensors}
    cfg = Checkpoint.open(tiny_dir).config

    def data(name):
        t = tensors[name]
        return torch.from_numpy(np.array(t.data)).reshape([int(d) for d in reversed(t.shape)])

    assert all(t.tensor_type == gguf.GGMLQuantizationType.F32 for t in exported.tensors)
    a_log = ckpt["model.layers.1.self_attn.A_log"]
    torch.testing.assert_close(data("blk.1.ssm_a"), -a_log.exp())
    torch.testing.assert_close(data("blk.1.ssm_dt.bias"), ckpt["model.layers.1.self_attn.dt_bias"])
    w1 = torch.stack(
        [ckpt[f"model.layers.2.block_sparse_moe.experts.{e}.w1.weight"] for e in range(cfg.num_experts)]
    )
    torch.testing.assert_close(data("blk.2.ffn_gate_exps.weight"), w1.float())
    kv_b = ckpt["model.layers.3.self_attn.kv_b_proj.weight"].float()
    per_head = kv_b.view(cfg.num_attention_heads, cfg.qk_nope_head_dim + cfg.v_head_dim, cfg.kv_lora_rank)
    torch.testing.assert_close(
        data("blk.3.attn_k_b.weight"), per_head[:, : cfg.qk_nope_head_dim].transpose(1, 2)
    )
    torch.testing.assert_close(data("blk.3.attn_v_b.weight"), per_head[:, cfg.qk_nope_head_dim :])
    n_expected = 3 + 4 * 2 + 3 * 15 + 6 + 3 + 3 * (2 + 3 + 3)
    assert len(tensors) == n_expected


def test_a_tokenizer_larger_than_the_model_is_refused(tiny_dir, tmp_path):
    """A tokenizer whose ranks outgrow the model's ids (as a real checkpoint's would a tiny config) is
    refused with the pointer to llama.cpp's own converter."""
    import shutil

    from engine.model.presets import SMALL
    from engine.model.synthetic_tokenizer import write_synthetic_tokenizer

    ckpt = shutil.copytree(tiny_dir, tmp_path / "ckpt")
    write_synthetic_tokenizer(ckpt, SMALL.bos_token_id)
    with pytest.raises(ExportError, match="convert_hf_to_gguf"):
        export_gguf(ckpt, tmp_path / "x.gguf")
