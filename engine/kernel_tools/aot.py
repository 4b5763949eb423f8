"""Compile the Triton launches the engine really makes, for CUDA targets, without a GPU (Triton ships ptxas).

The launches are captured, not written by hand: every Triton variant of every registered operation is
called at the full Kimi-Linear shapes (batches 1 and 8) on ``meta`` tensors with Triton's launch
intercepted, and Triton's own binder turns each call's arguments into the signature, constexprs and
alignment attributes the runtime would compile (SLOTS=1 folded, strides marked multiples of 16, int64
where the runtime passes int64). Each distinct specialisation is compiled for each target with the
installed Triton and reported: registers, spills, shared memory, the global loads of its main loop (vector
width of the weight loads), barriers inside a loop, and loop instructions per weight byte::

    kimi-engine kernels --compile sm_90,sm_89

Run it where TRITON_INTERPRET is unset. The launch configuration depends on the SM count (split-K), so
capture uses the target's (SM_COUNTS). Uses Triton internals (``create_function_from_signature``,
``JITFunction._pack_args``), checked with the Triton the project pins.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction, create_function_from_signature

from engine.kernel_tools.cases import CASES
from engine.kernel_tools.shapes import kimi_shapes
from engine.kernels import registry, triton_gemv
from engine.kernels.triton_gemv import direct_launches

_BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
SM_COUNTS = {90: 132, 89: 142, 80: 108}  # H100/H200, L40S, A100: what launch_config's split-K sees
# Element bits of a weight word per kernel format (FMT 0 int4 and 1 int8 load int32 words, 2 is dense).
_WEIGHT_BITS = {"_gemv_kernel": 32, "_grouped_swiglu_kernel": 32}


@dataclass(frozen=True)
class Launch:
    op: str
    variant: str
    shape: str
    kernel: JITFunction
    args: tuple
    kwargs: dict


@contextmanager
def _intercepted(sm_count: int):
    """Record Triton launches instead of running them (compiled or interpreted kernels alike);
    launch_config sees ``sm_count`` SMs."""
    recorded: list[tuple[JITFunction, tuple, dict]] = []
    run, interpreted_run, sm = JITFunction.run, InterpretedFunction.run, triton_gemv._sm_count
    JITFunction.run = InterpretedFunction.run = lambda self, *args, grid, warmup, **kwargs: recorded.append(
        (self, args, kwargs)
    )
    triton_gemv._sm_count = lambda device: sm_count
    try:
        yield recorded
    finally:
        JITFunction.run, InterpretedFunction.run, triton_gemv._sm_count = run, interpreted_run, sm


def capture(config, *, group: int = 32, batches=(1, 8), sm_count: int = 132) -> list[Launch]:
    """Every Triton launch of every Triton variant at the model's shapes, on meta tensors."""
    launches = []
    for op, shapes in kimi_shapes(config, group=group, batches=batches).items():
        for v in registry.variants(op):
            if v.backend != "triton":
                continue
            for shape in shapes:
                case = CASES[op](shape, None, "meta")
                out = torch.empty(case.out_shape, dtype=case.out_dtype, device="meta")
                with _intercepted(sm_count) as recorded, direct_launches():
                    v.fn(*case.args, **case.kwargs, out=out)
                launches += [Launch(op, v.name, shape["name"], k, a, kw) for k, a, kw in recorded]
    return launches


@dataclass(frozen=True)
class Report:
    kernel: str
    used_by: tuple[str, ...]  # op.variant@shape of every launch with this specialisation
    constexprs: dict
    unaligned: tuple[str, ...]  # arguments not known to be multiples of 16 (what tells launches apart)
    registers: int | None
    spills: int | None
    shared_bytes: int
    loop_loads: dict  # "ld.global.v4.b32" -> count, inside the main (longest) loop
    weight_load_bits: int | None  # widest-element loads of the weight words in the loop: bits per load
    loop_barriers: int
    loop_instructions_per_weight_byte: float | None

    @property
    def defects(self) -> list[str]:
        found = []
        if self.spills:
            found.append(f"{self.spills} bytes spilled")
        if self.weight_load_bits is not None and self.weight_load_bits < 128:
            found.append(f"weight loads of {self.weight_load_bits} bits (not 128-bit vectors)")
        if self.loop_barriers and self.kernel in _WEIGHT_BITS:
            found.append(f"{self.loop_barriers} barriers inside the K loop")
        return found

    def describe(self) -> str:
        per_byte = self.loop_instructions_per_weight_byte
        loads = ", ".join(f"{n}x {k}" for k, n in sorted(self.loop_loads.items())) or "-"
        return (
            f"{self.kernel} {self.constexprs} not 16-aligned: {', '.join(self.unaligned) or '-'}\n"
            f"  registers {self.registers}  spills {self.spills}  shared {self.shared_bytes} B  "
            f"weight loads {self.weight_load_bits or '-'} bit  barriers in loop {self.loop_barriers}  "
            f"loop instructions / weight byte {f'{per_byte:.1f}' if per_byte else '-'}\n"
            f"  loop loads: {loads}\n"
            f"  used by {len(self.used_by)} launches, e.g. {', '.join(self.used_by[:3])}"
            + (f"\n  DEFECTS: {'; '.join(self.defects)}" if self.defects else "")
        )


