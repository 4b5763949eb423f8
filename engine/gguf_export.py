"""Export a checkpoint to a GGUF file that llama.cpp runs as architecture `kimi-linear`.

Used as an independent oracle (llama.cpp on the same weights) and for same-weights llama.cpp speed runs.
Tensor names come from the `gguf` package's own tables; the conversions follow llama.cpp's loader:
`A_log` is stored as `ssm_a = -exp(A_log)`, `dt_bias` as `ssm_dt.bias`, `kv_b_proj` is split into
`attn_k_b` (per head, transposed) and `attn_v_b` so llama.cpp caches only the MLA latent, and each layer's
experts are stacked into one tensor per projection. The file is written tensor by tensor (only one
output tensor is in memory at a time).

The vocabulary is written the way llama.cpp's convert_hf_to_gguf.py writes Moonshot's tiktoken file: a
GPT-2-style BPE (tokens in GPT-2's byte-to-unicode spelling, the merge of each rank recovered from the
ranks, as tiktoken would apply them) with the `kimi-k2` pre-tokenizer, which llama.cpp implements as
Moonshot's pattern; tests/engine/test_oracle_llamacpp.py checks that llama.cpp then tokenises text to the
same ids as the engine. Supported for the project's own checkpoints (synthetic and trained, whose
tiktoken file is small); for real weights use llama.cpp's convert_hf_to_gguf.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import click
import gguf
import numpy as np
import torch

from engine.model.checkpoint_spec import expert_tensor_name, layer_prefix
from engine.model.config import KimiLinearConfig
from engine.model.loading import Checkpoint
from engine.model.tokenizer import Tokenizer
from engine.progress import progress_bar

MT = gguf.MODEL_TENSOR
_OUTPUT_DTYPES = {"f32": torch.float32, "f16": torch.float16}


class ExportError(ValueError):
    pass


@dataclass(frozen=True)
class _Entry:
    name: str  # GGUF tensor name
    sources: tuple[str, ...]  # checkpoint tensor names
    convert: Callable[..., torch.Tensor]  # sources -> tensor in GGUF (numpy) shape
    keep_f32: bool = False  # as llama.cpp's converter: norms, vectors, decay, convolutions, router stay F32


def _identity(t: torch.Tensor) -> torch.Tensor:
    return t


def _gguf_name(kind: gguf.MODEL_TENSOR, layer: int | None = None, suffix: str = "weight") -> str:
    base = gguf.TENSOR_NAMES[kind]
    return f"{base.format(bid=layer) if layer is not None else base}.{suffix}"


_SWIGLU_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


def _entries(cfg: KimiLinearConfig) -> list[_Entry]:
    entries = [_Entry(_gguf_name(MT.TOKEN_EMBD), ("model.embed_tokens.weight",), _identity)]
    for i in range(cfg.num_hidden_layers):
        p = layer_prefix(i)
        a = p + "self_attn."

        def one(kind, source, convert=_identity, keep_f32=False, suffix="weight", layer=i):
            return _Entry(_gguf_name(kind, layer, suffix), (source,), convert, keep_f32)

        def swiglu(kinds, prefix):  # a SwiGLU MLP's gate, up and down projections under `prefix`
            return [
                one(kind, f"{prefix}{proj}.weight")
                for kind, proj in zip(kinds, _SWIGLU_PROJECTIONS, strict=True)
            ]

        entries.append(one(MT.ATTN_NORM, p + "input_layernorm.weight", keep_f32=True))
        if cfg.is_mla_layer(i):
            n, nope = cfg.num_attention_heads, cfg.qk_nope_head_dim
            per_head = (n, nope + cfg.v_head_dim, cfg.kv_lora_rank)
            entries += [
                one(MT.ATTN_Q, a + "q_proj.weight"),
                one(MT.ATTN_KV_A_MQA, a + "kv_a_proj_with_mqa.weight"),
                one(MT.ATTN_KV_A_NORM, a + "kv_a_layernorm.weight", keep_f32=True),
                # F32 even in F16 files: llama.cpp's CPU backend cannot run its F16 absorbed-MLA matmuls.
                one(
                    MT.ATTN_K_B,
                    a + "kv_b_proj.weight",
                    lambda w, s=per_head, d=nope: w.view(s)[:, :d].mT,
                    True,
                ),
                one(
                    MT.ATTN_V_B, a + "kv_b_proj.weight", lambda w, s=per_head, d=nope: w.view(s)[:, d:], True
                ),
                one(MT.ATTN_OUT, a + "o_proj.weight"),
            ]
        else:
            entries += [
                one(MT.ATTN_Q, a + "q_proj.weight"),
                one(MT.ATTN_K, a + "k_proj.weight"),
                one(MT.ATTN_V, a + "v_proj.weight"),
                one(MT.SSM_CONV1D_Q, a + "q_conv1d.weight", keep_f32=True),
                one(MT.SSM_CONV1D_K, a + "k_conv1d.weight", keep_f32=True),
                one(MT.SSM_CONV1D_V, a + "v_conv1d.weight", keep_f32=True),
                one(MT.SSM_F_A, a + "f_a_proj.weight"),
                one(MT.SSM_F_B, a + "f_b_proj.weight"),
                one(MT.SSM_BETA, a + "b_proj.weight"),
                _Entry(gguf.TENSOR_NAMES[MT.SSM_A].format(bid=i), (a + "A_log",), lambda t: -t.exp(), True),
                one(MT.SSM_DT, a + "dt_bias", keep_f32=True, suffix="bias"),
                one(MT.SSM_G_A, a + "g_a_proj.weight"),
                one(MT.SSM_G_B, a + "g_b_proj.weight"),
                one(MT.SSM_NORM, a + "o_norm.weight", keep_f32=True),
                one(MT.ATTN_OUT, a + "o_proj.weight"),
            ]
        entries.append(one(MT.FFN_NORM, p + "post_attention_layernorm.weight", keep_f32=True))
        if cfg.is_moe_layer(i):
            m = p + "block_sparse_moe."
            entries += [
                one(MT.FFN_GATE_INP, m + "gate.weight", keep_f32=True),
                one(MT.FFN_EXP_PROBS_B, m + "gate.e_score_correction_bias", keep_f32=True, suffix="bias"),
            ]
            for kind, proj in ((MT.FFN_GATE_EXP, "w1"), (MT.FFN_UP_EXP, "w3"), (MT.FFN_DOWN_EXP, "w2")):
                sources = tuple(expert_tensor_name(i, e, proj) for e in range(cfg.num_experts))
                entries.append(_Entry(_gguf_name(kind, i), sources, lambda *ws: torch.stack(ws)))
            if cfg.num_shared_experts:
                entries += swiglu(
                    (MT.FFN_GATE_SHEXP, MT.FFN_UP_SHEXP, MT.FFN_DOWN_SHEXP), m + "shared_experts."
                )
        else:
            entries += swiglu((MT.FFN_GATE, MT.FFN_UP, MT.FFN_DOWN), p + "mlp.")
    entries += [
        _Entry(_gguf_name(MT.OUTPUT_NORM), ("model.norm.weight",), _identity, True),
        _Entry(_gguf_name(MT.OUTPUT), ("lm_head.weight",), _identity),
    ]
    return entries


def _check_exportable(cfg: KimiLinearConfig, tokenizer: Tokenizer) -> None:
    if cfg.kda_num_heads != cfg.num_attention_heads:
        raise ExportError("llama.cpp's kimi-linear uses one head count for KDA and MLA; this config has two")
    if not cfg.moe_renormalize:
        raise ExportError("llama.cpp's kimi-linear always renormalises the routing weights")
    if tokenizer.bos_id > cfg.vocab_size:
        raise ExportError(
            f"the tokenizer's {tokenizer.bos_id} ranks do not fit the model's {cfg.vocab_size} ids; "
            "convert real checkpoints with llama.cpp's convert_hf_to_gguf.py"
        )


def _add_metadata(w: gguf.GGUFWriter, cfg: KimiLinearConfig, name: str, dtype: str) -> None:
    w.add_name(name)
    w.add_context_length(1_048_576)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    # One KV head marks an MLA layer (attention over the latent, MQA-style); zero marks a KDA layer.
    w.add_head_count_kv([1 if cfg.is_mla_layer(i) else 0 for i in range(cfg.num_hidden_layers)])
    w.add_key_length(cfg.kv_lora_rank + cfg.qk_rope_head_dim)
    w.add_value_length(cfg.kv_lora_rank)
    w.add_key_length_mla(cfg.qk_head_dim)
    w.add_value_length_mla(cfg.v_head_dim)
    w.add_kv_lora_rank(cfg.kv_lora_rank)
    w.add_rope_dimension_count(cfg.qk_rope_head_dim)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_ssm_conv_kernel(cfg.conv_kernel_size)
    w.add_kda_head_dim(cfg.kda_head_dim)
    w.add_vocab_size(cfg.vocab_size)
    w.add_expert_count(cfg.num_experts)
    w.add_expert_used_count(cfg.num_experts_per_token)
    w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    w.add_expert_shared_count(cfg.num_shared_experts)
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    w.add_expert_weights_scale(cfg.routed_scaling_factor)
    w.add_expert_weights_norm(True)
    w.add_leading_dense_block_count(cfg.first_k_dense_replace)
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if dtype == "f32" else gguf.LlamaFileType.MOSTLY_F16)


def _add_bpe_vocab(w: gguf.GGUFWriter, cfg: KimiLinearConfig, tokenizer: Tokenizer) -> None:
    """GPT-2-style BPE tokens and merges, the special tokens as control tokens, unused ids padded."""
    ranks = tokenizer.ranks
    spell = _gpt2_byte_spelling()
    tokens = [f"[PAD{i}]" for i in range(cfg.vocab_size)]
    types = [gguf.TokenType.UNUSED] * cfg.vocab_size
    for token, rank in ranks.items():
        tokens[rank], types[rank] = "".join(spell[b] for b in token), gguf.TokenType.NORMAL
    for text, i in tokenizer.special_tokens.items():
        if i < cfg.vocab_size:
            tokens[i], types[i] = text, gguf.TokenType.CONTROL
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) > 1:
            parts = _tiktoken_split(ranks, token, rank)
            if len(parts) == 2:  # otherwise tiktoken never produces this token either
                merges.append(" ".join("".join(spell[b] for b in part) for part in parts))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("kimi-k2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tokenizer.bos_id)
    w.add_eos_token_id(cfg.eos_token_id if cfg.eos_token_id is not None else tokenizer.eos_id)
    w.add_unk_token_id(tokenizer.token_id("[UNK]"))
    w.add_pad_token_id(tokenizer.token_id("[PAD]"))
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)


def _gpt2_byte_spelling() -> list[str]:
    """GPT-2's byte-to-unicode table: printable bytes stand for themselves, the rest map above 255."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), 256)]
    spelling, extra = {}, 0
    for b in range(256):
        if b in printable:
            spelling[b] = chr(b)
        else:
            spelling[b] = chr(256 + extra)
            extra += 1
    return [spelling[b] for b in range(256)]


