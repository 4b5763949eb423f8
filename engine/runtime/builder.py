"""The model as it runs, built in one place: read `build_model` to know what executes.

    built = build_model(open_model_source(synthetic="tiny"), device="cpu", dtype=torch.float32)
    built.model, built.kda_kernel, built.kernel_variants

Everything below is decided while the model is built; nothing reshapes or re-binds it afterwards (except
`Engine.use_kernels`, an explicit re-bind between sequences for benchmarks).

1. Weight format: the source (engine/runtime/loader.py). A checkpoint, or a synthetic preset without a
   plan, is dense: `Linear`s and stacked `ExpertBank`s, run by torch. An INT4 artifact, or a synthetic
   preset quantised by a plan, is assembled by engine/quant/quantized_model.py: quantised and
   precision-cast projections are `PackedLinear`s, each MoE layer's three banks one `PackedExpertBank`
   (the shared expert as its last slot when the plan packs it there), MLA's `kv_b_proj` dequantised once
   into a plain `Linear`; norms, router, embedding and KDA controls as stored.
2. Packed kernels: every packed module takes its functions at construction from
   `engine.kernels.resolve(device, kernels)`: `kernels` (op -> variant), else `KIMI_KERNELS`, else the
   device's shipped default (engine/kernels/defaults.py). A dense model calls none of them, except on the
   CPU: its `Linear`s run decode rows through the selected `w16a16_gemv` when that is not torch's own
   (`bind_dense_decode_gemvs`; oneDNN's BF16 GEMV reads a cold weight at a fraction of the C++ kernel's
   rate, and torch's FP32 matmul at a continuous batch's few rows is a GEMM several times slower).
3. KDA prefill kernel: `kda_kernel` ("auto", "torch", "fla"; engine/runtime/kda_kernels.py) picks the
   chunked kernel every KDA layer is constructed with: torch's `kda_chunked`, or fla's `chunk_kda` on a
   GPU once it matched `kda_chunked` on random inputs. One new token per sequence runs the recurrent step.
4. Inference form, once the weights are in (`prepare_for_inference`): MLA's absorbed matrices (from
   `kv_b_proj`) computed once instead of per token, and the projections that share an input concatenated
   into one GEMM each (KDA's six, an MLP's gate and up); quantised ones of one format and group size
   into one matrix of concatenated rows, run as one GEMV while bound to a Triton kernel (KDA's q/k/v).
5. Decode or prefill: by the batch's rows, one threshold for every module (engine/model/paths.py).

Around the model, per cache, the Engine runs the decode step eagerly or Inductor-compiled, in a CUDA graph
on a GPU (engine/runtime/decode.py, compiled.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from engine.kernels import ENV_VAR, unused_env_entries
from engine.kernels.linear import bind_dense_decode_gemvs
from engine.model import KimiLinearForCausalLM
from engine.model.kda import KimiDeltaAttention
from engine.model.mla import MultiheadLatentAttention
from engine.model.mlp import MLP
from engine.quant import kernel_variants
from engine.runtime.kda_kernels import select_kda_kernel
from engine.runtime.loader import ModelSource

log = logging.getLogger("engine.runtime")


@dataclass(frozen=True)
class BuiltModel:
    model: KimiLinearForCausalLM
    kda_kernel: str  # the KDA prefill kernel every KDA layer runs: "torch" or "fla"
    kernel_variants: dict[str, str]  # op -> variant bound in the packed modules ({} for dense weights)


def build_model(
    source: ModelSource,
    *,
    device: torch.device | str,
    dtype: torch.dtype,
    kernels: dict[str, str] | None = None,
    kda_kernel: str = "auto",
    verify: bool = True,
    progress: bool = False,
) -> BuiltModel:
    """The model of `source` on `device` in its final form (steps 1 to 4 above). Warns about
    `KIMI_KERNELS` entries that select nothing for these weights."""
    device = torch.device(device)
    kda_name, chunked_kernel = select_kda_kernel(kda_kernel, device)
    model = source.load(
        device, dtype, kernels=kernels, verify=verify, progress=progress, kda_chunked_kernel=chunked_kernel
    )
    prepare_for_inference(model)
    bind_dense_decode_gemvs(model, kernels)
    variants = kernel_variants(model)
    if unused := unused_env_entries(variants):
        log.warning(
            "%s entries %s select nothing: %s", ENV_VAR, ", ".join(unused),
            f"these weights call {', '.join(variants)}" if variants else "these weights are dense (no packed kernels)",
        )  # fmt: skip
    return BuiltModel(model, kda_name, variants)


def prepare_for_inference(model: KimiLinearForCausalLM) -> None:
    """Convert once at load what decode would otherwise convert per token (MLA's absorbed kv_b_proj), and
    concatenate the projections that share an input into one GEMM each (KDA's six, an MLP's gate and up;
    quantised ones into one GEMV on Triton, engine/quant/packed.py's `PackedInputGroup`)."""
    for module in model.modules():
        if isinstance(module, MultiheadLatentAttention):
            module.freeze_absorbed_weights()
        if isinstance(module, (KimiDeltaAttention, MLP)):
            module.fuse_input_projections()
