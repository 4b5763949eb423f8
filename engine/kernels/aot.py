"""Compile every Triton kernel for a CUDA target without a GPU (Triton ships ptxas).

The interpreter accepts code the compiler rejects (constexpr reassignment, bad layouts, ...); this catches
it on a CPU-only machine and reports what each kernel costs: registers, spills, shared memory, and the
instructions of its main loop per byte of weights. Run it where TRITON_INTERPRET is unset::

    python -m engine.kernels.aot --arch 90
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from engine.kernels import triton_combine, triton_gemv

_BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
_ALIGNED = [["tt.divisibility", 16]]

_GEMV_SIGNATURE = {
    "x_ptr": "*bf16", "w_ptr": "*i32", "s_ptr": "*bf16", "ids_ptr": "*i32", "out_ptr": "*fp32",
    "N": "i32", "KW": "i32", "SLOTS": "i32", "stride_xb": "i32", "stride_xs": "i32", "stride_we": "i32",
    "stride_se": "i32", "stride_wn": "i32", "stride_sn": "i32", "stride_split": "i32", "tiles_per_split": "i32",
    "magic": "i32",
    "FMT": "constexpr", "GROUP": "constexpr", "BLOCK_N": "constexpr", "WORDS": "constexpr", "ROUTED": "constexpr",
}  # fmt: skip
_SWIGLU_SIGNATURE = {
    "x_ptr": "*bf16", "wg_ptr": "*i32", "sg_ptr": "*bf16", "wu_ptr": "*i32", "su_ptr": "*bf16", "ids_ptr": "*i32",
    "out_ptr": "*bf16", "N": "i32", "KW": "i32", "SLOTS": "i32", "stride_xb": "i32", "stride_we": "i32",
    "stride_se": "i32", "stride_wn": "i32", "stride_sn": "i32", "num_tiles": "i32", "magic": "i32",
    "GROUP": "constexpr", "BLOCK_N": "constexpr", "WORDS": "constexpr",
}  # fmt: skip


@dataclass(frozen=True)
class Specialisation:
    name: str
    kernel: object
    signature: dict
    constexprs: dict
    aligned: tuple[str, ...]  # arguments Triton would specialise as multiples of 16
    num_warps: int = 4
    weight_bytes_per_thread_step: float | None = None  # to report loop instructions per weight byte


def _gemv(name: str, fmt: int, weight: str, words: int, block_n: int, routed: bool, bytes_per_word: int):
    signature = dict(_GEMV_SIGNATURE, w_ptr=weight)
    constexprs = {
        "FMT": fmt,
        "GROUP": 32 if fmt != 2 else 1,
        "BLOCK_N": block_n,
        "WORDS": words,
        "ROUTED": routed,
    }
    aligned = (
        "x_ptr",
        "w_ptr",
        "s_ptr",
        "out_ptr",
        "KW",
        "stride_xb",
        "stride_wn",
        "stride_sn",
        "stride_we",
        "stride_se",
    )
    step = block_n * words * bytes_per_word / 128
    return Specialisation(name, triton_gemv._gemv_kernel, signature, constexprs, aligned, 4, step)


SPECIALISATIONS = [
    _gemv("w4a16_gemv", 0, "*i32", 32, 64, False, 4),
    _gemv("w8a16_gemv", 1, "*i32", 32, 64, False, 4),
    _gemv("w16a16_gemv", 2, "*bf16", 128, 32, False, 2),
    _gemv("w4a16_grouped_gemv", 0, "*i32", 32, 64, True, 4),
    Specialisation(
        "w4a16_grouped_swiglu",
        triton_gemv._grouped_swiglu_kernel,
        _SWIGLU_SIGNATURE,
        {"GROUP": 32, "BLOCK_N": 32, "WORDS": 32},
        (
            "x_ptr",
            "wg_ptr",
            "sg_ptr",
            "wu_ptr",
            "su_ptr",
            "out_ptr",
            "KW",
            "stride_xb",
            "stride_we",
            "stride_se",
        ),
        4,
        2 * 32 * 32 * 4 / 128,
    ),
    Specialisation(
        "route_combine",
        triton_combine._combine_kernel,
        {
            "y_ptr": "*bf16",
            "w_ptr": "*fp32",
            "out_ptr": "*bf16",
            "S": "i32",
            "N": "i32",
            "BLOCK_N": "constexpr",
        },
        {"BLOCK_N": 256},
        ("y_ptr", "w_ptr", "out_ptr", "N"),
    ),
]


@dataclass(frozen=True)
class Report:
    name: str
    registers: int | None
    spills: int | None
    shared_bytes: int
    loop_instructions_per_byte: float | None

    def describe(self) -> str:
        per_byte = f"{self.loop_instructions_per_byte:.1f}" if self.loop_instructions_per_byte else "-"
        return (
            f"{self.name:<22} registers {self.registers}  spills {self.spills}  shared {self.shared_bytes} B  "
            f"loop instructions / weight byte {per_byte}"
        )


def _cubin_facts(cubin: bytes, bytes_per_step: float | None) -> tuple[int | None, int | None, float | None]:
    tool = _BIN / "cuobjdump"
    if not tool.exists():
        return None, None, None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        usage = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
        sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True).stdout
    registers = re.search(r"REG:(\d+)", usage)
    spills = re.search(r"(\d+) bytes spill stores", usage)
    instructions = re.findall(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)([^;]*);", sass)
    loop = None  # the longest backward branch is the main K loop
    for address, opcode, operands in instructions:
        target = re.search(r"0x([0-9a-f]+)", operands)
        if opcode.startswith("BRA") and target and int(target[1], 16) < int(address, 16):
            span = (int(target[1], 16), int(address, 16))
            loop = span if loop is None or span[1] - span[0] > loop[1] - loop[0] else loop
    per_byte = None
    if loop and bytes_per_step:
        body = [op for address, op, _ in instructions if loop[0] <= int(address, 16) <= loop[1]]
        per_byte = len(body) / bytes_per_step
    return (
        int(registers[1]) if registers else None,
        int(spills[1]) if spills else (0 if usage else None),
        per_byte,
    )


def compile_all(arch: int = 90) -> list[Report]:
    target = GPUTarget("cuda", arch, 32)
    reports = []
    for spec in SPECIALISATIONS:
        names = list(spec.signature)
        attrs = {(names.index(a),): _ALIGNED for a in spec.aligned}
        source = ASTSource(spec.kernel, spec.signature, constexprs=spec.constexprs, attrs=attrs)
        kernel = triton.compile(source, target=target, options={"num_warps": spec.num_warps, "num_stages": 3})
        registers, spills, per_byte = _cubin_facts(kernel.asm["cubin"], spec.weight_bytes_per_thread_step)
        reports.append(Report(spec.name, registers, spills, kernel.metadata.shared, per_byte))
    return reports


def opcode_histogram(cubin: bytes) -> collections.Counter:
    """SASS opcode counts of a compiled kernel (for hand-tuning)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([_BIN / "cuobjdump", "-sass", f.name], capture_output=True, text=True).stdout
    return collections.Counter(
        op.split(".")[0] for op in re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)", sass)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--arch", type=int, default=90, help="compute capability x10 (80 A100, 89 L40S, 90 H100/H200)"
    )
    args = parser.parse_args(argv)
    if triton_gemv.INTERPRETED:
        print("TRITON_INTERPRET is set: kernels are interpreted, nothing to compile", file=sys.stderr)
        return 2
    for report in compile_all(args.arch):
        print(report.describe())
    return 0


if __name__ == "__main__":
    sys.exit(main())
