"""SwiGLU MLP: the dense feed-forward of layer 0 and the MoE shared expert."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.model.linear import Linear


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, *, dtype: torch.dtype | None = None, device=None):
        super().__init__()
        self.gate_proj = Linear(hidden, intermediate, dtype=dtype, device=device)
        self.up_proj = Linear(hidden, intermediate, dtype=dtype, device=device)
        self.down_proj = Linear(intermediate, hidden, dtype=dtype, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
