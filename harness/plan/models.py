"""What `kimi-harness plan` knows about each model: sizes, bytes per decoded token, state and cache.

Kimi-Linear-48B-A3B is counted tensor by tensor by the engine's own weight budget
(`engine.quant.budget`, the same count the decode runner's roofline uses), one entry per quantisation
plan. Kimi K3 has no engine here, so its facts are the published architecture (docs/REFERENCE.md §5), and
its bytes follow from them: routed experts at their stored precision, every other weight at its own.
The K3 sources: huggingface.co/moonshotai/Kimi-K3 (model card: 2.8T parameters, 104B active; config.json:
hidden 7168, 93 layers of which 69 KDA with 96 heads of 128 and 24 MLA with kv_lora_rank 512 and
qk_rope_head_dim 64, 896 routed experts of 3 x 3584 x 3072, 16 per token, layer 0 dense, as the public
implementations quote it), and NVIDIA's TensorRT-LLM K3 deployment guide (routed experts MXFP4 with
group 32, attention, shared experts, dense MLP and LM head BF16).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

GB = 10**9  # vendors' and publishers' gigabyte; plan reports sizes in these


@dataclass(frozen=True)
class WeightFormat:
    """One way of storing a model's weights, and what a batch-1 decode step reads of it."""

    name: str
    total_bytes: int  # every weight, as stored
    expert_bytes: int  # of which routed experts (what `--cpu-moe` layouts keep in host RAM)
    token_bytes: int  # weight bytes read per decoded token at batch 1
    token_expert_bytes: int  # of which routed experts
    compute: str  # the tensor-core precision its matrix products run at: "bf16" or "fp4"
    how: str  # where these numbers come from


@dataclass(frozen=True)
class ModelFacts:
    name: str
    title: str
    total_params: int
    active_params: int  # per token: what prefill multiplies by (2 FLOPs each)
    layers: int
    hidden_size: int  # activations crossing a device or node boundary are this wide (BF16)
    state_bytes: int  # KDA recurrent state + short-conv windows of one sequence, fixed size
    cache_bytes_per_token: int  # MLA latent cache, all MLA layers
    formats: dict[str, WeightFormat]
    default_format: str
    sources: str
    routed_share: float  # experts each token picks, as a fraction of each MoE layer's experts (k / E)
    # (context) -> activation bytes, when the model has an estimate
    workspace: Callable[[int], int] | None = None

    def fmt(self, name: str | None) -> WeightFormat:
        name = name or self.default_format
        if name not in self.formats:
            raise ValueError(f"{self.name} has no --quant {name!r}; choose one of: {', '.join(self.formats)}")
        return self.formats[name]

    def workspace_bytes(self, context: int) -> int:
        return self.workspace(context) if self.workspace else 0


def kda_state_bytes(layers: int, heads: int, head_dim: int, kernel: int) -> int:
    """One sequence's KDA state: FP32 recurrent state per head, BF16 windows of three short convolutions."""
    return layers * (heads * head_dim**2 * 4 + 3 * heads * head_dim * kernel * 2)


# Kimi-Linear: the engine's plans, plus BF16 (the checkpoint as published).
_KIMI_LINEAR_PLANS = {
    "int4": "default",
    "int4-int8-head": "int8-head",
    "int4-int4-head": "int4-head",
    "bf16": None,
}


@lru_cache(maxsize=1)
def kimi_linear() -> ModelFacts:
    import torch

    from engine.model.checkpoint_spec import checkpoint_tensors
    from engine.model.presets import FULL
    from engine.quant.budget import decode_bytes_per_token, stored_nbytes
    from engine.quant.plan import Plan, make_plan
    from engine.runtime.engine import DEFAULT_PREFILL_CHUNK
    from engine.runtime.memory import decode_workspace_bytes, prefill_workspace_bytes

    cfg = FULL
    specs = checkpoint_tensors(cfg)
    formats = {}
    for name, plan_name in _KIMI_LINEAR_PLANS.items():
        if plan_name is None:
            keep = dict.fromkeys(make_plan("default").precisions, "keep") | {"lm_head": "bf16"}
            plan = Plan("bf16", "the BF16 checkpoint", keep)
        else:
            plan = make_plan(plan_name)
        stored = {s.name: stored_nbytes(s, plan.decide(s.name, s.shape).precision, plan) for s in specs}
        experts = sum(v for k, v in stored.items() if ".experts." in k)
        per_token = decode_bytes_per_token(cfg, plan)
        formats[name] = WeightFormat(
            name=name,
            total_bytes=sum(stored.values()),
            expert_bytes=experts,
            token_bytes=per_token.weights,
            token_expert_bytes=per_token.components["routed_expert"],
            compute="bf16",  # W4A16: INT4 weights, BF16 products
            how=f"engine.quant.budget over the checkpoint's tensors, plan {plan.name!r}",
        )
    state = decode_bytes_per_token(cfg, make_plan("default"))
    active = sum(
        s.numel * cfg.num_experts_per_token // cfg.num_experts
        if ".experts." in s.name
        else s.numel // cfg.vocab_size
        if "embed_tokens" in s.name
        else s.numel
        for s in specs
    )

    def workspace(context: int) -> int:
        chunk = min(DEFAULT_PREFILL_CHUNK, max(context, 1))
        return decode_workspace_bytes(cfg, torch.bfloat16, context) + prefill_workspace_bytes(
            cfg, torch.bfloat16, chunk, context, scores_materialized=False
        )

    return ModelFacts(
        name="kimi-linear-48b",
        title="Kimi-Linear-48B-A3B",
        total_params=sum(s.numel for s in specs),
        active_params=active,
        layers=cfg.num_hidden_layers,
        hidden_size=cfg.hidden_size,
        # budget counts state traffic read + written; one sequence holds half of it
        state_bytes=(state.components["state:kda_recurrent"] + state.components["state:kda_conv"]) // 2,
        cache_bytes_per_token=state.components["state:mla_cache"],  # context 0: one latent per MLA layer
        formats=formats,
        default_format="int4",
        routed_share=cfg.num_experts_per_token / cfg.num_experts,
        sources="docs/REFERENCE.md §1 (config.json of moonshotai/Kimi-Linear-48B-A3B-Instruct)",
        workspace=workspace,
    )


