"""GPU evidence for the decode kernels: equivalence of every variant, then achieved bandwidth.

`python -m runners gpu-check --out DIR` (`gpu_check_command`) is the one prepared GPU run: copy bandwidth,
these kernel checks, decode and a long prefill, each step (runners/gpu_run.py) in its own process under its
own timeout, receipts and log returned as one tar (docs/RUNTIME.md). The kernel part alone::

    python -m runners.gpu_check --out results/kernels

1. Measures device-to-device copy bandwidth (runners/bandwidth.py: 1 GiB, do_bench, read + write bytes).
2. Checks every non-reference variant against its reference at the edge shapes and at the full
   Kimi-Linear shapes (engine/kernel_tools/equivalence.py: fresh inputs, poisoned outputs, dtype tolerances).
3. Times every variant at the full shapes: a CUDA graph of R calls on R different input sets (R chosen
   so their bytes exceed 4x the L2 cache), replayed under ``triton.testing.do_bench`` (which also
   flushes L2 before each replay); per-call time = replay time / R. Achieved bandwidth is the call's
   compulsory bytes (engine/kernel_tools/traffic.py) over the median time, reported against the copy bandwidth.
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

import click
import torch

from common.click_options import count_option
from engine.kernel_tools.shapes import EDGE_SHAPES, kimi_shapes
from engine.kernel_tools.traffic import op_bytes
from engine.kernels import registry
from engine.kernels.defaults import SHIPPED_DEFAULTS
from engine.kernels.triton_gemv import LaunchConfig
from engine.model import KimiLinearConfig, preset

CPU_COPY_BYTES = 16 << 20  # --dry-run: the CPU sequence only has to run, not to measure
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


def measure_copy(device, *, command: list[str], out: Path) -> list[float]:
    """The device's copy bandwidth (runners.bandwidth: the one denominator), as a receipt; its GB/s samples."""
    from harness.receipt import write_receipt
    from runners.bandwidth import GPU_COPY_BYTES, copy_bandwidth_gbs

    on_gpu = str(device).startswith("cuda")
    size = GPU_COPY_BYTES if on_gpu else CPU_COPY_BYTES
    samples = copy_bandwidth_gbs(str(device)) if on_gpu else copy_bandwidth_gbs("cpu", size_mib=size >> 20)
    write_receipt(
        "kernels",
        f"device_copy.{size >> 20}MiB",
        config={
            "bytes_copied": size,
            "counted_bytes": 2 * size,
            "device": str(device),
            "method": "runners.bandwidth.copy_bandwidth_gbs: dst.copy_(src)"
            + (", do_bench" if on_gpu else ", 3 rotated buffers, perf_counter"),
        },
        samples={"copy_gbs": samples},
        units={"copy_gbs": "GB/s"},
        derived={"copy_bandwidth_gbs": statistics.median(samples)},
        command=command,
        results_dir=out,
    )
    return samples


def _time(m: Measurement, device, l2_bytes: int) -> tuple[list[float], int]:
    import triton.testing

    from engine.kernel_tools.cases import CASES

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
    checks: dict,
    timed: list[Measurement],
    *,
    command: list[str],
    equivalence_json: Path | None = None,
    copy_gbs: float | None = None,
) -> int:
    """Copy bandwidth (unless measured already: ``copy_gbs``), equivalence at the shapes of ``checks``,
    then timing of ``timed`` (both from `plan`); receipts under ``out``. Returns 1 when an equivalence
    check failed, 2 without a GPU, else 0."""
    if not torch.cuda.is_available():
        print("gpu_check needs an NVIDIA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    from engine.kernel_tools.equivalence import check, check_all
    from harness.receipt import write_receipt

    device = torch.device("cuda")
    props = torch.cuda.get_device_properties(device)
    l2_bytes = props.L2_cache_size
    print(f"{props.name}: {props.multi_processor_count} SMs, L2 {l2_bytes / 2**20:.0f} MiB")

    if copy_gbs is None:
        copy_gbs = statistics.median(measure_copy(device, command=command, out=out))
    print(f"device copy bandwidth: {copy_gbs:.1f} GB/s (median)")

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


STEP_TIMEOUT_S = {
    "copy": 60,
    "kernels": 150,
    "decode": 200,
    "prefill": 120,
    "count": 45,
}  # GPU and dry run alike
BUDGET_S = 420  # the whole run: 7 minutes, inside the device's 10-minute command limit
TAR_NAME, SUMMARY_NAME = "gpu-check-receipts.tar", "gpu-check-summary.txt"


@click.command("gpu-check")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help=f"Folder for the two files that come back from the GPU machine: {TAR_NAME} (every receipt "
    f"and the log) and {SUMMARY_NAME}. Created if missing.",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Run the same steps on the CPU at the tiny preset's shapes (Triton interpreted): tests the "
    "sequence without a GPU; the receipts measure nothing.",
)
@count_option(
    "--budget-s",
    default=BUDGET_S,
    minimum=30,
    help="Seconds for the whole run; a step starts only with its full timeout left, else it is skipped.",
)
def gpu_check_command(out: Path, dry_run: bool, budget_s: int) -> None:
    """The one prepared GPU run: copy bandwidth once (do_bench, 1 GiB, the denominator of every receipt),
    equivalence and bandwidth of every registered kernel variant at the full Kimi-Linear shapes (batch 1
    and 8), decode of a synthetic INT4 `full` model built in GPU memory (contexts 17 and 1024) and a
    32k-token prefill under the 32 GiB cap when time remains. Each step runs in its own process under
    its own timeout (a hung step is killed, the rest go on); receipts and the log come back as one tar."""
    code = run_device_sequence(out, dry_run=dry_run, budget_s=budget_s)
    if code:
        raise click.ClickException(f"a step failed (see {out / SUMMARY_NAME})")


