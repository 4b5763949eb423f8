"""Selective INT4 quantisation: codec, plans, artifact builder, verifier, loader, and the model built from
stored weights with the registry's kernels (docs/INT4.md)."""

from engine.codec import LinearWeight, dequantize, pack_int4, quantize, unpack_int4
from engine.quant.artifact import Artifact, ArtifactVerificationError, StoredExpertBank
from engine.quant.budget import TokenBytes, decode_bytes_per_token
from engine.quant.build import build_artifact
from engine.quant.manifest import ArtifactError
from engine.quant.packed import PackedEmbedding, PackedExpertBank, PackedLinear
from engine.quant.plan import PLANS, Plan, make_plan
from engine.quant.quantized_model import (
    kernel_variants,
    load_dequantized_model,
    load_quantized_model,
    quantize_model,
    quantized_meta_model,
    synthetic_quantized_model,
    use_kernels,
)
from engine.quant.verify import VerifyReport, verify_artifact

__all__ = [
    "PLANS",
    "Artifact",
    "ArtifactError",
    "ArtifactVerificationError",
    "LinearWeight",
    "PackedEmbedding",
    "PackedExpertBank",
    "PackedLinear",
    "Plan",
    "StoredExpertBank",
    "TokenBytes",
    "VerifyReport",
    "build_artifact",
    "decode_bytes_per_token",
    "dequantize",
    "kernel_variants",
    "load_dequantized_model",
    "load_quantized_model",
    "make_plan",
    "pack_int4",
    "quantize",
    "quantize_model",
    "quantized_meta_model",
    "synthetic_quantized_model",
    "unpack_int4",
    "use_kernels",
    "verify_artifact",
]
