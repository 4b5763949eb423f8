"""`python -m runners kernels`: every registered variant of every decode kernel against its reference.

On a GPU this is runners/gpu_check.py with the reference variants timed too: equivalence at edge and full
Kimi-Linear shapes, then each variant timed in a CUDA graph, achieved bandwidth against the measured
device copy bandwidth. On the CPU the same plan runs at the shapes of a small preset: the reference
variants in plain PyTorch, the Triton variants in the Triton interpreter (receipts `"comparable": false`:
the interpreter checks correctness, its speed means nothing). The interpreter needs TRITON_INTERPRET=1
before triton is first imported, so on the CPU the measurement runs in a child process that has it.
Method: docs/METHODS.md.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import click
import torch

from common.click_options import count_option
from engine.cli_options import synthetic_option
from engine.kernel_tools.cases import CASES
from engine.kernel_tools.equivalence import check_all
from engine.kernels import registry
from engine.kernels.triton_gemv import triton_unavailable
from engine.model import preset
from engine.model.presets import PRESETS
from harness.receipt import write_receipt
from runners import gpu_check
from runners.bandwidth import copy_bandwidth_gbs
from runners.decode import positive_ints
from runners.options import results_option
from runners.regenerate import regenerate
from runners.threads import all_cores, apply_threads, threads_option

MIN_SAMPLE_S = 0.02  # a sample times enough calls to last this long (timer resolution, loop overhead)
LLC_FALLBACK = 32 << 20
TIMING_CPU = "time.perf_counter around a batch of calls cycling through rotated input sets; per-call ms"


def last_level_cache_bytes() -> int:
    """The CPU's largest cache (Linux sysfs), or 32 MiB when it cannot be read."""
    sizes = []
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = path.read_text().strip()
        units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
        sizes.append(int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text))
    return max(sizes, default=LLC_FALLBACK)


def time_on_cpu(m: gpu_check.Measurement, repeats: int, llc_bytes: int) -> tuple[list[float], int, int]:
    """Per-call ms for `repeats` samples, the input sets rotated through, and the calls per sample.

    Plain-PyTorch variants rotate through enough input sets to exceed 4x the last-level cache (at most
    gpu_check.ROTATION_MAX); interpreted ones use one set (their cost is the interpreter's, not memory)."""
    chosen = registry.select(m.op, m.variant, "cpu").variant
    interpreted = chosen.backend == "triton"
    rotation = 1 if interpreted else gpu_check.rotations(m.bytes_per_call, llc_bytes)
    cases = [CASES[m.op](m.shape, torch.Generator().manual_seed(i), "cpu") for i in range(rotation)]
    args = [registry.packed_args(chosen, case.args) for case in cases]  # packed once, as at load
    outs = [torch.empty(c.out_shape, dtype=c.out_dtype) for c in cases]

    def calls(n: int) -> float:
        start = time.perf_counter()
        for i in range(n):
            case = cases[i % rotation]
            chosen.fn(*args[i % rotation], **case.kwargs, **m.options, out=outs[i % rotation])
        return time.perf_counter() - start

    first = calls(rotation) / rotation  # warm-up, untimed; estimates one call
    per_sample = max(rotation, math.ceil(MIN_SAMPLE_S / max(first, 1e-9)))
    return [calls(per_sample) / per_sample * 1e3 for _ in range(repeats)], rotation, per_sample


def measure_cpu(
    preset_name: str, group: int, batches: list[int], ops: list[str] | None, repeats: int, threads: int,
    copy_mib: int, results: str, command: list[str],
) -> int:  # fmt: skip
    """Equivalence, copy bandwidth and timing on the CPU; one receipt per (variant, shape). Returns the
    number of failed equivalence checks."""
    reason = triton_unavailable("cpu")
    if reason is not None:
        raise click.ClickException(f"cannot run the Triton variants on the CPU: {reason}")
    apply_threads(threads)
    checks, timed = gpu_check.plan(
        preset(preset_name), group, tuple(batches), ops, references=True, device="cpu"
    )
    click.echo(f"equivalence at {sum(map(len, checks.values()))} shapes (interpreted Triton) ...", err=True)
    outcome = {(r.op, r.variant, r.shape["name"]): r for r in check_all(checks, device="cpu")}
    failed = [r for r in outcome.values() if not r.passed]
    for r in failed:
        click.echo(r.describe(), err=True)
    click.echo("measuring copy bandwidth ...", err=True)
    copy = copy_bandwidth_gbs("cpu", size_mib=copy_mib)
    copy_median = statistics.median(copy)
    write_receipt(
        "kernels",
        f"cpu_copy@{copy_mib}MiB",
        config={
            "bytes_copied": copy_mib << 20,
            "counted_bytes": 2 * (copy_mib << 20),
            "device": "cpu",
            "method": "runners.bandwidth.copy_bandwidth_gbs: dst.copy_(src), 3 rotated buffers",
        },
        samples={"copy_gbs": copy},
        units={"copy_gbs": "GB/s"},
        derived={"copy_bandwidth_gbs": copy_median},
        command=command,
        results_dir=Path(results),
    )
    llc = last_level_cache_bytes()
    with click.progressbar(timed, label="kernels", item_show_func=lambda m: m and m.name) as bar:
        for m in bar:
            result = outcome.get((m.op, m.variant, m.shape["name"]))
            if result is not None and not result.passed:
                continue
            times, rotation, per_sample = time_on_cpu(m, repeats, llc)
            backend = registry.variant(m.op, m.variant).backend
            verdict = (
                {"reference": True}
                if result is None
                else {"passed": True, "worst_ratio": result.worst_ratio, "seed": result.seed}
            )
            fields = gpu_check.receipt_fields(
                m, times, copy_median, rotation, verdict, timing=TIMING_CPU,
                extra_config={
                    "device": "cpu", "backend": backend, "comparable": backend != "triton",
                    "interpreted": backend == "triton", "preset": preset_name, "threads": threads,
                    "calls_per_sample": per_sample, "last_level_cache_bytes": llc,
                },
            )  # fmt: skip
            if backend == "triton":
                notes = (
                    "Triton interpreter on the CPU (TRITON_INTERPRET=1): checked for equivalence, timing "
                    "not comparable with anything"
                )
            else:
                working_set = rotation * m.bytes_per_call
                where = "fits in" if working_set <= llc else "exceeds"
                notes = (
                    f"plain PyTorch on the CPU at the {preset_name} preset's shapes; not comparable with GPU "
                    f"numbers; working set {working_set:,} B {where} the last-level cache ({llc:,} B)"
                )
            write_receipt(
                "kernels", m.name, **fields, notes=notes, command=command, results_dir=Path(results)
            )
    return len(failed)


