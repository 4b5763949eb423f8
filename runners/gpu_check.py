"""GPU evidence for the decode kernels: equivalence of every variant, then achieved bandwidth.

On a machine with an NVIDIA GPU (no network needed)::

    python -m runners.gpu_check --out results/kernels

1. Measures device-to-device copy bandwidth (``dst.copy_(src)`` on 1 GiB buffers, read + write bytes).
2. Checks every non-reference variant against its reference at the edge shapes and at the full
   Kimi-Linear shapes (engine/kernels/equivalence.py: fresh inputs, poisoned outputs, dtype tolerances).
3. Times every variant at the full shapes: a CUDA graph of R calls on R different input sets (R chosen
   so their bytes exceed 4x the L2 cache), replayed under ``triton.testing.do_bench`` (which also
   flushes L2 before each replay); per-call time = replay time / R. Achieved bandwidth is the call's
   compulsory bytes (engine/kernels/traffic.py) over the median time, reported against the copy bandwidth.
4. Writes one receipt per measurement through harness.receipt (suite "kernels") and equivalence.json.

``--sweep`` also checks and times alternative Triton launch configurations (tile rows, split-K) at batch 1,
the data for choosing engine/kernels/triton_gemv.launch_config. ``--references`` also times the reference
variants (plain PyTorch), the baseline each kernel replaces. Exits 1 if any equivalence check fails.
``--dry-run`` lists the plan (shapes, bytes) without a GPU. ``python -m runners kernels`` runs the same
steps (with the references) through the runner CLI on a GPU, and at small shapes on the CPU.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from engine.kernels import registry
from engine.kernels.defaults import SHIPPED_DEFAULTS
from engine.kernels.shapes import EDGE_SHAPES, kimi_shapes
from engine.kernels.traffic import op_bytes
from engine.kernels.triton_gemv import LaunchConfig
from engine.model import KimiLinearConfig, preset

COPY_BYTES = 2**30
ROTATION_MIN, ROTATION_MAX = 2, 64
# Launch configurations timed by --sweep (batch 1 only): (variant, configs) per operation.
_SPLITS = [LaunchConfig(block_n, 256, split) for block_n in (16, 32, 64) for split in (1, 2, 4, 8)]
SWEEP = {
    "w4a16_gemv": ("triton", _SPLITS),
    "w4a16_grouped_gemv": ("triton", _SPLITS),
    "w4a16_grouped_swiglu": ("triton_fused", [LaunchConfig(block_n, 256, 1) for block_n in (16, 32, 64)]),
}


@dataclass(frozen=True)
class Measurement:
    op: str
    variant: str
    shape: dict
    bytes_per_call: int
    launch: LaunchConfig | None = None  # None: the variant's own choice

    @property
    def name(self) -> str:
        dims = "x".join(f"{k}{self.shape[k]}" for k in ("B", "S", "E", "N", "K") if k in self.shape)
        group = f"g{self.shape['group']}" if "group" in self.shape else ""
        launch = ""
        if self.launch is not None:
            launch = f"[n{self.launch.block_n}_k{self.launch.block_k}_s{self.launch.split_k}]"
        return f"{self.op}.{self.variant}{launch}@{self.shape['name']}:{dims}{group}"

    @property
    def options(self) -> dict:
        return {} if self.launch is None else {"config": self.launch}


def plan(
    config: KimiLinearConfig,
    group: int,
    batches: tuple[int, ...],
    ops: list[str] | None,
    *,
    sweep: bool = False,
    references: bool = False,
    device: str = "cuda",
) -> tuple[dict, list[Measurement]]:
    """The equivalence shapes per op (edge + full size) and the timed measurements (full size, fast
    variants that can run on ``device``, with ``references`` the reference variants too; with ``sweep``
    also the SWEEP launch configurations at batch 1)."""
    full = kimi_shapes(config, group=group, batches=batches)
    selected = ops or list(full)
    unknown = set(selected) - set(full)
    if unknown:
        raise SystemExit(f"unknown operations {sorted(unknown)}; known: {', '.join(full)}")
    checks = {op: EDGE_SHAPES[op] + full[op] for op in selected}
    timed = [
        Measurement(op, v.name, shape, op_bytes(op, shape))
        for op in selected
        for v in registry.variants(op)
        if (references or not v.is_reference) and registry.built_for(v, device)
        for shape in full[op]
    ]
    if sweep:
        timed += [
            Measurement(op, variant, shape, op_bytes(op, shape), launch)
            for op, (variant, launches) in SWEEP.items()
            if op in selected
            for shape in full[op]
            if shape["B"] == 1
            for launch in launches
        ]
    return checks, timed


def rotations(bytes_per_call: int, l2_bytes: int) -> int:
    """Input sets to cycle through so one pass reads at least 4x the L2 cache."""
    return max(ROTATION_MIN, min(ROTATION_MAX, math.ceil(4 * l2_bytes / max(bytes_per_call, 1))))


TIMING_GPU = "CUDA graph of rotated calls replayed under triton.testing.do_bench; per-call ms"


def receipt_fields(
    m: Measurement,
    times_ms: list[float],
    copy_gbs: float,
    rotation: int,
    check: dict,
    *,
    timing: str = TIMING_GPU,
    extra_config: dict | None = None,
) -> dict:
    """Keyword arguments for harness.receipt.write_receipt for one timed kernel."""
    median_ms = statistics.median(times_ms)
    achieved = m.bytes_per_call / (median_ms * 1e-3) / 1e9
    return {
        "config": {
            "op": m.op,
            "variant": m.variant,
            "shape": m.shape,
            "bytes_per_call": m.bytes_per_call,
            "rotated_input_sets": rotation,
            "shipped_default_on_cuda": SHIPPED_DEFAULTS["cuda"].get(m.op) == m.variant and m.launch is None,
            "launch": None if m.launch is None else asdict(m.launch),
            "timing": timing,
            "equivalence": check,
            **(extra_config or {}),
        },
        "samples": {"time_ms": times_ms},
        "units": {"time_ms": "ms"},
        "derived": {
            "copy_bandwidth_gbs": copy_gbs,
            "achieved_gbs": achieved,
            "fraction_of_copy": achieved / copy_gbs,
        },
    }


def _copy_bandwidth(device) -> tuple[float, list[float]]:
    import triton.testing

    src = torch.empty(COPY_BYTES, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    times = triton.testing.do_bench(lambda: dst.copy_(src), warmup=50, rep=500, return_mode="all")
    return 2 * COPY_BYTES / (statistics.median(times) * 1e-3) / 1e9, times


def _time(m: Measurement, device, l2_bytes: int) -> tuple[list[float], int]:
    import triton.testing

    from engine.kernels.cases import CASES

    chosen = registry.select(m.op, m.variant, device).variant
    rotation = rotations(m.bytes_per_call, l2_bytes)
    cases = [CASES[m.op](m.shape, torch.Generator(device).manual_seed(i), device) for i in range(rotation)]
    args = [registry.packed_args(chosen, case.args) for case in cases]  # packed once, as at load
    outs = [torch.empty(c.out_shape, dtype=c.out_dtype, device=device) for c in cases]

    def calls():
        for case, packed, out in zip(cases, args, outs, strict=True):
            chosen.fn(*packed, **case.kwargs, **m.options, out=out)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        calls()  # compile and warm up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        calls()
    times = triton.testing.do_bench(graph.replay, warmup=25, rep=300, return_mode="all")
    return [t / rotation for t in times], rotation


def run(
    out: Path,
    *,
    config: KimiLinearConfig,
    group: int,
    batches: tuple[int, ...],
    ops: list[str] | None,
    sweep: bool = False,
    references: bool = False,
    command: list[str],
    equivalence_json: Path | None = None,
) -> int:
    """Copy bandwidth, equivalence at edge + full shapes, then timing; receipts under ``out``.
    Returns 1 when an equivalence check failed, 2 without a GPU, else 0."""
    if not torch.cuda.is_available():
        print("gpu_check needs an NVIDIA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    from engine.kernels.equivalence import check, check_all
    from harness.receipt import write_receipt

    checks, timed = plan(config, group, batches, ops, sweep=sweep, references=references)
    device = torch.device("cuda")
    props = torch.cuda.get_device_properties(device)
    l2_bytes = props.L2_cache_size
    print(f"{props.name}: {props.multi_processor_count} SMs, L2 {l2_bytes / 2**20:.0f} MiB")

    copy_gbs, copy_times = _copy_bandwidth(device)
    print(f"device copy bandwidth: {copy_gbs:.1f} GB/s (median of {len(copy_times)})")
    write_receipt(
        "kernels",
        f"device_copy@{COPY_BYTES >> 20}MiB",
        config={
            "bytes_copied": COPY_BYTES,
            "counted_bytes": 2 * COPY_BYTES,
            "method": "dst.copy_(src), do_bench",
        },
        samples={"time_ms": copy_times},
        units={"time_ms": "ms"},
        derived={"copy_bandwidth_gbs": copy_gbs},
        command=command,
        results_dir=out,
    )

    results = check_all(checks, device=device)
    for r in results:
        print(r.describe())
    outcome = {(r.op, r.variant, r.shape["name"]): r for r in results}

    for m in timed:
        if m.variant == registry.REFERENCE:
            result = None  # the reference is what the others are checked against
        elif m.launch is None:
            result = outcome[(m.op, m.variant, m.shape["name"])]
        else:
            result = check(m.op, m.variant, m.shape, device=device, options=m.options)
            results.append(result)
        if result is not None and not result.passed:
            print(f"skip timing {m.name}: not equivalent")
            continue
        times, rotation = _time(m, device, l2_bytes)
        verdict = (
            {"reference": True}
            if result is None
            else {"passed": True, "worst_ratio": result.worst_ratio, "seed": result.seed}
        )
        fields = receipt_fields(
            m, times, copy_gbs, rotation, verdict, extra_config={"device": "cuda", "comparable": True}
        )
        path = write_receipt("kernels", m.name, **fields, command=command, results_dir=out)
        d = fields["derived"]
        print(
            f"{m.name}: {statistics.median(times) * 1e3:.2f} us, {d['achieved_gbs']:.0f} GB/s, "
            f"{d['fraction_of_copy']:.1%} of copy -> {path}"
        )
    if equivalence_json is not None:
        equivalence_json.parent.mkdir(parents=True, exist_ok=True)
        equivalence_json.write_text(json.dumps([asdict(r) for r in results], indent=1, default=str))
    failed = [r for r in results if not r.passed]
    if failed:
        for r in failed:
            print(r.describe(), file=sys.stderr)
        print(f"{len(failed)} equivalence check(s) FAILED", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, help="receipt directory (required unless --dry-run)")
    parser.add_argument("--config", type=Path, help="HF config.json (default: Kimi-Linear-48B-A3B)")
    parser.add_argument("--group-size", type=int, default=32)
    parser.add_argument("--batches", default="1,8", help="comma-separated batch sizes (default 1,8)")
    parser.add_argument("--ops", help="comma-separated operations (default: all)")
    parser.add_argument("--sweep", action="store_true", help="also time alternative launch configurations")
    parser.add_argument("--references", action="store_true", help="also time the reference variants")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and exit; needs no GPU")
    args = parser.parse_args(argv)

    config = KimiLinearConfig.from_file(args.config) if args.config else preset("full")
    batches = tuple(int(b) for b in args.batches.split(","))
    ops = args.ops.split(",") if args.ops else None

    if args.dry_run:
        checks, timed = plan(
            config, args.group_size, batches, ops, sweep=args.sweep, references=args.references
        )
        for op, shapes in checks.items():
            print(f"equivalence {op}: {len(shapes)} shapes x {len(registry.variants(op)) - 1} variants")
        for m in timed:
            print(f"time {m.name}: {m.bytes_per_call:,} bytes/call")
        return 0
    if args.out is None:
        parser.error("--out is required")
    command = [sys.executable, "-m", "runners.gpu_check", *(argv if argv is not None else sys.argv[1:])]
    return run(
        args.out,
        config=config,
        group=args.group_size,
        batches=batches,
        ops=ops,
        sweep=args.sweep,
        references=args.references,
        command=command,
        equivalence_json=args.out / "equivalence.json",
    )


if __name__ == "__main__":
    sys.exit(main())
