"""Shape tables: every decode GEMV of a Kimi-Linear config at full size, and small odd edge shapes.

Full shapes come from the model configuration (engine/model/config.py), so they follow the checkpoint
rather than constants; edge shapes are deliberately not multiples of any block size.
"""

from __future__ import annotations

from engine.model.config import KimiLinearConfig


def kimi_shapes(
    cfg: KimiLinearConfig, *, group: int = 32, batches: tuple[int, ...] = (1,)
) -> dict[str, list[dict]]:
    """Named full-size shapes per operation for batch sizes ``batches``.

    Grouped ops read a bank of routed + shared experts through ``top-k + shared`` slots per token.
    """
    h = cfg.hidden_size
    kda = cfg.kda_dim
    mla_q = cfg.num_attention_heads * cfg.qk_head_dim
    mla_kv = cfg.num_attention_heads * (cfg.qk_nope_head_dim + cfg.v_head_dim)
    mla_o = cfg.num_attention_heads * cfg.v_head_dim
    dense = {
        "kda_qkv": (kda, h),
        "kda_o": (h, kda),
        "mla_q": (mla_q, h),
        "mla_kv_b": (mla_kv, cfg.kv_lora_rank),
        "mla_o": (h, mla_o),
        "mlp_gate_up": (cfg.intermediate_size, h),
        "mlp_down": (h, cfg.intermediate_size),
        "lm_head": (cfg.vocab_size, h),
    }
    shared_in_bank = 1 if cfg.num_shared_experts == 1 else 0
    experts = cfg.num_experts + shared_in_bank
    slots = cfg.num_experts_per_token + shared_in_bank
    m = cfg.moe_intermediate_size
    tables: dict[str, list[dict]] = {op: [] for op in _OPS}
    for b in batches:
        for name, (n, k) in dense.items():
            out = "fp32" if name == "lm_head" else "bf16"
            tables["w4a16_gemv"].append(
                {"name": f"{name}_B{b}", "B": b, "N": n, "K": k, "group": group, "out": out}
            )
        head = {"name": f"lm_head_B{b}", "B": b, "N": cfg.vocab_size, "K": h, "group": group, "out": "fp32"}
        tables["w8a16_gemv"].append(head)
        tables["w16a16_gemv"] += [
            {k: v for k, v in head.items() if k != "group"},
            # The fused router's logits: BF16 x against the FP32 router weight (engine/kernels/fused.py).
            {
                "name": f"router_logits_B{b}",
                "B": b,
                "N": cfg.num_experts,
                "K": h,
                "out": "fp32",
                "weight": "fp32",
            },
        ]
        bank = {"B": b, "S": slots, "E": experts, "group": group}
        tables["w4a16_grouped_gemv"] += [
            {"name": f"experts_gate_up_B{b}", **bank, "N": m, "K": h},
            {"name": f"experts_down_B{b}", **bank, "N": h, "K": m, "per_slot": True},
        ]
        tables["w4a16_grouped_swiglu"].append({"name": f"experts_swiglu_B{b}", **bank, "N": m, "K": h})
        dense_bank = {key: v for key, v in bank.items() if key != "group"}  # a dense model's experts
        tables["w16a16_grouped_swiglu"].append({"name": f"experts_swiglu_B{b}", **dense_bank, "N": m, "K": h})
        tables["w16a16_grouped_gemv"].append(
            {"name": f"experts_down_B{b}", **dense_bank, "N": h, "K": m, "per_slot": True}
        )
        tables["route_combine"].append({"name": f"experts_combine_B{b}", "B": b, "S": slots, "N": h})
        tables["rms_norm"] += [
            {"name": f"hidden_add_norm_B{b}", "B": b, "H": h, "residual": True},
            {"name": f"mla_latent_norm_B{b}", "B": b, "H": cfg.kv_lora_rank},
        ]
        tables["kda_decode_step"].append(
            {"name": f"kda_step_B{b}", "B": b, "H": cfg.kda_num_heads, "d": cfg.kda_head_dim,
             "taps": cfg.conv_kernel_size, "low_rank": cfg.kda_head_dim}
        )  # fmt: skip
        tables["route_topk"].append(
            {"name": f"router_B{b}", "B": b, "E": cfg.num_experts, "k": cfg.num_experts_per_token,
             "renormalize": cfg.moe_renormalize, "scaling": cfg.routed_scaling_factor,
             **({"shared": cfg.num_experts} if shared_in_bank else {})}
        )  # fmt: skip
    return tables


_OPS = (
    "w4a16_gemv",
    "w8a16_gemv",
    "w16a16_gemv",
    "w16a16_grouped_gemv",
    "w16a16_grouped_swiglu",
    "w4a16_grouped_gemv",
    "w4a16_grouped_swiglu",
    "route_combine",
    "rms_norm",
    "kda_decode_step",
    "route_topk",
)

