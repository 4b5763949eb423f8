"""Where the model comes from: a checkpoint directory or a synthetic preset, behind one function.

`open_model_source(weights=..., synthetic=...)` is the single dispatch point for weight formats: it
describes the model (config, name, tokenizer, chat template) without allocating it, so the runtime can
plan memory first, and `ModelSource.load(device, dtype)` then materialises it. A directory holding an
INT4 artifact (`manifest.json`) is recognised here and refused until the artifact loader exists.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.model import Checkpoint, KimiLinearConfig, KimiLinearForCausalLM, Tokenizer, load_model
from engine.model.presets import PRESETS
from engine.model.tokenizer import CONFIG_FILE, write_byte_level_tokenizer
from engine.synth import init_synthetic_weights

ARTIFACT_MANIFEST = "manifest.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"


class ModelSourceError(ValueError):
    """Weights that cannot be served: a missing directory, an unsupported format."""


@dataclass(frozen=True)
class ModelSource:
    name: str  # for logs and reports, e.g. "synthetic tiny (seed 0)" or the directory
    config: KimiLinearConfig
    synthetic: bool  # random weights: anything measured must say so
    checkpoint: Checkpoint | None = None
    preset: str | None = None
    seed: int = 0

    def meta_model(self, dtype: torch.dtype) -> KimiLinearForCausalLM:
        """The model's structure without storage (for sizing before anything is allocated)."""
        return KimiLinearForCausalLM(self.config, dtype=dtype, device="meta")

    def load(self, device: torch.device | str, dtype: torch.dtype, *, progress: bool = False):
        if self.checkpoint is not None:
            return load_model(self.checkpoint.path, device=device, dtype=dtype, progress=progress)
        model = self.meta_model(dtype).to_empty(device=device)
        init_synthetic_weights(model, self.seed)
        return model.eval()

    def tokenizer(self) -> Tokenizer:
        if self.checkpoint is not None:
            return Tokenizer.from_dir(self.checkpoint.path)
        with tempfile.TemporaryDirectory() as tmp:  # the synthetic byte-level tokenizer, one source of truth
            write_byte_level_tokenizer(tmp)
            return Tokenizer.from_dir(tmp)

    def chat_template(self) -> str | None:
        """The checkpoint's Jinja chat template (`chat_template.jinja`, or `chat_template` in
        tokenizer_config.json), or None when it has none (synthetic models use the built-in one)."""
        if self.checkpoint is None:
            return None
        path = self.checkpoint.path
        if (path / CHAT_TEMPLATE_FILE).exists():
            return (path / CHAT_TEMPLATE_FILE).read_text()
        config_file = path / CONFIG_FILE
        template = json.loads(config_file.read_text()).get("chat_template") if config_file.exists() else None
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        return template if isinstance(template, str) else None


def open_model_source(*, weights: str | Path | None = None, synthetic: str | None = None, seed: int = 0):
    """Exactly one of `weights` (checkpoint directory) and `synthetic` (a preset name)."""
    if (weights is None) == (synthetic is None):
        raise ModelSourceError("give either weights (a checkpoint directory) or a synthetic preset")
    if synthetic is not None:
        if synthetic not in PRESETS:
            raise ModelSourceError(
                f"unknown synthetic preset {synthetic!r}; choose one of {', '.join(PRESETS)}"
            )
        return ModelSource(
            name=f"synthetic {synthetic} (seed {seed})",
            config=PRESETS[synthetic],
            synthetic=True,
            preset=synthetic,
            seed=seed,
        )
    path = Path(weights)
    if (path / ARTIFACT_MANIFEST).exists():
        raise ModelSourceError(
            f"{path} is an INT4 artifact ({ARTIFACT_MANIFEST}); INT4 artifacts are not yet supported by the "
            "server: serve the BF16 checkpoint it was made from, or a synthetic preset"
        )
    checkpoint = Checkpoint.open(path)
    return ModelSource(
        name=str(path),
        config=checkpoint.config,
        synthetic=checkpoint.synthetic is not None,
        checkpoint=checkpoint,
    )