@click.command("kernels")
@synthetic_option(
    "Kernel shapes of this synthetic model. Default: full (Kimi-Linear-48B) on a GPU, tiny on the CPU "
    "(the interpreter takes about a second per call at small)."
)
@click.option(
    "--preset", "legacy_preset", type=click.Choice(list(PRESETS)), hidden=True, deprecated="use --synthetic"
)
@count_option(
    "--group-size", default=32, minimum=16, help="INT4/INT8 quantisation group size of the packed weights."
)
@click.option(
    "--batches", default=None, help="Batch sizes, comma-separated. Default: 1,8 on a GPU, 1 on the CPU."
)
@click.option("--ops", default=None, help="Operations, comma-separated (default: all).")
@count_option("--repeats", default=5, help="Timed samples (CPU).")
@threads_option("torch")
@click.option(
    "--device",
    type=click.Choice(["cpu", "cuda"]),
    default=None,
    help="Where the kernels run. Default: cuda when available.",
)
@count_option(
    "--copy-mib",
    default=256,
    help="CPU: size of each copy-bandwidth buffer (three are rotated; far above the cache by default).",
)
@results_option
@click.option("--no-regenerate", is_flag=True, help="Write receipts only; skip RESULTS.md and figures.")
def kernels_command(
    synthetic,
    legacy_preset,
    group_size,
    batches,
    ops,
    repeats,
    threads,
    copy_mib,
    device,
    results,
    no_regenerate,
) -> None:
    """Every kernel variant against its reference: equivalence, time, achieved GB/s and % of copy bandwidth."""
    preset_name = synthetic or legacy_preset
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    op_list = [o.strip() for o in ops.split(",") if o.strip()] if ops else None
    known = {op.name for op in registry.operations()}
    if op_list is not None and (unknown := sorted(set(op_list) - known)):
        raise click.BadParameter(
            f"unknown operations {unknown}; known: {', '.join(sorted(known))}", param_hint="--ops"
        )
    command = [sys.executable, "-m", "runners", *sys.argv[1:]]
    if device == "cuda":
        checks, timed = gpu_check.plan(
            preset(preset_name or "full"),
            group_size,
            tuple(positive_ints(batches or "1,8")),
            op_list,
            references=True,
        )
        code = gpu_check.run(results, checks, timed, command=command)
        if code:
            raise click.ClickException("gpu_check failed (see above)")
    else:
        spec = {
            "preset_name": preset_name or "tiny", "group": group_size, "batches": positive_ints(batches or "1"),
            "ops": op_list, "repeats": repeats, "threads": threads or all_cores(), "copy_mib": copy_mib, "results": str(results),
            "command": command,
        }  # fmt: skip
        failed = measure_cpu(**spec) if triton_unavailable("cpu") is None else _in_interpreter(spec)
        if failed:
            raise click.ClickException(
                "equivalence check(s) failed (listed above); those variants were not timed"
            )
    if not no_regenerate:
        regenerate(results)


EXIT_NOT_EQUIVALENT = 3


def _in_interpreter(spec: dict) -> bool:
    """Run measure_cpu in a child process started with TRITON_INTERPRET=1 (set before triton's import);
    True when an equivalence check failed there."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-m", "runners.kernels", json.dumps(spec)], env=env)
    if proc.returncode not in (0, EXIT_NOT_EQUIVALENT):
        raise click.ClickException(f"the interpreter run failed (exit {proc.returncode})")
    return proc.returncode == EXIT_NOT_EQUIVALENT


if __name__ == "__main__":
    try:
        sys.exit(EXIT_NOT_EQUIVALENT if measure_cpu(**json.loads(sys.argv[1])) else 0)
    except click.ClickException as error:
        error.show()
        sys.exit(error.exit_code)