# Small, odd shapes: N and K not multiples of the tiles, batches that are not powers of two, group 64/128.
EDGE_SHAPES: dict[str, list[dict]] = {
    "w4a16_gemv": [
        {"name": "edge_b1", "B": 1, "N": 50, "K": 96, "group": 32},
        {"name": "edge_b3_g64", "B": 3, "N": 33, "K": 320, "group": 64, "out": "fp32"},
        {"name": "edge_b8_g128", "B": 8, "N": 17, "K": 384, "group": 128},
        {"name": "edge_b5_splitk", "B": 5, "N": 20, "K": 1152, "group": 32},
    ],
    "w8a16_gemv": [
        {"name": "edge_b1", "B": 1, "N": 50, "K": 96, "group": 32, "out": "fp32"},
        {"name": "edge_b6_g64", "B": 6, "N": 19, "K": 704, "group": 64},
    ],
    "w16a16_gemv": [
        {"name": "edge_b1", "B": 1, "N": 50, "K": 96, "out": "fp32"},
        {"name": "edge_b2", "B": 2, "N": 23, "K": 136},
        {"name": "edge_b3_fp32_x", "B": 3, "N": 19, "K": 200, "act": "fp32"},
        {"name": "edge_b5_fp16_weight", "B": 5, "N": 17, "K": 168, "weight": "fp16"},
        {"name": "edge_b7", "B": 7, "N": 21, "K": 200},
        {"name": "edge_b2_fp32_weight", "B": 2, "N": 40, "K": 160, "out": "fp32", "weight": "fp32"},
        # A dense FP32 model's projection at a continuous batch's rows; K past whole vectors (a tail).
        {"name": "edge_b5_fp32_weight_tail", "B": 5, "N": 37, "K": 203, "out": "fp32", "weight": "fp32"},
    ],
    # Dense banks ("weight": bf16 unless named); routes that repeat an expert within and across rows.
    "w16a16_grouped_gemv": [
        {"name": "edge_per_slot_x", "B": 3, "S": 4, "E": 5, "N": 37, "K": 203, "per_slot": True},
        {
            "name": "edge_b5_fp32",
            "B": 5,
            "S": 3,
            "E": 4,
            "N": 21,
            "K": 96,
            "per_slot": True,
            "weight": "fp32",
            "act": "fp32",
            "out": "fp32",
        },
        {"name": "edge_b2_fp16_shared_x", "B": 2, "S": 3, "E": 6, "N": 19, "K": 136, "weight": "fp16"},
    ],
    "w16a16_grouped_swiglu": [
        {"name": "edge_b1", "B": 1, "S": 3, "E": 7, "N": 20, "K": 170},
        {"name": "edge_b6", "B": 6, "S": 4, "E": 5, "N": 33, "K": 96},
        {"name": "edge_b3_fp32", "B": 3, "S": 2, "E": 3, "N": 18, "K": 200, "weight": "fp32", "act": "fp32"},
    ],
    "w4a16_grouped_gemv": [
        {"name": "edge_shared_x", "B": 2, "S": 3, "E": 5, "N": 40, "K": 96, "group": 32},
        {"name": "edge_per_slot_x", "B": 3, "S": 2, "E": 4, "N": 24, "K": 640, "group": 64, "per_slot": True},
    ],
    "w4a16_grouped_swiglu": [
        {"name": "edge_b1", "B": 1, "S": 3, "E": 6, "N": 20, "K": 160, "group": 32},
        {"name": "edge_b2_g64", "B": 2, "S": 2, "E": 3, "N": 36, "K": 192, "group": 64},
    ],
    "route_combine": [
        {"name": "edge_b1", "B": 1, "S": 9, "N": 70},
        {"name": "edge_b3", "B": 3, "S": 5, "N": 300},
    ],
    # The fused decode ops ("act": the activation dtype, BF16 unless named).
    "rms_norm": [
        {"name": "edge_b1", "B": 1, "H": 300},
        {"name": "edge_b3_add", "B": 3, "H": 200, "residual": True},
        {"name": "edge_b2_add_fp32", "B": 2, "H": 96, "residual": True, "act": "fp32"},
    ],
    "kda_decode_step": [
        {"name": "edge_b1", "B": 1, "H": 2, "d": 32, "taps": 4},
        {"name": "edge_b3_fp32", "B": 3, "H": 3, "d": 16, "taps": 4, "act": "fp32"},
        {"name": "edge_b2_taps2", "B": 2, "H": 1, "d": 64, "taps": 2},
        {"name": "edge_b2_low_rank", "B": 2, "H": 2, "d": 32, "taps": 4, "low_rank": 16},
        {"name": "edge_b1_low_rank_fp32", "B": 1, "H": 4, "d": 16, "taps": 4, "low_rank": 32, "act": "fp32"},
    ],
    "route_topk": [
        {"name": "edge_b1", "B": 1, "E": 37, "k": 5, "renormalize": True, "scaling": 2.5},
        {
            "name": "edge_b3_shared",
            "B": 3,
            "E": 20,
            "k": 4,
            "renormalize": True,
            "scaling": 2.5,
            "shared": 20,
        },
        {"name": "edge_b4_raw", "B": 4, "E": 16, "k": 3, "renormalize": False, "scaling": 1.0},
    ],
}
