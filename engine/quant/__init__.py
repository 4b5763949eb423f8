"""Selective INT4 quantisation: codec, plans, artifact builder, verifier and loader (docs/INT4.md)."""

from engine.quant.artifact import Artifact, ArtifactVerificationError, ExpertBank
from engine.quant.budget import TokenBytes, decode_bytes_per_token
from engine.quant.build import build_artifact
from engine.quant.codec import LinearWeight, dequantize, pack_int4, quantize, unpack_int4
from engine.quant.manifest import ArtifactError
from engine.quant.plan import PLANS, Plan, make_plan
from engine.quant.verify import VerifyReport, verify_artifact

__all__ = [
    "PLANS",
    "Artifact",
    "ArtifactError",
    "ArtifactVerificationError",
    "ExpertBank",
    "LinearWeight",
    "Plan",
    "TokenBytes",
    "VerifyReport",
    "build_artifact",
    "decode_bytes_per_token",
    "dequantize",
    "make_plan",
    "pack_int4",
    "quantize",
    "unpack_int4",
    "verify_artifact",
]
