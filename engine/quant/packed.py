"""Model modules that hold weights as stored by a plan and run them through the kernel registry.

`PackedLinear` replaces an `engine.model.linear.Linear` (INT4 / INT8 codes + scales, or a dense matrix at the
plan's precision, e.g. the BF16 LM head); `PackedExpertBank` replaces a layer's `ExpertBank` (INT4 banks
whose last slot may be the shared expert); `PackedEmbedding` replaces the token embedding (INT4 / INT8 rows,
each looked-up row dequantised on its own: no kernel, no dense copy). Both take the registry's selections at construction (or
`bind`) and call the bound functions directly, so a decode step does no registry lookups.

A variant that reads its own weight layout (``Variant.pack``, e.g. torch's CPU int4pack) gets its packed
copy of the weights at `bind`; the artifact's codes stay too (other variants, `dense_weight`).

Decode (at most `DECODE_MAX_ROWS` rows, `engine.model.paths`) runs the kernels: static shapes, no host
reads, CUDA-graph capturable. Prefill (more rows) runs them too when the variant is a GEMM
(``Variant.many_rows``: one call per projection, and per expert over the tokens routed to it; or, when
the expert ops sort the routes by expert themselves, ``Variant.groups_routes``, one call for all of them,
as at decode); otherwise it
dequantises: each projection's
weight to the activation dtype once per call followed by a matmul, and for experts one expert at a time
over the tokens routed to it (a GEMV kernel re-reads its weight for every row, so it does not fit many).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.codec import LinearWeight, dequantize
from engine.kernels.linear import GEMV_FOR_FORMAT
from engine.kernels.registry import Selection, Variant
from engine.model.moe import grouped_expert_ffn, grouped_expert_rows
from engine.model.paths import takes_decode_path

GROUPED_OPS = ("w4a16_grouped_swiglu", "w4a16_grouped_gemv", "route_combine")


def _packed_for(v: Variant, codes: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The (codes, scales) pair in the layout ``v`` reads."""
    return (codes, scales) if v.pack is None else v.pack(codes, scales)


