"""Kimi-Linear in PyTorch: config, model, cache, checkpoint loading, tokenizer, generation."""

from engine.model.cache import CacheFullError, SequenceCache
from engine.model.config import ConfigError, KimiLinearConfig
from engine.model.generate import (
    GeneratedToken,
    GenerationResult,
    SamplingParams,
    generate,
    generate_stream,
    sample,
)
from engine.model.linear import Linear
from engine.model.loading import Checkpoint, CheckpointError, load_model
from engine.model.model import KimiLinearForCausalLM
from engine.model.moe import expert_ffn
from engine.model.presets import PRESETS, preset
from engine.model.tokenizer import Tokenizer

__all__ = [
    "PRESETS",
    "CacheFullError",
    "Checkpoint",
    "CheckpointError",
    "ConfigError",
    "GeneratedToken",
    "GenerationResult",
    "KimiLinearConfig",
    "KimiLinearForCausalLM",
    "Linear",
    "SamplingParams",
    "SequenceCache",
    "Tokenizer",
    "expert_ffn",
    "generate",
    "generate_stream",
    "load_model",
    "preset",
    "sample",
]