def compile_launches(launches: list[Launch], arch: int) -> list[Report]:
    """Compile each distinct specialisation of ``launches`` for sm_``arch``; one report each."""
    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    groups: dict[tuple, list] = {}
    for launch in launches:
        binder = create_function_from_signature(launch.kernel.signature, launch.kernel.params, backend)
        bound, specialization, options = binder(*launch.args, **launch.kwargs)
        opts, signature, constexprs, attrs = launch.kernel._pack_args(
            backend, launch.kwargs, bound, specialization, options
        )
        key = (launch.kernel.fn.__name__, repr(signature), repr(constexprs), repr(attrs), repr(opts))
        entry = groups.setdefault(key, [launch.kernel, signature, constexprs, attrs, opts, []])
        entry[5].append(f"{launch.op}.{launch.variant}@{launch.shape}")
    reports = []
    for (name, *_), (kernel, signature, constexprs, attrs, opts, used_by) in groups.items():
        compiled = triton.compile(
            ASTSource(kernel, signature, constexprs, attrs), target=target, options=opts.__dict__
        )
        names = list(signature)
        named = {names[path[0]]: value for path, value in constexprs.items() if len(path) == 1}
        unaligned = tuple(names[p[0]] for p, a in attrs.items() if not a and names[p[0]] not in named)
        loads, barriers = loop_facts(compiled.asm["ptx"])
        weight_bits = _weight_load_bits(loads, _WEIGHT_BITS.get(name))
        step_bytes = _weight_bytes_per_thread_step(name, named, opts.num_warps)
        registers, spills, per_byte = _cubin_facts(compiled.asm["cubin"], step_bytes)
        reports.append(
            Report(
                kernel=name,
                used_by=tuple(used_by),
                constexprs=named,
                unaligned=unaligned,
                registers=registers,
                spills=spills,
                shared_bytes=compiled.metadata.shared,
                loop_loads=loads,
                weight_load_bits=weight_bits,
                loop_barriers=barriers,
                loop_instructions_per_weight_byte=per_byte,
            )
        )
    return reports


_LABEL = re.compile(r"^(\$L__\w+):")
_BRANCH = re.compile(r"\bbra(?:\.uni)?\s+(\$L__\w+);")
_LOAD = re.compile(r"\b(ld\.global(?:\.[A-Za-z0-9_:]+)*)\s")
_BARRIER = re.compile(r"\b(?:bar\.sync|barrier\.sync|bar\.arrive|barrier\.arrive)\b")


def loop_facts(ptx: str) -> tuple[dict[str, int], int]:
    """Global loads (by PTX form, cache hints dropped) and barriers inside the longest loop of ``ptx``:
    the span from a label to the last branch back to it."""
    lines = ptx.splitlines()
    labels = {m[1]: i for i, line in enumerate(lines) if (m := _LABEL.match(line.strip()))}
    loop = None
    for i, line in enumerate(lines):
        m = _BRANCH.search(line)
        if m and m[1] in labels and labels[m[1]] < i:
            span = (labels[m[1]], i)
            loop = span if loop is None or span[1] - span[0] > loop[1] - loop[0] else loop
    if loop is None:
        return {}, 0
    body = lines[loop[0] : loop[1] + 1]
    loads: dict[str, int] = {}
    for line in body:
        if m := _LOAD.search(line):
            form = ".".join(p for p in m[1].split(".") if not p.startswith(("L1", "L2", "nc", "relaxed")))
            loads[form] = loads.get(form, 0) + 1
    return loads, sum(bool(_BARRIER.search(line)) for line in body)


def _weight_load_bits(loads: dict[str, int], element_bits: int | None) -> int | None:
    """Bits per load of the narrowest load of ``element_bits``-bit elements in the loop (the weight
    words: x and the scales are 16-bit), or None when the kernel's weights are not told apart."""
    if element_bits is None:
        return None
    widths = []
    for form in loads:
        parts = form.split(".")
        bits = next((int(p[1:]) for p in parts if re.fullmatch(r"[bsuf]\d+", p)), None)
        if bits == element_bits:
            vector = next((int(p[1:]) for p in parts if re.fullmatch(r"v\d", p)), 1)
            widths.append(vector * bits)
    return min(widths, default=None)


def _weight_bytes_per_thread_step(name: str, constexprs: dict, num_warps: int) -> float | None:
    """Weight bytes one thread reads per K-loop iteration (for instructions per weight byte)."""
    if "BLOCK_N" not in constexprs or "WPT" not in constexprs:
        return None
    word = 2 if constexprs.get("FMT") == 2 else 4
    banks = 2 if name == "_grouped_swiglu_kernel" else 1
    words = constexprs["GPT"] * constexprs["WPT"]  # per K tile
    return banks * constexprs["BLOCK_N"] * words * word / (32 * num_warps)


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


def parse_targets(text: str) -> list[int]:
    """``sm_90,sm_89`` (or ``90,89``) -> [90, 89]."""
    archs = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        digits = item.removeprefix("sm_")
        if not digits.isdigit():
            raise ValueError(f"{item!r} is not a CUDA target like sm_90")
        archs.append(int(digits))
    if not archs:
        raise ValueError("no CUDA target given (e.g. sm_90,sm_89)")
    return archs


def compile_for(config, arch: int, *, group: int = 32, batches=(1, 8)) -> list[Report]:
    """The engine's launches at ``config``'s shapes, captured with sm_``arch``'s SM count, compiled."""
    if triton_gemv.KERNELS_INTERPRETED:
        raise RuntimeError("TRITON_INTERPRET is set: the kernels are interpreted, nothing to compile")
    launches = capture(config, group=group, batches=batches, sm_count=SM_COUNTS.get(arch, 132))
    return compile_launches(launches, arch)