class PackedLinear(nn.Module):
    """``y = x @ W^T`` with ``W`` in its stored format, through the registry's GEMV for that format."""

    data: torch.Tensor  # buffers
    scales: torch.Tensor | None
    _weight_args: tuple[torch.Tensor | int | None, ...]

    def __init__(self, weight: LinearWeight, selections: dict[str, Selection], *, dtype: torch.dtype):
        super().__init__()
        if weight.data.ndim != 2:
            raise ValueError(f"a packed linear needs a [N, K] weight, got {tuple(weight.shape)}")
        self.format, self.group_size = weight.format, weight.group_size
        self.out_features, self.in_features = weight.out_features, weight.in_features
        self.dtype = dtype  # the model's activation dtype, for dense_weight()
        self.register_buffer("data", weight.data)
        self.register_buffer("scales", weight.scales)
        self.bind(selections)

    def bind(self, selections: dict[str, Selection]) -> None:
        """Use the variants in ``selections`` (from `engine.kernels.resolve`) from now on."""
        op = GEMV_FOR_FORMAT[self.format]
        self.kernels = {op: selections[op]}
        chosen = self.variant = selections[op].variant
        self._gemv, self._many_rows = chosen.fn, chosen.many_rows
        if self.scales is None:
            self._weight_args = (self.data,)
        else:
            self._weight_args = (*_packed_for(chosen, self.data, self.scales), self.group_size)

    @classmethod
    def merge_shared_input(cls, owner: nn.Module, names: tuple[str, ...]) -> PackedInputGroup | None:
        """The quantised projections among ``names`` of ``owner`` that read the same input and share a
        format and group size, as one `PackedInputGroup` (`engine.model.linear.SharedInputLinears`)."""
        groups: dict[tuple, list[str]] = {}
        for name in names:
            module = getattr(owner, name)
            if type(module) is cls and module.scales is not None:
                key = (
                    module.format,
                    module.group_size,
                    module.in_features,
                    module.data.dtype,
                    module.scales.dtype,
                )
                groups.setdefault(key, []).append(name)
        largest = max(groups.values(), key=len, default=[])
        return PackedInputGroup(owner, tuple(largest)) if len(largest) > 1 else None

    @property
    def weight(self) -> LinearWeight:
        return LinearWeight(self.format, self.data, self.scales, self.group_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if not takes_decode_path(rows.shape[0]) and not self._many_rows:
            y = F.linear(rows, self.dense_weight(x.dtype))
        else:
            y = self._gemv(rows, *self._weight_args)
        return y.view(*x.shape[:-1], self.out_features)

    def dense_weight(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The weight dequantised to ``dtype`` (default: the model's), exact in FP32."""
        return dequantize(self.weight, dtype or self.dtype)

    def extra_repr(self) -> str:
        group = f", group_size={self.group_size}" if self.group_size else ""
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, format={self.format}{group}"
        )


class PackedInputGroup:
    """Quantised projections of one format and group size that read the same input (KDA's q/k/v), stored
    as one matrix of concatenated output rows: each module's buffers are rebound to views of its rows (no
    second copy). At decode, while all are bound to the same Triton GEMV, one launch computes them all (a
    launch costs more than these rows' arithmetic) and the output is split by views; otherwise each module
    runs its own call as before (the CPU kernels and their results are unchanged)."""

    def __init__(self, owner: nn.Module, names: tuple[str, ...]):
        self.names = names
        self.modules: list[PackedLinear] = [getattr(owner, n) for n in names]
        self.sizes = [m.out_features for m in self.modules]
        self.data = torch.cat([m.data for m in self.modules])
        self.scales = torch.cat([m.scales for m in self.modules if m.scales is not None])
        start = 0
        for module, size in zip(self.modules, self.sizes, strict=True):
            module.data, module.scales = self.data[start : start + size], self.scales[start : start + size]
            if module.variant.pack is None:  # its weight arguments were the old buffers
                module.bind(module.kernels)
            start += size

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor] | None:
        """The projections of ``x`` in ``names`` order, or None when they do not run as one launch now."""
        first = self.modules[0]
        rows = x.reshape(-1, first.in_features)
        one_launch = first.variant.backend == "triton" and first.variant.pack is None
        if not (one_launch and takes_decode_path(rows.shape[0])) or any(
            m.variant is not first.variant for m in self.modules
        ):
            return None
        y = first._gemv(rows, self.data, self.scales, first.group_size)
        return [part.view(*x.shape[:-1], part.shape[-1]) for part in y.split(self.sizes, -1)]


class PackedEmbedding(nn.Module):
    """The token embedding stored as quantised rows ``[V, H]``: a lookup gathers only the looked-up rows'
    codes and scales and dequantises them (exact in FP32, then the model's dtype, as the dense model holding
    the dequantised table would)."""

    data: torch.Tensor  # buffers
    scales: torch.Tensor

    def __init__(self, weight: LinearWeight, *, dtype: torch.dtype):
        super().__init__()
        if weight.format == "dense" or weight.data.ndim != 2:
            raise ValueError(
                f"a packed embedding needs quantised [V, H] rows, got {weight.format} {weight.shape}"
            )
        self.format, self.group_size = weight.format, weight.group_size
        self.num_embeddings, self.embedding_dim = weight.shape
        self.dtype = dtype
        self.register_buffer("data", weight.data)
        self.register_buffer("scales", weight.scales)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        ids = token_ids.reshape(-1)
        rows = LinearWeight(self.format, self.data[ids], self.scales[ids], self.group_size)
        return dequantize(rows, self.dtype).view(*token_ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        return (
            f"{self.num_embeddings}, {self.embedding_dim}, format={self.format}, group_size={self.group_size}"
        )


class PackedExpertBank(nn.Module):
    """A layer's routed experts as INT4 banks ``w1``/``w3`` ``[S, inter, hidden]`` and ``w2``
    ``[S, hidden, inter]``; slot ``shared_slot`` (if any) is the shared expert, run with weight 1 for
    every token, so the layer's separate shared-expert MLP must be removed.

    Decode (and prefill, when the expert ops group the routes themselves): route table ``[N, top-k (+1)]``
    -> fused gate/up SwiGLU -> grouped down projection -> route-weighted combine in FP32. Same ``forward``
    as `engine.model.moe.ExpertBank`.
    """

    w1_codes: torch.Tensor  # buffers
    w1_scales: torch.Tensor
    w3_codes: torch.Tensor
    w3_scales: torch.Tensor
    w2_codes: torch.Tensor
    w2_scales: torch.Tensor

    def __init__(
        self,
        w1: LinearWeight,
        w3: LinearWeight,
        w2: LinearWeight,
        selections: dict[str, Selection],
        *,
        shared_slot: int | None,
    ):
        super().__init__()
        banks = {"w1": w1, "w3": w3, "w2": w2}
        for name, bank in banks.items():
            if bank.format != "int4" or bank.data.ndim != 3:
                raise ValueError(f"expert bank {name} must be an INT4 [S, N, K/2] bank, got {bank.format}")
        if (
            len({b.data.shape[0] for b in banks.values()}) != 1
            or len({b.group_size for b in banks.values()}) != 1
        ):
            raise ValueError("expert banks w1, w3, w2 must have the same slots and group size")
        self.slots, self.group_size = w1.data.shape[0], w1.group_size
        if shared_slot is not None and not 0 <= shared_slot < self.slots:
            raise ValueError(f"shared slot {shared_slot} outside a bank of {self.slots}")
        self.shared_slot = shared_slot
        self.routes_include_shared = False  # the router appends the shared slot (engine/kernels/fused.py)
        for name, bank in banks.items():
            self.register_buffer(f"{name}_codes", bank.data)
            self.register_buffer(f"{name}_scales", bank.scales)
        self.bind(selections)

    def bind(self, selections: dict[str, Selection]) -> None:
        self.kernels = {op: selections[op] for op in GROUPED_OPS}
        swiglu, grouped, combine = (selections[op].variant for op in GROUPED_OPS)
        self._swiglu, self._grouped, self._combine = swiglu.fn, grouped.fn, combine.fn
        self._gate_up = (
            *_packed_for(swiglu, self.w1_codes, self.w1_scales),
            *_packed_for(swiglu, self.w3_codes, self.w3_scales),
        )
        self._down = _packed_for(grouped, self.w2_codes, self.w2_scales)
        self._many_rows = swiglu.many_rows and grouped.many_rows
        self._routes_in_one_call = swiglu.groups_routes and grouped.groups_routes

    def _route_table(self, expert_ids: torch.Tensor, expert_weights: torch.Tensor):
        """Append the shared slot with weight 1 to every token's routes (unless the router did)."""
        if self.shared_slot is None or self.routes_include_shared:
            return expert_ids.contiguous(), expert_weights.contiguous()
        n = expert_ids.shape[0]
        ids = torch.cat([expert_ids, expert_ids.new_full((n, 1), self.shared_slot)], dim=1)
        weights = torch.cat([expert_weights, expert_weights.new_ones((n, 1))], dim=1)
        return ids, weights

    def forward(
        self, x: torch.Tensor, expert_ids: torch.Tensor, expert_weights: torch.Tensor
    ) -> torch.Tensor:
        ids, weights = self._route_table(expert_ids, expert_weights.float())
        x = x.contiguous()
        if not (takes_decode_path(x.shape[0]) or self._routes_in_one_call):
            if self._many_rows:
                return grouped_expert_rows(x, ids, weights, self.slots, self._expert_rows)
            return grouped_expert_ffn(x, ids, weights, self.slots, lambda e: self._dense_expert(e, x.dtype))
        g = self.group_size
        hidden = self._swiglu(x, *self._gate_up, ids, g)
        y = self._grouped(hidden, *self._down, ids, g)
        return self._combine(y, weights)

    def _expert_rows(self, slot: int, rows: torch.Tensor) -> torch.Tensor:
        """One expert over many rows through the kernels: a one-slot bank (a view) and route 0."""
        one = slice(slot, slot + 1)
        gate_up = tuple(t[one] for t in self._gate_up)
        route = torch.zeros((rows.shape[0], 1), dtype=torch.int32, device=rows.device)
        hidden = self._swiglu(rows, *gate_up, route, self.group_size)
        down = tuple(t[one] for t in self._down)
        return self._grouped(hidden.squeeze(1), *down, route, self.group_size).squeeze(1)

    def _dense_expert(self, slot: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        def dense(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
            return dequantize(LinearWeight("int4", codes[slot], scales[slot], self.group_size), dtype)

        return (
            dense(self.w1_codes, self.w1_scales),
            dense(self.w3_codes, self.w3_scales),
            dense(self.w2_codes, self.w2_scales),
        )

    def extra_repr(self) -> str:
        return f"slots={self.slots}, shared_slot={self.shared_slot}, group_size={self.group_size}"
