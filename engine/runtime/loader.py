"""Where the model comes from: a checkpoint, an INT4 artifact, or a synthetic preset, behind one function.

`open_model_source(weights=..., synthetic=..., quant=...)` is the single dispatch point for weight
formats: it describes the model (config, name, tokenizer, chat template, quantisation plan) without
allocating it, so the runtime can plan memory first from `meta_model` (packed buffers at their stored
sizes), and `ModelSource.load(device, dtype)` then materialises it:

- a checkpoint directory: `engine.model.load_model` (dense);
- an artifact directory (`manifest.json`, from `kimi-engine quantize`): `engine.quant.load_quantized_model`,
  verified first unless told not to; tokenizer, config and chat template are the artifact's own copies;
- a synthetic preset: random weights generated on the device, dense, or with `quant=PLAN` generated and
  quantised one tensor (or expert bank) at a time (`engine.quant.synthetic_quantized_model`), so the full
  48B shapes never exist densely.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.model import Checkpoint, KimiLinearConfig, KimiLinearForCausalLM, Tokenizer, load_model
from engine.model.kda import ChunkedKernel
from engine.model.loading import SYNTHETIC_MARKER
from engine.model.presets import PRESETS
from engine.model.synthetic_tokenizer import synthetic_tokenizer
from engine.model.tokenizer import CONFIG_FILE
from engine.progress import no_progress, stderr_progress
from engine.quant import (
    PLANS,
    ArtifactError,
    Plan,
    load_quantized_model,
    make_plan,
    quantized_meta_model,
    synthetic_quantized_model,
)
from engine.quant.manifest import MANIFEST_NAME, read_manifest
from engine.synth import init_synthetic_weights

CHAT_TEMPLATE_FILE = "chat_template.jinja"


class ModelSourceError(ValueError):
    """Weights that cannot be served: a missing directory, an unsupported format or combination."""


@dataclass(frozen=True)
class ModelSource:
    name: str  # for logs and reports, e.g. "synthetic tiny (seed 0)" or the directory
    config: KimiLinearConfig
    synthetic: bool  # random weights: anything measured must say so
    checkpoint: Checkpoint | None = None
    artifact: Path | None = None  # an INT4 artifact directory
    preset: str | None = None
    seed: int = 0
    plan: Plan | None = None  # how the weights are stored (artifact) or quantised (synthetic); None: dense

    @property
    def directory(self) -> Path | None:
        """Where the tokenizer and chat template live (None for synthetic models)."""
        if self.checkpoint is not None:
            return self.checkpoint.path
        return self.artifact

    def meta_model(self, dtype: torch.dtype) -> KimiLinearForCausalLM:
        """The model's structure without storage, packed modules at their stored sizes (for sizing
        before anything is allocated)."""
        if self.plan is not None:
            return quantized_meta_model(self.config, self.plan, dtype=dtype)
        return KimiLinearForCausalLM(self.config, dtype=dtype, device="meta")

    def load(
        self,
        device: torch.device | str,
        dtype: torch.dtype,
        *,
        kernels: dict[str, str] | None = None,
        verify: bool = True,
        progress: bool = False,
        kda_chunked_kernel: ChunkedKernel | None = None,
    ) -> KimiLinearForCausalLM:
        """Materialise the weights. `kernels` (op -> variant) binds a packed model's kernels (the rest
        follow KIMI_KERNELS, then the shipped defaults); `verify` re-hashes an artifact first;
        `kda_chunked_kernel` is the KDA layers' prefill kernel (default `kda_chunked`). The runtime calls
        this through `engine.runtime.builder.build_model`."""
        if kernels and self.plan is None:
            raise ModelSourceError("kernel selections apply to quantised weights (an artifact or --quant)")
        bars = stderr_progress if progress else no_progress
        kda = {"kda_chunked_kernel": kda_chunked_kernel}
        if self.artifact is not None:
            return load_quantized_model(
                self.artifact,
                device=device,
                dtype=dtype,
                kernels=kernels,
                verify=verify,
                progress=bars,
                **kda,
            )
        if self.checkpoint is not None:
            return load_model(self.checkpoint.path, device=device, dtype=dtype, progress=progress, **kda)
        if self.plan is not None:
            return synthetic_quantized_model(
                self.config,
                self.plan,
                device=device,
                dtype=dtype,
                seed=self.seed,
                kernels=kernels,
                progress=bars,
                **kda,
            )
        model = KimiLinearForCausalLM(self.config, dtype=dtype, device="meta", **kda).to_empty(device=device)
        init_synthetic_weights(model, self.seed)
        return model.eval()

    def tokenizer(self) -> Tokenizer:
        if self.directory is not None:
            return Tokenizer.from_dir(self.directory)
        return synthetic_tokenizer(self.config.bos_token_id or 256)  # what synth writes for this config

    def chat_template(self) -> str | None:
        """The weights' Jinja chat template (`chat_template.jinja`, or `chat_template` in
        tokenizer_config.json), or None when there is none (synthetic models use the built-in one)."""
        path = self.directory
        if path is None:
            return None
        if (path / CHAT_TEMPLATE_FILE).exists():
            return (path / CHAT_TEMPLATE_FILE).read_text()
        config_file = path / CONFIG_FILE
        template = json.loads(config_file.read_text()).get("chat_template") if config_file.exists() else None
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        return template if isinstance(template, str) else None


def open_model_source(
    *,
    weights: str | Path | None = None,
    synthetic: str | None = None,
    seed: int = 0,
    quant: str | None = None,
) -> ModelSource:
    """Exactly one of `weights` (a checkpoint or artifact directory) and `synthetic` (a preset name);
    `quant` (a plan name) quantises a synthetic model in memory."""
    if (weights is None) == (synthetic is None):
        raise ModelSourceError(
            "give either weights (a checkpoint or artifact directory) or a synthetic preset"
        )
    if quant is not None and quant not in PLANS:
        raise ModelSourceError(f"unknown quantisation plan {quant!r}; choose one of {', '.join(PLANS)}")
    if synthetic is not None:
        if synthetic not in PRESETS:
            raise ModelSourceError(
                f"unknown synthetic preset {synthetic!r}; choose one of {', '.join(PRESETS)}"
            )
        plan = None if quant is None else make_plan(quant)
        return ModelSource(
            name=f"synthetic {synthetic} (seed {seed})"
            + (f", quantised in memory: plan {quant}" if plan else ""),
            config=PRESETS[synthetic],
            synthetic=True,
            preset=synthetic,
            seed=seed,
            plan=plan,
        )
    assert weights is not None  # exactly one of weights and synthetic (checked above)
    path = Path(weights)
    if (path / MANIFEST_NAME).exists():
        if quant is not None:
            raise ModelSourceError(
                f"{path} is an INT4 artifact, already quantised (plan in its {MANIFEST_NAME}); drop the plan"
            )
        return _artifact_source(path)
    if quant is not None:
        raise ModelSourceError(
            f"to serve {path} quantised, build an artifact first: kimi-engine quantize {path} DST --plan {quant}"
        )
    checkpoint = Checkpoint.open(path)
    return ModelSource(
        name=str(path),
        config=checkpoint.config,
        synthetic=checkpoint.synthetic is not None,
        checkpoint=checkpoint,
    )


def _artifact_source(path: Path) -> ModelSource:
    """Describe an artifact from its manifest and config.json; the shards are verified when loaded."""
    try:
        plan = Plan.from_json(read_manifest(path)["plan"])
    except (ArtifactError, KeyError, TypeError, ValueError) as error:
        raise ModelSourceError(f"{path}: not a loadable artifact: {error}") from None
    if not (path / "config.json").is_file():
        raise ModelSourceError(f"{path}: the artifact has no config.json; the model's shapes come from it")
    return ModelSource(
        name=f"{path} (INT4 artifact, plan {plan.name})",
        config=KimiLinearConfig.from_file(path),
        synthetic=(path / SYNTHETIC_MARKER).exists(),  # copied from a `kimi-engine synth` source
        artifact=path,
        plan=plan,
    )