def _tiktoken_split(ranks: dict[bytes, int], token: bytes, max_rank: int) -> list[bytes]:
    """The parts tiktoken reaches for `token` using only ranks below its own (convert_hf_to_gguf's `bpe`)."""
    parts = [bytes([b]) for b in token]
    while True:
        best = None
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is not None and rank < max_rank and (best is None or rank < best[1]):
                best = (i, rank)
        if best is None:
            return parts
        i = best[0]
        parts[i : i + 2] = [parts[i] + parts[i + 1]]


def export_gguf(
    checkpoint_dir: str | Path, out: str | Path, *, dtype: str = "f32", progress: bool = False
) -> Path:
    if dtype not in _OUTPUT_DTYPES:
        raise ExportError(f"dtype must be one of {', '.join(_OUTPUT_DTYPES)}")
    checkpoint = Checkpoint.open(checkpoint_dir)
    cfg = checkpoint.config
    tokenizer = Tokenizer.from_dir(checkpoint_dir)
    _check_exportable(cfg, tokenizer)
    entries = _entries(cfg)
    out_dtype = _OUTPUT_DTYPES[dtype]

    def target_dtype(entry: _Entry) -> torch.dtype:
        return torch.float32 if entry.keep_f32 else out_dtype

    writer = gguf.GGUFWriter(str(out), gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.KIMI_LINEAR])
    _add_metadata(writer, cfg, Path(checkpoint_dir).name, dtype)
    _add_bpe_vocab(writer, cfg, tokenizer)
    for entry in entries:  # shapes first, from meta tensors: nothing is read yet
        meta = [torch.empty(checkpoint.specs[s].shape, device="meta") for s in entry.sources]
        shape = tuple(entry.convert(*meta).shape)
        dt = target_dtype(entry)
        nbytes = int(np.prod(shape)) * dt.itemsize
        writer.add_tensor_info(entry.name, shape, np.dtype(str(dt).removeprefix("torch.")), nbytes)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    root = Path(checkpoint_dir)
    with progress_bar(entries, label=f"exporting {root.name}", show=progress) as bar:
        for entry in bar:
            sources = [checkpoint.read(s) for s in entry.sources]
            data = entry.convert(*(t.float() for t in sources)).to(target_dtype(entry)).contiguous()
            writer.write_tensor_data(data.numpy())
    writer.close()
    return Path(out)


@click.command("export-gguf")
@click.argument("checkpoint", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--out", type=click.Path(dir_okay=False, path_type=Path), required=True, help="GGUF file to write."
)
@click.option(
    "--dtype",
    type=click.Choice(sorted(_OUTPUT_DTYPES)),
    default="f32",
    show_default=True,
    help="Storage type of the matrices (norms, router, decay parameters and convolutions stay F32).",
)
def export_gguf_command(checkpoint: Path, out: Path, dtype: str) -> None:
    """Export CHECKPOINT (a synthetic or trained checkpoint directory) to a llama.cpp GGUF file (arch kimi-linear)."""
    try:
        export_gguf(checkpoint, out, dtype=dtype, progress=True)
    except ExportError as e:
        raise click.ClickException(str(e)) from e
    click.echo(f"wrote {out}")
