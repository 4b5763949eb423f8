"""RMS norms: computed in FP32, as the reference implementation does."""

from __future__ import annotations

import torch
from torch import nn


def rms_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x * rsqrt(mean(x^2) + eps) over the last axis, in FP32."""
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


class RMSNorm(nn.Module):
    """HF form: normalise in FP32, cast back to the input dtype, then multiply by the weight."""

    def __init__(self, dim: int, eps: float, *, dtype: torch.dtype | None = None, device=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim, dtype=dtype, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * rms_normalize(x, self.eps).to(x.dtype)


class GatedRMSNorm(nn.Module):
    """KDA output norm: RMSNorm(o) * weight * sigmoid(gate), all in FP32, cast to the gate's dtype."""

    def __init__(self, dim: int, eps: float, *, dtype: torch.dtype | None = None, device=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim, dtype=dtype, device=device))

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        y = rms_normalize(x, self.eps) * self.weight.float() * torch.sigmoid(gate.float())
        return y.to(gate.dtype)
