"""SwiGLU MLP: the dense feed-forward of layer 0 and the MoE shared expert."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.model.linear import Linear, SharedInputLinears


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int, *, dtype: torch.dtype | None = None, device=None):
        super().__init__()
        self.gate_proj = Linear(hidden, intermediate, dtype=dtype, device=device)
        self.up_proj = Linear(hidden, intermediate, dtype=dtype, device=device)
        self.down_proj = Linear(intermediate, hidden, dtype=dtype, device=device)
        self._gate_up: SharedInputLinears | None = None

    def fuse_input_projections(self) -> None:
        """Run gate_proj and up_proj as one GEMM (when both are plain `Linear`s; a runtime calls this at
        load). Weights must not change after."""
        self._gate_up = SharedInputLinears(self, ("gate_proj", "up_proj"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._gate_up is None:
            gate, up = self.gate_proj(x), self.up_proj(x)
        else:
            gate, up = self._gate_up(self, x).values()
        return self.down_proj(F.silu(gate) * up)
