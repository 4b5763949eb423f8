"""RMS norms: computed in FP32, as the reference implementation does.

On a GPU a runtime may bind fused kernels (engine/kernels/fused.py) to each norm's ``kernel``; unbound
(the CPU, and every model as built) the eager code below runs, and it is those kernels' reference.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


def rms_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x * rsqrt(mean(x^2) + eps) over the last axis, in FP32."""
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF form: normalise in FP32, cast back to the input dtype, then multiply by the weight."""
    return weight * rms_normalize(x, eps).to(x.dtype)


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm(x) * weight * sigmoid(gate), all in FP32, cast to the gate's dtype."""
    y = rms_normalize(x, eps) * weight.float() * torch.sigmoid(gate.float())
    return y.to(gate.dtype)


class RMSNorm(nn.Module):
    """HF form: normalise in FP32, cast back to the input dtype, then multiply by the weight."""

    def __init__(self, dim: int, eps: float, *, dtype: torch.dtype | None = None, device=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim, dtype=dtype, device=device))
        # A fused ``rms_norm`` variant (signature in engine/kernels/triton_norm.py), or None: eager.
        self.kernel: Callable | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel is not None:
            return self.kernel(x, self.weight, self.eps)
        return rms_norm(x, self.weight, self.eps)

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + residual, this norm of it): one launch with a fused kernel bound."""
        if self.kernel is not None:
            total = torch.empty_like(x)
            return total, self.kernel(x, self.weight, self.eps, residual=residual, sum_out=total)
        total = x + residual
        return total, self(total)


class GatedRMSNorm(nn.Module):
    """KDA output norm: RMSNorm(o) * weight * sigmoid(gate), all in FP32, cast to the gate's dtype."""

    def __init__(self, dim: int, eps: float, *, dtype: torch.dtype | None = None, device=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim, dtype=dtype, device=device))

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return gated_rms_norm(x, gate, self.weight, self.eps)
