"""The one seam every projection goes through.

Every matrix multiply by a checkpoint weight in the model is a `Linear` (routed experts go through
`engine.model.moe.expert_ffn` instead). To run a projection from another weight format (e.g. packed INT4),
replace the module with any `nn.Module` that implements the same two methods: `forward(x)` and
`dense_weight()`.

A plain `Linear` may also have a decode GEMV bound (`bind_decode_gemv`): the rows of a decode step then go
through it instead of torch's matmul, reading the weight as it is (the runtime binds the registry's
`w16a16_gemv` where that beats torch's own; engine/runtime/builder.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from engine.model.paths import takes_decode_path

DecodeGemv = Callable[..., torch.Tensor]  # fn(x [B, K], weight [N, K]) -> [B, N] in x's dtype


def _project(x: torch.Tensor, weight: torch.Tensor, decode_gemv: DecodeGemv | None) -> torch.Tensor:
    """x @ weight^T: through `decode_gemv` for a decode step's few rows when one is bound, else torch."""
    if decode_gemv is None:  # the GPU path: nothing added before torch's matmul
        return F.linear(x, weight)
    rows = x.reshape(-1, x.shape[-1])
    if not takes_decode_path(rows.shape[0]):
        return F.linear(x, weight)
    return decode_gemv(rows, weight).view(*x.shape[:-1], weight.shape[0])


class Linear(nn.Module):
    """y = x @ W.T, no bias; W is [out_features, in_features] as in the checkpoint."""

    def __init__(self, in_features: int, out_features: int, *, dtype: torch.dtype | None = None, device=None):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype, device=device))
        self.decode_gemv: DecodeGemv | None = None
        self.decode_variant: str | None = None  # the bound GEMV's registry variant name, for receipts

    def bind_decode_gemv(self, variant: str | None, fn: DecodeGemv | None) -> None:
        """Run decode rows through `fn` (the registry's `variant`) from now on; None: torch's matmul."""
        self.decode_variant, self.decode_gemv = variant, fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _project(x, self.weight, self.decode_gemv)

    def dense_weight(self) -> torch.Tensor:
        """The weight as a dense [out, in] matrix, for code that needs the matrix itself (MLA absorption)."""
        return self.weight

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}"


class SharedInputLinears:
    """Plain `Linear`s that read the same input, run as one GEMM over their concatenated weights: at decode
    a GEMV call costs more than its arithmetic, so one call instead of several pays. Each Linear's weight
    is rebound to its rows of the one matrix (views: no second copy); the fused GEMM takes the decode GEMV
    bound to the first fused `Linear` at call time. Modules of another kind may be merged by their own
    type: one whose class has ``merge_shared_input(owner, names)`` (packed INT4 projections,
    engine/quant/packed.py) gets the names that are not plain `Linear`s and returns None or a group with
    ``names`` and ``__call__(x)`` -> their outputs, or None to run each on its own this call. The rest keep
    their own call. The weights must not change after."""

    def __init__(self, owner: nn.Module, names: tuple[str, ...]):
        self.names = names
        fusable = [n for n in names if type(getattr(owner, n)) is Linear]
        dtypes = {getattr(owner, n).weight.dtype for n in fusable}
        self.fused = tuple(fusable) if len(fusable) > 1 and len(dtypes) == 1 else ()
        self.sizes = [getattr(owner, n).out_features for n in self.fused]
        self.weight = None
        if self.fused:
            self.weight = torch.cat([getattr(owner, n).weight for n in self.fused])
            start = 0
            for name, size in zip(self.fused, self.sizes, strict=True):
                getattr(owner, name).weight = nn.Parameter(
                    self.weight[start : start + size], requires_grad=False
                )
                start += size
        rest = tuple(n for n in names if n not in self.fused)
        merge = getattr(type(getattr(owner, rest[0])), "merge_shared_input", None) if rest else None
        self.merged = merge(owner, rest) if merge is not None else None

    def __call__(self, owner: nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """name -> that projection of x, for every name given at construction."""
        out = {}
        if self.weight is not None:  # set exactly when there is a fused group
            gemv = getattr(owner, self.fused[0]).decode_gemv
            out = dict(zip(self.fused, _project(x, self.weight, gemv).split(self.sizes, -1), strict=True))
        if self.merged is not None and (merged := self.merged(x)) is not None:
            out.update(zip(self.merged.names, merged, strict=True))
        return {n: out[n] if n in out else getattr(owner, n)(x) for n in self.names}
