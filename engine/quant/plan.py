"""Quantisation plans: which checkpoint tensor is stored at which precision, decided by name.

Every tensor name is classified by the first matching rule; a name no rule knows makes the plan refuse
(a new tensor must get an explicit decision, never a silent default).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

import torch

from engine.codec import ROUNDINGS, SCALE_DTYPES

# Storage precisions: "int4" / "int8" (codec.py), "bf16" (cast to BF16), "keep" (as in the checkpoint).
PRECISIONS = ("int4", "int8", "bf16", "keep")
HEAD_PRECISIONS = ("bf16", "int8", "int4")

# (class, pattern); first match wins.
_RULES: list[tuple[str, re.Pattern]] = [
    (cls, re.compile(pattern))
    for cls, pattern in [
        ("routed_expert", r"^model\.layers\.\d+\.block_sparse_moe\.experts\.\d+\.w[123]\.weight$"),
        (
            "shared_expert",
            r"^model\.layers\.\d+\.block_sparse_moe\.shared_experts\.(gate|up|down)_proj\.weight$",
        ),
        ("dense_mlp", r"^model\.layers\.\d+\.mlp\.(gate|up|down)_proj\.weight$"),
        ("router", r"^model\.layers\.\d+\.block_sparse_moe\.gate\.weight$"),
        ("router_bias", r"^model\.layers\.\d+\.block_sparse_moe\.gate\.e_score_correction_bias$"),
        ("attention_projection", r"^model\.layers\.\d+\.self_attn\.(q|k|v|o|kv_b)_proj\.weight$"),
        ("mla_latent_projection", r"^model\.layers\.\d+\.self_attn\.kv_a_proj_with_mqa\.weight$"),
        (
            "kda_control",
            r"^model\.layers\.\d+\.self_attn\."
            r"((f_a|f_b|g_a|g_b|b)_proj\.weight|[qkv]_conv1d\.weight|A_log|dt_bias)$",
        ),
        (
            "norm",
            r"^model\.(norm|layers\.\d+\.(input_layernorm|post_attention_layernorm|self_attn\.(o_norm|kv_a_layernorm)))"
            r"\.weight$",
        ),
        ("embedding", r"^model\.embed_tokens\.weight$"),
        ("lm_head", r"^lm_head\.weight$"),
    ]
]

_WHY = {
    "routed_expert": "routed experts are 96% of the weights",
    "shared_expert": "large and read by every token",
    "dense_mlp": "large and read by every token",
    "attention_projection": "large token-path matrix",
    "router": "discrete routing decisions are sensitive",
    "router_bias": "tiny",
    "mla_latent_projection": "writes the cached latent; small",
    "kda_control": "recurrence controls (decay, beta, gates, convolutions); small",
    "norm": "tiny and sensitive",
    "embedding": "one row read per token; as INT4, each looked-up row is dequantised alone",
    "lm_head": "logits are sensitive; precision is a plan option",
}


class PlanError(ValueError):
    """The plan cannot decide or cannot apply its decision to a tensor."""


def classify(name: str) -> str:
    for cls, pattern in _RULES:
        if pattern.match(name):
            return cls
    raise PlanError(f"no quantisation rule for tensor {name!r}; add one to engine/quant/plan.py")


@dataclass(frozen=True)
class Decision:
    name: str
    tensor_class: str
    precision: str
    reason: str

    @property
    def quantized(self) -> bool:
        return self.precision in ("int4", "int8")


_BASE = {
    "routed_expert": "int4",
    "shared_expert": "int4",
    "dense_mlp": "int4",
    "attention_projection": "int4",
    "router": "keep",
    "router_bias": "keep",
    "mla_latent_projection": "keep",
    "kda_control": "keep",
    "norm": "keep",
    "embedding": "keep",
    "lm_head": "bf16",
}


@dataclass(frozen=True)
class Plan:
    name: str
    description: str
    precisions: dict[str, str] = field(default_factory=lambda: dict(_BASE))
    group_size: int = 32
    scale_dtype: str = "bf16"
    # How group scales are chosen (engine/codec.py); the stored layout is the same. "signed" (the extreme
    # / -8, as llama.cpp's Q4_0) uses all sixteen INT4 levels, a finer step than absmax / 7 at the same bits.
    rounding: str = "signed"

    def __post_init__(self) -> None:
        if set(self.precisions) != set(_BASE):
            raise PlanError(f"plan {self.name!r} must decide every class: {sorted(_BASE)}")
        bad = {c: p for c, p in self.precisions.items() if p not in PRECISIONS}
        if bad:
            raise PlanError(f"plan {self.name!r} has unknown precisions {bad}; expected {PRECISIONS}")
        if self.precisions["lm_head"] not in HEAD_PRECISIONS:
            raise PlanError(f"LM head precision must be one of {HEAD_PRECISIONS}")
        if self.group_size < 16 or self.group_size & (self.group_size - 1):
            # The kernels reduce one group per tile row, so it must be a power of two.
            raise PlanError(f"group size must be a power of two >= 16, got {self.group_size}")
        if self.scale_dtype not in SCALE_DTYPES:
            raise PlanError(f"scale dtype must be one of {sorted(SCALE_DTYPES)}, got {self.scale_dtype!r}")
        if self.rounding not in ROUNDINGS:
            raise PlanError(f"rounding must be one of {ROUNDINGS}, got {self.rounding!r}")

    @property
    def scale_torch_dtype(self) -> torch.dtype:
        return SCALE_DTYPES[self.scale_dtype]

    def decide(self, name: str, shape: tuple[int, ...]) -> Decision:
        cls = classify(name)
        precision = self.precisions[cls]
        if precision in ("int4", "int8"):
            if len(shape) != 2:
                raise PlanError(f"{name}: only 2-D weights can be quantised, got shape {shape}")
            if shape[1] % self.group_size:
                raise PlanError(
                    f"{name}: input dimension {shape[1]} is not a multiple of group size {self.group_size}"
                )
        return Decision(name, cls, precision, _WHY[cls])

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "description": self.description,
            "group_size": self.group_size,
            "scale_dtype": self.scale_dtype,
            "rounding": self.rounding,
            "precisions": dict(self.precisions),
        }

    @classmethod
    def from_json(cls, data: dict) -> Plan:
        return cls(
            name=data["name"],
            description=data["description"],
            precisions=dict(data["precisions"]),
            group_size=int(data["group_size"]),
            scale_dtype=data["scale_dtype"],
            rounding=data.get("rounding", "absmax"),  # artifacts written before the option: absmax
        )


PLANS: dict[str, Plan] = {
    plan.name: plan
    for plan in [
        Plan(
            "default", "INT4 experts (routed + shared), layer-0 MLP and attention projections; BF16 LM head"
        ),
        Plan("int8-head", "default with an INT8 LM head", {**_BASE, "lm_head": "int8"}),
        Plan("int4-head", "default with an INT4 LM head", {**_BASE, "lm_head": "int4"}),
        Plan(
            "int4-embed",
            "int4-head with the token embedding in INT4 too (group-wise; a lookup dequantises only its rows)",
            {**_BASE, "lm_head": "int4", "embedding": "int4"},
        ),
        Plan(
            "int4-embed-mse",
            "int4-embed with each group's scale chosen by a squared-error search (same layout and bits)",
            {**_BASE, "lm_head": "int4", "embedding": "int4"},
            rounding="mse",
        ),
        Plan(
            "int4-embed-int8-head",
            "int4-embed with an INT8 LM head (as llama.cpp's Q4_0 keeps its output matrix at 6 bits)",
            {**_BASE, "lm_head": "int8", "embedding": "int4"},
        ),
        Plan(
            "shared-bf16", "default with the shared experts kept in BF16", {**_BASE, "shared_expert": "keep"}
        ),
    ]
}


def make_plan(
    name: str,
    *,
    group_size: int | None = None,
    lm_head: str | None = None,
    scale_dtype: str | None = None,
    rounding: str | None = None,
) -> Plan:
    """A named plan, optionally with its group size, LM head precision, scale dtype or rounding overridden."""
    if name not in PLANS:
        raise PlanError(f"unknown plan {name!r}; available: {', '.join(PLANS)}")
    plan = PLANS[name]
    changes: dict = {}
    if group_size is not None:
        changes["group_size"] = group_size
    if scale_dtype is not None:
        changes["scale_dtype"] = scale_dtype
    if rounding is not None:
        changes["rounding"] = rounding
    if lm_head is not None:
        changes["precisions"] = {**plan.precisions, "lm_head": lm_head}
    return replace(plan, **changes) if changes else plan
