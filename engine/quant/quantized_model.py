"""Kimi-Linear from stored weights: an INT4 artifact, or dense weights quantised in memory by a plan.

    model = load_quantized_model(DIR, device="cuda", dtype=torch.bfloat16)        # registry defaults
    model = load_quantized_model(DIR, device="cpu", dtype=torch.float32, kernels={"w4a16_gemv": "triton"})
    reference = load_dequantized_model(DIR, dtype=torch.float32)   # plain model holding the stored values
    model = quantize_model(dense_model, make_plan("default"))       # same packed model, nothing on disk
    model = synthetic_quantized_model(preset("full"), plan, device="cuda", dtype=torch.bfloat16, seed=0)

How each stored tensor enters the model (module names equal checkpoint names, docs/ENGINE.md):
- quantised projections (INT4 / INT8) and precision-cast ones (the BF16 LM head) become `PackedLinear`s,
  run by the registry's GEMV for their format;
- each MoE layer's three banks become one `PackedExpertBank`; when the banks hold the shared expert,
  the layer's separate shared-expert MLP is removed (it runs as the bank's last slot);
- a quantised token embedding becomes a `PackedEmbedding` (a lookup dequantises only its rows);
- MLA's `kv_b_proj` is dequantised once at load into an ordinary `Linear`: decode multiplies by its matrix
  directly (weight absorption) every step, which no GEMV kernel does;
- everything else (norms, router, KDA controls, embedding, `kv_a_proj_with_mqa`) is copied in as stored.

Kernels are resolved once, when the model is built (`kernels`: op -> variant; unnamed ops follow
`KIMI_KERNELS`, then the shipped default for the device), and `use_kernels` re-binds them; the modules
call the bound functions directly.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol, cast

import torch

from engine.codec import LinearWeight, dequantize
from engine.kernels import registry
from engine.kernels.fused import fused_variants, use_fused_kernels
from engine.kernels.linear import bind_dense_decode_gemvs
from engine.model.checkpoint_spec import TensorSpec, checkpoint_tensors
from engine.model.config import KimiLinearConfig
from engine.model.kda import ChunkedKernel
from engine.model.linear import Linear
from engine.model.loading import parameter_for
from engine.model.mla import MultiheadLatentAttention
from engine.model.model import KimiLinearForCausalLM
from engine.model.moe import ExpertBank, SparseMoE
from engine.progress import ProgressFactory, no_progress
from engine.quant.artifact import Artifact, stored_weight
from engine.quant.build import Unit, encode_unit, plan_units
from engine.quant.manifest import ArtifactError
from engine.quant.packed import PackedEmbedding, PackedExpertBank, PackedLinear
from engine.quant.plan import Plan
from engine.synth import synthetic_tensor

_BANK = re.compile(r"^model\.layers\.(\d+)\.block_sparse_moe\.expert_bank\.(w[123])$")


class WeightSource(Protocol):
    """Stored weights by unit (an `Artifact`, or `PlannedWeights` encoding in memory)."""

    plan: Plan

    def units(self) -> list[Unit]: ...

    def parts(self, unit: Unit, device: torch.device | str) -> dict[str, torch.Tensor]: ...


class PlannedWeights:
    """A plan applied to dense checkpoint tensors, encoded on the device when read; nothing is written.

    ``fetch(spec)`` returns the dense tensor of one checkpoint tensor (any device and float dtype).
    """

    def __init__(self, cfg: KimiLinearConfig, plan: Plan, fetch: Callable[[TensorSpec], torch.Tensor]):
        self.plan = plan
        self.specs = {spec.name: spec for spec in checkpoint_tensors(cfg)}
        self._fetch = fetch
        self._units = plan_units(self.specs, plan)

    def units(self) -> list[Unit]:
        return self._units

    def parts(self, unit: Unit, device: torch.device | str) -> dict[str, torch.Tensor]:
        return encode_unit(unit, lambda name: self._fetch(self.specs[name]), self.plan, device)


class _StoredLayout:
    """Each unit's stored parts as ``meta`` tensors of the shapes and dtypes `encode_unit` produces."""

    def __init__(self, cfg: KimiLinearConfig, plan: Plan):
        self.plan = plan
        self.specs = {spec.name: spec for spec in checkpoint_tensors(cfg)}
        self._units = plan_units(self.specs, plan)

    def units(self) -> list[Unit]:
        return self._units

    def parts(self, unit: Unit, device: torch.device | str) -> dict[str, torch.Tensor]:
        *rows, k = self.specs[unit.sources[0]].shape
        lead = (len(unit.sources),) if unit.kind == "expert_bank" else ()

        def empty(last: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.empty((*lead, *rows, last), dtype=dtype, device="meta")

        if unit.precision == "int4":
            codes = empty(k // 2, torch.uint8)
        elif unit.precision == "int8":
            codes = empty(k, torch.int8)
        else:
            dtype = torch.bfloat16 if unit.precision == "bf16" else self.specs[unit.sources[0]].dtype
            return {"tensor": empty(k, dtype)}
        return {"codes": codes, "scales": empty(k // self.plan.group_size, self.plan.scale_torch_dtype)}


def load_quantized_model(
    artifact_dir: str | Path,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.bfloat16,
    kernels: dict[str, str] | None = None,
    verify: bool = True,
    progress: ProgressFactory = no_progress,
    kda_chunked_kernel: ChunkedKernel | None = None,
) -> KimiLinearForCausalLM:
    """The model from a `kimi-engine quantize` artifact, packed weights run by the registry's kernels.

    ``dtype`` is the activation (and kept-tensor) dtype. The artifact is verified first unless
    ``verify=False`` (see `Artifact.open`). ``kda_chunked_kernel``: the KDA layers' prefill kernel.
    """
    selections = registry.resolve(device, kernels)  # first: an unavailable kernel fails before any reading
    artifact = Artifact.open(Path(artifact_dir), verify=verify, progress=progress)
    return _assemble(
        _config(artifact),
        artifact,
        device=device,
        dtype=dtype,
        selections=selections,
        progress=progress,
        kda_chunked_kernel=kda_chunked_kernel,
    )


def load_dequantized_model(
    artifact_dir: str | Path,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    verify: bool = True,
    progress: ProgressFactory = no_progress,
) -> KimiLinearForCausalLM:
    """The plain model holding the artifact's stored values, dequantised (exact in FP32): the reference the
    quantised model is compared with, and what accuracy runs measure the plan's effect on."""
    artifact = Artifact.open(Path(artifact_dir), verify=verify, progress=progress)
    cfg = _config(artifact)
    units = artifact.units()
    _check_coverage(cfg, units)
    model = KimiLinearForCausalLM(cfg, dtype=dtype, device="meta").to_empty(device=device)
    with progress("loading", len(units)) as bar:
        for unit in units:
            for name, value in stored_values(unit, artifact.parts(unit, device), artifact.plan):
                parameter_for(model, name).copy_(value)
            bar.update(1)
    return model.eval()


def quantize_model(
    model: KimiLinearForCausalLM,
    plan: Plan,
    *,
    kernels: dict[str, str] | None = None,
    progress: ProgressFactory = no_progress,
) -> KimiLinearForCausalLM:
    """A packed copy of a dense model, quantised on its device by ``plan`` (the same codes `kimi-engine
    quantize` writes for the same weights). The dense model is left as it is."""
    selections = registry.resolve(model.device, kernels)
    source = PlannedWeights(model.config, plan, lambda spec: parameter_for(model, spec.name))
    return _assemble(
        model.config, source, device=model.device, dtype=model.dtype, selections=selections, progress=progress
    )


def synthetic_quantized_model(
    cfg: KimiLinearConfig,
    plan: Plan,
    *,
    device: torch.device | str,
    dtype: torch.dtype,
    seed: int,
    kernels: dict[str, str] | None = None,
    progress: ProgressFactory = no_progress,
    kda_chunked_kernel: ChunkedKernel | None = None,
) -> KimiLinearForCausalLM:
    """A packed model of synthetic weights (`engine.synth`), generated and quantised on ``device`` one tensor
    (or expert bank) at a time: the dense model never exists, so the full 48B shapes fit a GPU."""
    selections = registry.resolve(device, kernels)
    source = PlannedWeights(cfg, plan, lambda spec: synthetic_tensor(spec, seed, device=device))
    return _assemble(
        cfg,
        source,
        device=device,
        dtype=dtype,
        selections=selections,
        progress=progress,
        kda_chunked_kernel=kda_chunked_kernel,
    )


def quantized_meta_model(cfg: KimiLinearConfig, plan: Plan, *, dtype: torch.dtype) -> KimiLinearForCausalLM:
    """The packed model's structure on ``meta``: every module, buffer and parameter it will hold, at its
    stored shape and dtype, with nothing read or allocated. What a runtime sizes its memory plan from.
    It never runs (the reference kernels are bound)."""
    selections = registry.resolve("cpu", registry.named_choices("reference"))
    return _assemble(cfg, _StoredLayout(cfg, plan), device="meta", dtype=dtype, selections=selections)


def use_kernels(model: KimiLinearForCausalLM, kernels: dict[str, str] | None = None) -> dict[str, str]:
    """Re-bind every packed module to ``kernels`` (op -> variant; None: the defaults) on the model's
    device; returns `kernel_variants(model)`. Raises `KernelUnavailable` rather than fall back."""
    selections = registry.resolve(model.device, kernels)
    for module in model.modules():
        if isinstance(module, PackedLinear | PackedExpertBank):
            module.bind(selections)
    use_fused_kernels(model, selections)
    bind_dense_decode_gemvs(model, kernels)
    return kernel_variants(model)


def kernel_variants(model: KimiLinearForCausalLM) -> dict[str, str]:
    """The variant bound for each kernel operation the model calls (for a dense model: the decode GEMV of
    its Linears and the grouped kernels of its expert banks where bound, else empty)."""
    found: dict[str, str] = {}
    packed = False
    dense_gemv = None  # of plain Linears with a decode GEMV bound (engine.kernels.linear)
    for module in model.modules():
        if isinstance(module, PackedLinear | PackedExpertBank):
            packed = True
            found.update({op: selection.variant.name for op, selection in module.kernels.items()})
        elif isinstance(module, Linear) and module.decode_variant:
            dense_gemv = module.decode_variant
        elif isinstance(module, ExpertBank):
            found.update(module.decode_variants)
    if packed:  # the fused decode kernels were bound with the same selections
        found.update(fused_variants(model))
    if dense_gemv is not None:
        found["w16a16_gemv"] = dense_gemv
    return dict(sorted(found.items()))


def stored_values(
    unit: Unit, parts: dict[str, torch.Tensor], plan: Plan
) -> Iterator[tuple[str, torch.Tensor]]:
    """(checkpoint name, stored value) for each source tensor of a unit; quantised values dequantised in FP32."""
    weight = stored_weight(unit, parts, plan)
    dense = weight.data if weight.format == "dense" else dequantize(weight)
    if unit.kind == "expert_bank":
        yield from zip(unit.sources, dense, strict=True)
    else:
        yield unit.sources[0], dense


def _assemble(
    cfg: KimiLinearConfig,
    source: WeightSource,
    *,
    device: torch.device | str,
    dtype: torch.dtype,
    selections: dict[str, registry.Selection],
    progress: ProgressFactory = no_progress,
    kda_chunked_kernel: ChunkedKernel | None = None,
) -> KimiLinearForCausalLM:
    units = source.units()
    _check_coverage(cfg, units)
    model = KimiLinearForCausalLM(cfg, dtype=dtype, device="meta", kda_chunked_kernel=kda_chunked_kernel)
    kept: list[Unit] = []
    banks: dict[int, dict[str, LinearWeight]] = {}
    with progress("loading", len(units)) as bar:
        for unit in units:
            if unit.kind == "expert_bank":
                layer, projection = _bank_position(unit.name)
                banks.setdefault(layer, {})[projection] = stored_weight(
                    unit, source.parts(unit, device), source.plan
                )
                if len(banks[layer]) == 3:
                    _install_bank(model, layer, banks.pop(layer), unit.shared_slot, selections)
            elif _becomes_packed(model, unit):
                weight = stored_weight(unit, source.parts(unit, device), source.plan)
                _install_linear(model, unit.name.removesuffix(".weight"), weight, selections, dtype)
            elif unit.kind == "linear" and unit.tensor_class == "embedding":
                weight = stored_weight(unit, source.parts(unit, device), source.plan)
                _install_embedding(model, weight, dtype)
            else:
                kept.append(unit)
                continue
            bar.update(1)
        # Allocate what is still on `meta` (the modules that stay dense), then fill it.
        for module in model.modules():
            if not isinstance(module, PackedLinear | PackedExpertBank | PackedEmbedding):
                module.to_empty(device=device, recurse=False)
        for unit in kept:
            for name, value in stored_values(unit, source.parts(unit, device), source.plan):
                parameter_for(model, name).copy_(value)
            bar.update(1)
    use_fused_kernels(model, selections)
    return model.eval()


def _config(artifact: Artifact) -> KimiLinearConfig:
    if artifact.config is None:
        raise ArtifactError(f"{artifact.directory} has no config.json; the model's shapes come from it")
    return KimiLinearConfig.from_hf_dict(artifact.config)


def _check_coverage(cfg: KimiLinearConfig, units: list[Unit]) -> None:
    expected = {spec.name for spec in checkpoint_tensors(cfg)}
    stored = {name for unit in units for name in unit.sources}
    if stored != expected:
        missing, unexpected = sorted(expected - stored), sorted(stored - expected)
        raise ArtifactError(
            f"the stored tensors do not match config.json: {len(missing)} missing (e.g. {missing[:3]}), "
            f"{len(unexpected)} unexpected (e.g. {unexpected[:3]})"
        )


def _bank_position(name: str) -> tuple[int, str]:
    match = _BANK.match(name)
    if match is None:
        raise ArtifactError(f"{name} is not an expert bank name")
    return int(match[1]), match[2]


def _split(path: str) -> tuple[str, str]:
    parent, _, child = path.rpartition(".")
    return parent, child


def _becomes_packed(model: KimiLinearForCausalLM, unit: Unit) -> bool:
    """A quantised or precision-cast weight of a `Linear`, except a matrix the model reads directly."""
    if unit.kind != "linear" and unit.precision != "bf16":
        return False
    parent_path, child = _split(unit.name.removesuffix(".weight"))
    parent = model.get_submodule(parent_path)
    absorbed = isinstance(parent, MultiheadLatentAttention) and child == "kv_b_proj"
    return isinstance(getattr(parent, child, None), Linear) and not absorbed


def _install_linear(
    model: KimiLinearForCausalLM,
    path: str,
    weight: LinearWeight,
    selections: dict[str, registry.Selection],
    dtype: torch.dtype,
) -> None:
    parent_path, child = _split(path)
    parent = model.get_submodule(parent_path)
    dense: Linear = getattr(parent, child)
    if weight.shape != (dense.out_features, dense.in_features):
        raise ArtifactError(
            f"{path}: stored shape {weight.shape}, the model needs {(dense.out_features, dense.in_features)}"
        )
    setattr(parent, child, PackedLinear(weight, selections, dtype=dtype))


def _install_embedding(model: KimiLinearForCausalLM, weight: LinearWeight, dtype: torch.dtype) -> None:
    needed = (model.config.vocab_size, model.config.hidden_size)
    if weight.shape != needed:
        raise ArtifactError(f"model.embed_tokens: stored shape {weight.shape}, the model needs {needed}")
    model.model.embed_tokens = PackedEmbedding(weight, dtype=dtype)


def _install_bank(
    model: KimiLinearForCausalLM,
    layer: int,
    banks: dict[str, LinearWeight],
    shared_slot: int | None,
    selections: dict[str, registry.Selection],
) -> None:
    moe = cast(SparseMoE, model.model.layers[layer].block_sparse_moe)
    for projection, bank in banks.items():
        routed = getattr(moe.experts, projection).shape
        if bank.shape[1:] != routed[1:] or bank.shape[0] != routed[0] + (shared_slot is not None):
            raise ArtifactError(
                f"layer {layer} expert bank {projection}: stored shape {bank.shape}, the model has {tuple(routed)} "
                f"routed experts{' plus the shared one' if shared_slot is not None else ''}"
            )
    moe.experts = PackedExpertBank(banks["w1"], banks["w3"], banks["w2"], selections, shared_slot=shared_slot)
    if shared_slot is not None:
        moe.shared_experts = None  # runs as the bank's last slot