# Kimi K3, as published (sources in the module docstring): 93 layers (69 KDA, 24 MLA), hidden 7168, 896 routed experts
# of which 16 per token in the 92 MoE layers (layer 0 is dense), each expert 3 matrices of 3584 x 3072.
K3_TOTAL_PARAMS = 2_780_000_000_000
K3_ACTIVE_PARAMS = 104_000_000_000
K3_MOE_LAYERS, K3_EXPERTS, K3_EXPERTS_PER_TOKEN = 92, 896, 16
K3_EXPERT_PARAMS = 3 * 3584 * 3072
K3_KDA = dict(layers=69, heads=96, head_dim=128, kernel=4)
K3_MLA_LAYERS, K3_MLA_LATENT = 24, 512 + 64  # kv_lora_rank + qk_rope_head_dim, BF16
K3_UD_IQ1_S_BYTES = 594 * GB  # Unsloth's dynamic 1-bit quant, as published


def _k3_format(name: str, expert_bits: float, other_bits: float, compute: str, how: str) -> WeightFormat:
    experts = K3_MOE_LAYERS * K3_EXPERTS * K3_EXPERT_PARAMS
    active_experts = K3_MOE_LAYERS * K3_EXPERTS_PER_TOKEN * K3_EXPERT_PARAMS
    expert_bytes = round(experts * expert_bits / 8)
    token_expert = round(active_experts * expert_bits / 8)
    return WeightFormat(
        name=name,
        total_bytes=expert_bytes + round((K3_TOTAL_PARAMS - experts) * other_bits / 8),
        expert_bytes=expert_bytes,
        token_bytes=token_expert + round((K3_ACTIVE_PARAMS - active_experts) * other_bits / 8),
        token_expert_bytes=token_expert,
        compute=compute,
        how=how,
    )


@lru_cache(maxsize=1)
def kimi_k3() -> ModelFacts:
    ud_bits = K3_UD_IQ1_S_BYTES * 8 / K3_TOTAL_PARAMS
    formats = {
        # OCP MX: 32 FP4 (E2M1) values share one 8-bit scale, 4.25 bits each; the rest stays BF16.
        "mxfp4": _k3_format(
            "mxfp4", 4.25, 16, "fp4", "routed experts MXFP4 (4.25 bits), every other weight BF16"
        ),
        # The file's average over every weight. Dynamic quants keep the always-read weights wider, so the
        # real bytes per token are higher and the ceiling from this count is an upper bound.
        "ud-iq1_s": _k3_format(
            "ud-iq1_s", ud_bits, ud_bits, "bf16", f"594 GB file, its average {ud_bits:.3f} bits per weight"
        ),
    }
    return ModelFacts(
        name="kimi-k3",
        title="Kimi K3",
        total_params=K3_TOTAL_PARAMS,
        active_params=K3_ACTIVE_PARAMS,
        layers=93,
        hidden_size=7168,
        state_bytes=kda_state_bytes(**K3_KDA),
        cache_bytes_per_token=K3_MLA_LAYERS * K3_MLA_LATENT * 2,
        formats=formats,
        default_format="mxfp4",
        routed_share=K3_EXPERTS_PER_TOKEN / K3_EXPERTS,
        sources="huggingface.co/moonshotai/Kimi-K3 (model card, config.json); "
        "https://nvidia.github.io/TensorRT-LLM/deployment-guide/deployment-guide-for-kimi-k3-on-trtllm.html",
    )


MODELS = {"kimi-linear-48b": kimi_linear, "kimi-k3": kimi_k3}
# Every --quant name plan knows, for the CLI's choice (each model takes its own: ModelFacts.weight_format).
K3_FORMATS = ("mxfp4", "ud-iq1_s")
QUANT_NAMES = (*_KIMI_LINEAR_PLANS, *K3_FORMATS)


def model(name: str) -> ModelFacts:
    if name not in MODELS:
        raise ValueError(f"unknown --model {name!r}; choose one of: {', '.join(MODELS)}")
    return MODELS[name]()
