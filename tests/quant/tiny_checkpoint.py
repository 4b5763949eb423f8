"""A tiny Kimi-Linear checkpoint for the quantiser tests, written by the synthetic checkpoint writer."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from engine.model import preset
from engine.model.checkpoint_spec import checkpoint_tensors
from engine.synth import write_synthetic_checkpoint

# The tiny preset with 6 experts (banks of 7 slots with the shared expert) and MLA at layer 2. Every
# quantised input dimension is a multiple of 64, so group sizes 32 and 64 both apply.
TINY = dataclasses.replace(
    preset("tiny"), num_experts=6, intermediate_size=192, qk_rope_head_dim=32, full_attn_layers=(2,)
)


def write_checkpoint(directory: Path, shards: int = 3, seed: int = 0) -> Path:
    """Synthetic weights (BF16, F32 ``A_log``/``dt_bias``) in about ``shards`` files + index + config.json."""
    total = sum(spec.nbytes for spec in checkpoint_tensors(TINY))
    return write_synthetic_checkpoint(TINY, directory, seed=seed, max_shard_bytes=math.ceil(total / shards))
