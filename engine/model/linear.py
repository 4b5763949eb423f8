"""The one seam every projection goes through.

Every matrix multiply by a checkpoint weight in the model is a `Linear` (routed experts go through
`engine.model.moe.expert_ffn` instead). To run a projection from another weight format (e.g. packed INT4),
replace the module with any `nn.Module` that implements the same two methods: `forward(x)` and
`dense_weight()`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Linear(nn.Module):
    """y = x @ W.T, no bias; W is [out_features, in_features] as in the checkpoint."""

    def __init__(self, in_features: int, out_features: int, *, dtype: torch.dtype | None = None, device=None):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)

    def dense_weight(self) -> torch.Tensor:
        """The weight as a dense [out, in] matrix, for code that needs the matrix itself (MLA absorption)."""
        return self.weight

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}"
