"""A model whose quantised tensors hold their dequantised values: what INT4/INT8 storage does to the weights.

For a plan, every checkpoint tensor the plan stores as `int4`/`int8` is encoded with the project's codec
(`engine.quant.quantize`) and decoded back (`engine.quant.dequantize`, exact in FP32); `bf16` tensors are
rounded to BF16; `keep` tensors are untouched. Running that model measures the damage of the storage
format independently of any kernel. Plans are applied in place on one model, restoring from the weight
source between plans, so two copies of a large model are never needed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.model import Checkpoint, KimiLinearConfig, KimiLinearForCausalLM
from engine.model.checkpoint_spec import TensorSpec, checkpoint_tensors
from engine.model.loading import parameter_for
from engine.quant import Plan, dequantize, quantize
from engine.quant.budget import stored_nbytes
from engine.synth import synthetic_tensor


@dataclass(frozen=True)
class WeightSource:
    """Reads one checkpoint tensor by name (in its checkpoint dtype) on `device`."""

    describe: str
    read: Callable[[TensorSpec], torch.Tensor]


def synthetic_source(seed: int, device: torch.device | str) -> WeightSource:
    """The synthetic weights of `engine.synth` (same values as `init_synthetic_weights` on that device)."""
    return WeightSource(
        f"synthetic weights (engine.synth, seed {seed})",
        lambda spec: synthetic_tensor(spec, seed, device=device),
    )


def checkpoint_source(checkpoint: Checkpoint, device: torch.device | str) -> WeightSource:
    return WeightSource(str(checkpoint.path), lambda spec: checkpoint.read(spec.name).to(device))


@torch.no_grad()
def fill(model: KimiLinearForCausalLM, source: WeightSource) -> None:
    """Copy every tensor of the source into the model (the unquantised baseline)."""
    for spec in checkpoint_tensors(model.config):
        parameter_for(model, spec.name).copy_(source.read(spec))


def stored_value(weight: torch.Tensor, precision: str, plan: Plan) -> torch.Tensor | None:
    """The value a tensor takes once stored at `precision` and read back; None when it is kept as is."""
    if precision in ("int4", "int8"):
        return dequantize(quantize(weight, precision, plan.group_size, plan.scale_torch_dtype, plan.rounding))
    if precision == "bf16":
        return weight.to(torch.bfloat16)
    return None


class PlanApplier:
    """Applies plans to one model in place; tensors a previous plan changed are restored from the source."""

    def __init__(self, model: KimiLinearForCausalLM, source: WeightSource):
        self.model, self.source = model, source
        self.specs = checkpoint_tensors(model.config)
        self._changed: set[str] = set()

    def check(self, plan: Plan) -> None:
        """Raise PlanError when the plan cannot store some tensor of this model (e.g. a group size)."""
        for spec in self.specs:
            plan.decide(spec.name, spec.shape)

    @torch.no_grad()
    def apply(self, plan: Plan | None) -> dict[str, int]:
        """Switch the model to `plan` (None: the unquantised baseline). Returns tensors per precision."""
        counts: dict[str, int] = {}
        changed: set[str] = set()
        for spec in self.specs:
            precision = "keep" if plan is None else plan.decide(spec.name, spec.shape).precision
            counts[precision] = counts.get(precision, 0) + 1
            if precision == "keep" and spec.name not in self._changed:
                continue
            weight = self.source.read(spec)
            value = None if plan is None else stored_value(weight, precision, plan)
            parameter_for(self.model, spec.name).copy_(weight if value is None else value)
            if value is not None:
                changed.add(spec.name)
        self._changed = changed
        return counts


def stored_bytes_by_class(config: KimiLinearConfig, plan: Plan) -> dict[str, int]:
    """Bytes each tensor class of the configuration's checkpoint occupies once stored under `plan`."""
    out: dict[str, int] = {}
    for spec in checkpoint_tensors(config):
        decision = plan.decide(spec.name, spec.shape)
        out[decision.tensor_class] = out.get(decision.tensor_class, 0) + stored_nbytes(
            spec, decision.precision, plan
        )
    return out
