"""`python -m runners profile`: where a decode step's time goes, by model component.

Eager decode steps (no CUDA graph: a graph hides its parts) on a prefilled prompt, with timing hooks on
each component module: KDA attention, MLA attention, the MoE router, the routed experts, the shared expert,
the dense MLP and the LM head; `other` is the rest of the step (embedding, norms, residuals, sampling).
On a GPU each hook synchronises the device, which slows the step: the split, not the total, is the point.
One receipt per run, one sample per step and component. Method: docs/METHODS.md.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import click
import torch

from common.click_options import count_option
from engine.cli_options import (
    NO_QUANT,
    device_option,
    dtype_option,
    kda_kernel_option,
    quant_option,
    quant_plan,
    resolve_device,
    resolve_dtype,
    synthetic_option,
)
from engine.runtime import Engine
from harness.receipt import write_receipt
from runners.options import results_option
from runners.outcome import report
from runners.regenerate import regenerate
from runners.threads import apply_threads, threads_option

COMPONENTS = ("kda_attention", "mla_attention", "moe_router", "moe_experts", "shared_expert", "dense_mlp",
              "lm_head", "other")  # fmt: skip


def component_modules(model) -> dict[torch.nn.Module, str]:
    """Each timed module and the component it belongs to (children of the MoE block, not the block)."""
    parts: dict[torch.nn.Module, str] = {model.lm_head: "lm_head"}
    for layer in model.model.layers:
        parts[layer.self_attn] = "mla_attention" if layer.is_mla else "kda_attention"
        moe = getattr(layer, "block_sparse_moe", None)
        if moe is None:
            parts[layer.mlp] = "dense_mlp"
            continue
        parts[moe.gate] = "moe_router"
        parts[moe.experts] = "moe_experts"
        if moe.shared_experts is not None:
            parts[moe.shared_experts] = "shared_expert"
    return parts


def _synchronizer(model) -> Callable[[], None]:
    """What waits for the device's queued work: CUDA's synchronize, or nothing on the CPU."""
    return torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)


@contextlib.contextmanager
def component_timers(model) -> Iterator[dict[str, float]]:
    """Timing hooks on each component's entry points while inside (MLA decode enters through `decode`,
    not `forward`): yields the seconds spent per component, which the caller zeroes between passes."""
    sync = _synchronizer(model)
    spent = dict.fromkeys(COMPONENTS, 0.0)

    def timed(method, component):
        def call(*args, **kwargs):
            sync()
            start = time.perf_counter()
            out = method(*args, **kwargs)
            sync()
            spent[component] += time.perf_counter() - start
            return out

        return call

    parts = component_modules(model)
    wrapped = [(m, name) for m in parts for name in ("forward", "decode") if hasattr(m, name)]
    for module, name in wrapped:
        setattr(module, name, timed(getattr(module, name), parts[module]))
    try:
        yield spent
    finally:
        for module, name in wrapped:
            delattr(module, name)


def _timed_passes(model, passes: int, run: Callable[[], None]) -> dict[str, list[float]]:
    """Milliseconds per component of `passes` calls of `run` after one untimed (first-call costs);
    `other` is each pass's time outside the components."""
    sync = _synchronizer(model)
    samples: dict[str, list[float]] = {c: [] for c in COMPONENTS}
    with component_timers(model) as spent:
        for n in range(passes + 1):
            spent.update(dict.fromkeys(COMPONENTS, 0.0))
            sync()
            begin = time.perf_counter()
            run()
            sync()
            total = time.perf_counter() - begin
            if n == 0:
                continue
            spent["other"] = total - sum(v for k, v in spent.items() if k != "other")
            for component in COMPONENTS:
                samples[component].append(spent[component] * 1e3)
    return {k: v for k, v in samples.items() if any(v)}


@torch.inference_mode()
def profile_steps(engine: Engine, context: int, steps: int, seed: int) -> dict[str, list[float]]:
    """Milliseconds per component for each of `steps` eager decode steps after a `context`-token prompt."""
    model = engine.model
    generator = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, model.config.vocab_size, (1, context), generator=generator).to(model.device)
    cache = model.new_cache(context + steps + 1)
    token = model.prefill(prompt, cache).argmax(-1)

    def step() -> None:
        nonlocal token
        token = model.decode_step(token, cache).argmax(-1)

    return _timed_passes(model, steps, step)


@torch.inference_mode()
def profile_prefills(engine: Engine, tokens: int, repeats: int, seed: int) -> dict[str, list[float]]:
    """Milliseconds per component for each of `repeats` prefills of a fresh `tokens`-token prompt into an
    empty cache (one forward pass, as the engine runs a prompt of up to one prefill chunk)."""
    model = engine.model
    generator = torch.Generator().manual_seed(seed)

    def prefill() -> None:
        prompt = torch.randint(0, model.config.vocab_size, (1, tokens), generator=generator).to(model.device)
        model.prefill(prompt, model.new_cache(tokens + 1))

    return _timed_passes(model, repeats, prefill)


@click.command("profile")
@synthetic_option("Synthetic model (no download). Default: small on the CPU, full on a GPU.")
@device_option()
@dtype_option(what="Weight (and activation) dtype")
@quant_option("Quantise the synthetic model in memory with this plan (docs/INT4.md). Default: none on the CPU, "
              "default on a GPU.")  # fmt: skip
