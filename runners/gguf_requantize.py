"""Q4_0 copy of an F16 GGUF (from `kimi-engine export-gguf`), with `gguf.quants`, for llama.cpp speed runs.

Q4_0 is llama.cpp's symmetric 4-bit format with 32-element blocks, the closest to the project's INT4
codec. The tensors converted are the ones the project's `default` plan stores in INT4 and llama.cpp can
run quantised: attention projections (KDA q/k/v/o, MLA q/o), the dense MLP, the routed experts and the
shared expert. Everything else keeps its type from the F16 file: F16 embedding, LM head, MLA latent
projection and KDA controls; F32 norms, router, decay parameters, convolutions and the split `kv_b_proj`
(`attn_k_b`/`attn_v_b`, F32 because llama.cpp's CPU backend cannot run them in F16; the plan has INT4).
Differences from the project's codec (docs/METHODS.md): the scale (the block's signed extreme / −8, codes
−8…7, as the plans' `signed` rounding) is stored in FP16, not BF16; group size fixed at 32; and llama.cpp's
CPU matmuls quantise activations to 8 bits, where the engine keeps them in 16 bits.
"""

from __future__ import annotations

import re
from pathlib import Path

import gguf
import numpy as np

Q4_0 = gguf.GGMLQuantizationType.Q4_0
F16 = gguf.GGMLQuantizationType.F16
QUANTISED = re.compile(r"^blk\.\d+\.(attn_(q|k|v|output)|ffn_(gate|up|down)(_exps|_shexp)?)\.weight$")


def requantize_q4_0(src: Path, dst: Path) -> dict[str, int]:
    """Write `dst`: `src` with the selected F16 matrices in Q4_0. Returns tensor counts by output type."""
    reader = gguf.GGUFReader(src)
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    writer = gguf.GGUFWriter(str(dst), arch)
    for field in reader.fields.values():
        # The writer adds the architecture and the GGUF.* header fields itself; the file type changes.
        if field.name in (
            gguf.Keys.General.ARCHITECTURE,
            gguf.Keys.General.FILE_TYPE,
        ) or field.name.startswith("GGUF."):
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)

    def to_q4_0(tensor) -> bool:
        return (
            tensor.tensor_type == F16
            and bool(QUANTISED.match(tensor.name))
            and tensor.data.shape[-1] % 32 == 0
        )

    counts: dict[str, int] = {}
    for tensor in reader.tensors:  # the tensor table first: shapes and types, nothing quantised yet
        if to_q4_0(tensor):
            shape = gguf.quants.quant_shape_to_byte_shape(tensor.data.shape, Q4_0)
            writer.add_tensor_info(tensor.name, shape, np.dtype(np.uint8), int(np.prod(shape)), Q4_0)
        else:
            writer.add_tensor_info(
                tensor.name, tensor.data.shape, tensor.data.dtype, tensor.data.nbytes, tensor.tensor_type
            )
        kind = Q4_0 if to_q4_0(tensor) else tensor.tensor_type
        counts[kind.name] = counts.get(kind.name, 0) + 1
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tensor in reader.tensors:  # one tensor in memory at a time
        data = tensor.data
        writer.write_tensor_data(
            gguf.quants.quantize(data.astype(np.float32), Q4_0) if to_q4_0(tensor) else data
        )
    writer.close()
    return counts


def tensor_types(path: Path) -> dict[str, int]:
    """Tensor counts per ggml type in a GGUF file."""
    counts: dict[str, int] = {}
    for tensor in gguf.GGUFReader(path).tensors:
        counts[tensor.tensor_type.name] = counts.get(tensor.tensor_type.name, 0) + 1
    return counts
