"""The steps of `python -m runners gpu-check`, each run in its own child process under its own timeout.

    python -m runners.gpu_run STEP WORK [--dry-run]

STEP is one of STEPS; WORK the run's working folder: receipts go to WORK/results/, and the copy bandwidth
measured by the first step (WORK/copy.json) is the denominator of every later receipt. A step that hangs or
dies is killed by its parent without taking the others with it. With `--dry-run` every step runs on the
CPU at the shapes of the `tiny` preset (Triton interpreted), so the sequence is tested without a GPU.

Imports only torch, triton, numpy, safetensors, click and the project's engine/, harness/ and runners/
modules that need nothing more (the GPU image has no orjson, starlette, uvicorn or k3).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

STEPS = ("copy", "kernels", "decode", "prefill", "count")
GROUP = 32
DECODE_CONTEXTS = {"gpu": (17, 1024), "dry": (17,)}
PREFILL_CONTEXT = {"gpu": 32768, "dry": 64}
GEN_TOKENS = {"gpu": 32, "dry": 4}
MEMORY_CAP_GIB = {"gpu": 32.0, "dry": 4.0}


def run_step(step: str, work: Path, *, dry_run: bool) -> int:
    """Run one step; 0 when it passed."""
    device = "cpu" if dry_run else "cuda"
    if not dry_run and not torch.cuda.is_available():
        print(
            "gpu-check needs an NVIDIA GPU (torch.cuda.is_available() is False); try --dry-run",
            file=sys.stderr,
        )
        return 2
    results = work / "results"
    command = [sys.executable, "-m", "runners", "gpu-check", *(["--dry-run"] if dry_run else []), f"[{step}]"]
    if step == "copy":
        return _copy(work, device, command, results)
    if step == "count":  # kernels per decode step, counted on meta (no device time): the fusion goal's figure
        from runners.profile import count_kernels_receipt

        count_kernels_receipt("tiny" if dry_run else "full", "default", 16, results)
        return 0
    copy = json.loads((work / "copy.json").read_text())["copy_gbs"]
    if step == "kernels":
        return _kernels(device, copy, command, results)
    key = "dry" if dry_run else "gpu"
    if step == "decode":
        return _decode(device, DECODE_CONTEXTS[key], GEN_TOKENS[key], copy, results, dry_run)
    if step == "prefill":
        return _decode(device, (PREFILL_CONTEXT[key],), 2, copy, results, dry_run)
    raise SystemExit(f"unknown step {step!r}; known: {', '.join(STEPS)}")


def _copy(work: Path, device: str, command: list[str], results: Path) -> int:
    from runners.gpu_check import measure_copy

    samples = measure_copy(device, command=command, out=results)
    (work / "copy.json").write_text(json.dumps({"copy_gbs": samples}))
    return 0


def _kernels(device: str, copy: list[float], command: list[str], results: Path) -> int:
    import statistics

    from engine.model import preset
    from runners import gpu_check

    if device == "cuda":
        checks, timed = gpu_check.plan(preset("full"), GROUP, (1, 8), None)
        return gpu_check.run(results, checks, timed, command=command, copy_gbs=statistics.median(copy))
    return _kernels_on_cpu(statistics.median(copy), command, results)


def _kernels_on_cpu(copy_gbs: float, command: list[str], results: Path) -> int:
    """The dry run's kernel step: equivalence at the tiny preset, one timed sample of each variant."""
    from engine.kernel_tools.equivalence import check_all
    from engine.kernel_tools.shapes import kimi_shapes
    from engine.model import preset
    from harness.receipt import write_receipt
    from runners import gpu_check
    from runners.kernels import TIMING_CPU, last_level_cache_bytes, time_on_cpu

    _, timed = gpu_check.plan(preset("tiny"), GROUP, (1,), None)
    checks = kimi_shapes(preset("tiny"), group=GROUP, batches=(1,))  # edge shapes are tests/kernels' job
    outcome = {(r.op, r.variant, r.shape["name"]): r for r in check_all(checks, device="cpu")}
    failed = [r for r in outcome.values() if not r.passed]
    for r in failed:
        print(r.describe(), file=sys.stderr)
    llc = last_level_cache_bytes()
    for m in timed:
        result = outcome[(m.op, m.variant, m.shape["name"])]
        if not result.passed:
            continue
        times, rotation, _ = time_on_cpu(m, 1, llc)
        verdict = {"passed": True, "worst_ratio": result.worst_ratio, "seed": result.seed}
        fields = gpu_check.receipt_fields(
            m, times, copy_gbs, rotation, verdict, timing=TIMING_CPU,
            extra_config={"device": "cpu", "comparable": False, "preset": "tiny"},
        )  # fmt: skip
        notes = "gpu-check --dry-run: the GPU sequence at tiny shapes on the CPU; not a measurement"
        write_receipt("kernels", m.name, **fields, notes=notes, command=command, results_dir=results)
    return 1 if failed else 0


def _decode(device, contexts, gen_tokens, copy, results, dry_run) -> int:
    """Decode (or, at one long context, prefill) through the serving runtime on a synthetic INT4 model
    generated and quantised in device memory, one tensor at a time: no checkpoint on disk."""
    from engine.kernels import DEFAULT_SELECTION, named_choices
    from engine.runtime import Engine
    from runners.decode import _measure_all

    key = "dry" if dry_run else "gpu"
    label = "synthetic-tiny" if dry_run else "synthetic-full"
    engine = Engine.load(
        synthetic=label.removeprefix("synthetic-"), seed=0, quant="default",
        kernels=named_choices(DEFAULT_SELECTION), device=device,
        dtype=torch.float32 if dry_run else torch.bfloat16, memory_cap_gib=MEMORY_CAP_GIB[key],
        max_context=max(contexts) + gen_tokens, cuda_graphs=not dry_run, prefix_cache_gib=0, progress=True,
    )  # fmt: skip
    try:
        written = _measure_all(
            engine, label, "fp32" if dry_run else "bf16", [DEFAULT_SELECTION], list(contexts), [1],
            gen_tokens, 1, MEMORY_CAP_GIB[key], 0, torch.get_num_threads(), results, copy=copy,
        )  # fmt: skip
    finally:
        engine.close()
    for path in written:
        print(f"wrote {path.name}")
    return 0


if __name__ == "__main__":
    step_name, work_dir = sys.argv[1], Path(sys.argv[2])
    sys.exit(run_step(step_name, work_dir, dry_run="--dry-run" in sys.argv[3:]))