@count_option("--context", default=256, help="Tokens in the cache when the decode steps are profiled.")
@count_option("--steps", default=16, help="Profiled decode steps (with --prefill: profiled prefills).")
@click.option(
    "--prefill",
    "prefill_tokens",
    type=click.IntRange(min=1),
    default=None,
    help="Instead of decode steps: prefills of a fresh prompt of this many tokens (one forward pass each), "
    "split the same way; a profile-prefill receipt. --context is then unused.",
)
@kda_kernel_option
@threads_option("torch")
@click.option("--seed", default=0, show_default=True, help="Seed of the synthetic weights and the prompt.")
@click.option(
    "--count-kernels",
    is_flag=True,
    help="Instead of timing: count the kernels one decode step launches with the CUDA kernels (aten ops + "
    "Triton launches, by name) on the meta device, at batches 1 and 8 (no GPU, no weights; --synthetic "
    "defaults to full, --quant to default); a kernel-count receipt. --context sets the cache length.",
)
@results_option
@click.option("--no-regenerate", is_flag=True, help="Write the receipt only; skip RESULTS.md and figures.")
def profile_command(synthetic, device, dtype, quant, context, steps, prefill_tokens, kda_kernel, threads, seed,
                    count_kernels, results, no_regenerate):  # fmt: skip
    """Split of a decode step's time by model component, as a receipt (the decode time split figure);
    with --prefill, of a prompt's prefill."""
    if count_kernels:
        if quant == NO_QUANT:
            raise click.UsageError(
                "--count-kernels counts a quantisation plan's kernels: give a plan, not none"
            )
        report([count_kernels_receipt(synthetic or "full", quant or "default", context, results)])
        return
    device = resolve_device(device)
    on_gpu = device.startswith("cuda")
    synthetic = synthetic or ("full" if on_gpu else "small")
    dtype, torch_dtype = resolve_dtype(dtype, device)
    quant = quant_plan(quant) if quant is not None else ("default" if on_gpu else None)
    threads = apply_threads(threads)
    click.echo(
        f"building synthetic '{synthetic}' ({dtype}, quant {quant or 'none'}) on {device} ...", err=True
    )
    max_context = (prefill_tokens or context + steps) + 1
    engine = Engine.load(synthetic=synthetic, seed=seed, quant=quant, device=device, dtype=torch_dtype,
                         max_context=max_context, cuda_graphs=False, prefix_cache_gib=0,
                         kda_kernel=kda_kernel)  # fmt: skip
    try:
        if prefill_tokens is None:
            samples = profile_steps(engine, context, steps, seed)
        else:
            samples = profile_prefills(engine, prefill_tokens, steps, seed)
    finally:
        engine.close()
    plan = f"{'.plan-' + quant if quant else ''}"
    if prefill_tokens is None:
        suite, name, unit = "profile", f"synthetic-{synthetic}.{dtype}{plan}.ctx{context}", "ms/step"
        what = {
            "context": context,
            "steps": steps,
            "method": "eager decode_step with timing hooks per component",
        }
    else:
        suite, name, unit = (
            "profile-prefill",
            f"synthetic-{synthetic}.{dtype}{plan}.p{prefill_tokens}.kda-{engine.kda_kernel}",
            "ms/prefill",
        )
        what = {
            "prompt_tokens": prefill_tokens,
            "prefills": steps,
            "kda_prefill_kernel": engine.kda_kernel,
            "method": "model.prefill of a fresh prompt into an empty cache, timing hooks per component",
        }
    path = write_receipt(
        suite,
        name,
        config={"model": f"synthetic-{synthetic}", "weights": "synthetic weights", "dtype": dtype,
                "quant": quant, "device": device, "threads": threads, "seed": seed, **what},
        samples=samples,
        units=dict.fromkeys(samples, unit),
        notes="synthetic weights; hooks synchronise the device, so the split matters, not the total",
        results_dir=results,
    )  # fmt: skip
    report([path])
    if not no_regenerate:
        regenerate(results)


COUNT_BATCHES = (1, 8)


def count_kernels_receipt(synthetic: str, quant: str, context: int, results) -> Path:
    """Kernels per decode step of a synthetic preset with the CUDA kernels, counted on meta (a receipt)."""
    from engine.kernel_tools.aot import SM_COUNTS
    from engine.kernel_tools.kernel_count import count_decode_kernels
    from engine.model import preset
    from engine.quant.plan import make_plan

    samples, breakdown = {}, {}
    for batch in COUNT_BATCHES:
        counted = count_decode_kernels(preset(synthetic), make_plan(quant), batch=batch, context=context)
        samples[f"kernels_b{batch}"] = [counted.total]
        samples[f"aten_kernels_b{batch}"] = [sum(counted.aten.values())]
        samples[f"triton_launches_b{batch}"] = [sum(counted.triton.values())]
        breakdown[f"b{batch}"] = {"aten": counted.aten, "triton": counted.triton}
    return write_receipt(
        "kernel-count",
        f"synthetic-{synthetic}.plan-{quant}.ctx{context}",
        config={"model": f"synthetic-{synthetic}", "quant": quant, "context": context, "device": "meta",
                "kernels": "CUDA shipped defaults", "sm_count": SM_COUNTS[90], "batches": list(COUNT_BATCHES),
                "method": "one eager decode_tensors step on meta: aten ops that launch a kernel (views and "
                          "allocations excluded) + intercepted Triton launches",
                "breakdown": breakdown},
        samples=samples,
        units=dict.fromkeys(samples, "kernels/step"),
        notes="counted, not timed: exact for the code counted; Inductor or CUDA graphs change launches, not ops",
        results_dir=results,
    )  # fmt: skip