def run_device_sequence(out: Path, *, dry_run: bool, budget_s: int = BUDGET_S) -> int:
    """Run runners/gpu_run.py's STEPS in child processes; write the tar and the summary under ``out``.
    Returns 1 when any step failed or was cut off, else 0."""
    import os
    import subprocess
    import tarfile
    import tempfile
    import time

    from runners.gpu_run import STEPS

    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    env = dict(os.environ, PYTHONUNBUFFERED="1", **({"TRITON_INTERPRET": "1"} if dry_run else {}))
    lines = [f"gpu-check{' --dry-run' if dry_run else ''}: steps {', '.join(STEPS)}; budget {budget_s} s"]
    failed = False
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        work = Path(tmp)
        log = work / "log.txt"
        for step in STEPS:
            left = budget_s - (time.monotonic() - started)
            timeout = STEP_TIMEOUT_S[step]
            if timeout > left:
                lines.append(f"{step}: skipped ({left:.0f} s left of the budget, the step needs {timeout} s)")
                continue
            argv = [
                sys.executable,
                "-m",
                "runners.gpu_run",
                step,
                str(work),
                *(["--dry-run"] if dry_run else []),
            ]
            t0 = time.monotonic()
            with log.open("a") as sink:
                sink.write(f"==== {step}: {' '.join(argv)}\n")
                sink.flush()
                try:
                    rc = subprocess.run(
                        argv, stdout=sink, stderr=subprocess.STDOUT, env=env, timeout=timeout
                    ).returncode
                    verdict = "passed" if rc == 0 else f"FAILED (exit {rc})"
                except subprocess.TimeoutExpired:
                    rc, verdict = -1, f"TIMED OUT after {timeout} s"
            failed |= rc != 0
            lines.append(f"{step}: {verdict} in {time.monotonic() - t0:.0f} s")
            print(lines[-1], file=sys.stderr)
            if rc != 0:  # the step's own last words, so the reason shows without opening the tar
                print("".join(log.read_text().splitlines(keepends=True)[-15:]), file=sys.stderr)
            if step == "copy" and rc != 0:
                lines.append("the copy bandwidth is every later step's denominator: stopping")
                break
        lines += _summarise(work / "results")
        lines.append(f"total {time.monotonic() - started:.0f} s")
        (out / SUMMARY_NAME).write_text("\n".join(lines) + "\n")
        log.open("a").write("\n".join(lines) + "\n")
        with tarfile.open(out / TAR_NAME, "w") as tar:
            tar.add(log, arcname="log.txt")
            if (work / "results").is_dir():
                tar.add(work / "results", arcname="results")
    print((out / SUMMARY_NAME).read_text(), end="")
    return 1 if failed else 0


def _summarise(results: Path) -> list[str]:
    """One line per receipt: its name and the numbers a reader looks for first."""
    from harness.receipt import load_receipt, receipt_paths

    lines = []
    for path in receipt_paths(results):
        r = load_receipt(path)
        d = r["derived"]
        if "fraction_of_copy" in d:
            lines.append(f"{r['name']}: {d['achieved_gbs']:.1f} GB/s, {d['fraction_of_copy']:.1%} of copy")
        elif "fraction_of_roofline" in d:
            s = r["summary"]
            lines.append(
                f"{r['name']}: decode {s['decode_tok_s']['median']:.1f} tok/s "
                f"({d['fraction_of_roofline']:.1%} of roofline), prefill {s['prefill_tok_s']['median']:.0f} tok/s"
            )
        elif "copy_bandwidth_gbs" in d:
            lines.append(f"{r['name']}: copy {d['copy_bandwidth_gbs']:.1f} GB/s")
    return [f"{len(lines)} receipts:", *lines]


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

    checks, timed = plan(config, args.group_size, batches, ops, sweep=args.sweep, references=args.references)
    if args.dry_run:
        for op, shapes in checks.items():
            print(f"equivalence {op}: {len(shapes)} shapes x {len(registry.variants(op)) - 1} variants")
        for m in timed:
            print(f"time {m.name}: {m.bytes_per_call:,} bytes/call")
        return 0
    if args.out is None:
        parser.error("--out is required")
    command = [sys.executable, "-m", "runners.gpu_check", *(argv if argv is not None else sys.argv[1:])]
    return run(args.out, checks, timed, command=command, equivalence_json=args.out / "equivalence.json")


if __name__ == "__main__":
    sys.exit(main())
