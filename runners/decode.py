"""`python -m runners decode`: engine decode and prefill throughput against the bandwidth roofline.

For each (context length, batch): prefill a seeded random prompt (timed: time to first token), then
decode greedily, timing every step; repeated. One receipt per (model, kernel selection, context, batch),
holding the raw per-token step times, tokens/s per repeat, TTFT, the measured copy bandwidth, the bytes a
step must read (counted from the loaded tensors) and the fraction of the roofline reached. With
`--quant PLAN` the synthetic model is quantised in memory and its packed weights run through the kernel
registry; each `--kernels` selection is measured on the same model, and the receipt records the variant
actually bound for every operation. Method: docs/METHODS.md.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import click
import torch

from engine.kernels import DEFAULT_SELECTION, KernelSelectionError, KernelUnavailable, named_choices, resolve
from engine.model import KimiLinearForCausalLM, preset
from engine.progress import stderr_progress
from engine.quant import PLANS, make_plan, synthetic_quantized_model, use_kernels
from engine.synth import init_synthetic_weights
from harness.caps import MemoryCap
from harness.receipt import RESULTS_DIR, write_receipt
from runners.bandwidth import copy_bandwidth_gbs
from runners.regenerate import regenerate
from runners.roofline import state_bytes_per_token, weight_bytes_per_token

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}
NO_QUANT = "none"


def build_synthetic(name: str, device: str, dtype: torch.dtype, seed: int) -> KimiLinearForCausalLM:
    """The synthetic model, built on `meta` and materialised on the device (no checkpoint on disk)."""
    with torch.device("meta"):
        model = KimiLinearForCausalLM(preset(name), dtype=dtype)
    model = model.to_empty(device=device)
    init_synthetic_weights(model, seed)
    return model.eval()


def build_synthetic_quantized(
    name: str, device: str, dtype: torch.dtype, seed: int, plan: str
) -> KimiLinearForCausalLM:
    """The synthetic model quantised by `plan` on the device, tensor by tensor (the dense model never
    exists, so the full shapes fit); kernels are bound later, per selection."""
    return synthetic_quantized_model(
        preset(name), make_plan(plan), device=device, dtype=dtype, seed=seed, progress=stderr_progress
    )


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


@torch.inference_mode()
def measure(
    model: KimiLinearForCausalLM, context: int, batch: int, gen_tokens: int, device: str, seed: int
) -> dict[str, list[float]]:
    """One repeat: TTFT of a `context`-token prompt, then `gen_tokens` timed greedy decode steps."""
    generator = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, model.config.vocab_size, (batch, context), generator=generator).to(device)
    cache = model.new_cache(context + gen_tokens, batch_size=batch)
    _sync(device)
    start = time.perf_counter()
    logits = model.prefill(prompt, cache)
    token = logits.argmax(-1)
    _sync(device)
    ttft = time.perf_counter() - start
    steps = []
    for _ in range(gen_tokens):
        begin = time.perf_counter()
        token = model.decode_step(token, cache).argmax(-1)
        _sync(device)
        steps.append(time.perf_counter() - begin)
    return {
        "ttft_ms": [ttft * 1e3],
        "prefill_tok_s": [batch * context / ttft],
        "decode_ms": [s * 1e3 for s in steps],
        "decode_tok_s": [batch * len(steps) / sum(steps)],
    }


UNITS = {
    "ttft_ms": "ms",
    "prefill_tok_s": "tok/s",
    "decode_ms": "ms/step",
    "decode_tok_s": "tok/s",
    "copy_gbs": "GB/s",
    "bytes_per_step": "B",
    "roofline_tok_s": "tok/s",
    "fraction_of_roofline": "fraction",
}


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated whole numbers, got {text!r}") from None
    if not values or min(values) < 1:
        raise click.BadParameter(f"expected positive whole numbers, got {text!r}")
    return values


@click.command("decode")
@click.option(
    "--synthetic",
    type=click.Choice(["tiny", "small", "full"]),
    default=None,
    help="Synthetic model (no download). Default: small on the CPU, full on a GPU.",
)
@click.option("--device", default=None, help="cpu or cuda[:N]. Default: cuda when available.")
@click.option(
    "--dtype",
    type=click.Choice(sorted(DTYPES)),
    default=None,
    help="Weight dtype. Default: bf16 on a GPU, fp32 on the CPU (its fastest).",
)
@click.option(
    "--contexts",
    default=None,
    help="Prompt lengths, comma-separated. Default: 17,256,1024 on the CPU; 17,1024,8192,32768 on a GPU.",
)
@click.option("--batch", "batches", default="1", show_default=True, help="Batch sizes, comma-separated.")
@click.option(
    "--gen-tokens",
    type=click.IntRange(2),
    default=None,
    help="Decode steps timed per repeat. Default: 32 on the CPU, 64 on a GPU.",
)
@click.option("--repeats", type=click.IntRange(1), default=3, show_default=True)
@click.option(
    "--quant",
    type=click.Choice([NO_QUANT, *PLANS]),
    default=None,
    help="Quantise the synthetic model in memory with this plan (docs/INT4.md) and run it through the kernel "
    f"registry. Default: {NO_QUANT} on the CPU, default on a GPU.",
)
@click.option(
    "--kernels",
    "kernel_selections",
    default=DEFAULT_SELECTION,
    show_default=True,
    help="Kernel selections to compare on the same quantised model, comma-separated: 'default' (KIMI_KERNELS, "
    "then the shipped defaults) or a variant name such as 'reference' or 'triton' (used for every "
    "operation that has it). Needs --quant.",
)
@click.option(
    "--memory-cap-gib",
    type=float,
    default=None,
    help="Fail a measurement that exceeds this (GPU: allocator cap; CPU: RSS). Default: 32 on a GPU, "
    "16 on the CPU.",
)
@click.option(
    "--threads",
    type=click.IntRange(1),
    default=None,
    help="CPU threads for torch. Default: 1 (small models are dominated by per-op overhead, which "
    "extra threads make worse on a shared machine).",
)
@click.option("--seed", default=0, show_default=True)
@click.option("--results", type=click.Path(path_type=Path), default=RESULTS_DIR, show_default=True)
@click.option("--no-regenerate", is_flag=True, help="Write receipts only; skip RESULTS.md and figures.")
def decode_command(synthetic, device, dtype, contexts, batches, gen_tokens, repeats, quant, kernel_selections,
                   memory_cap_gib, threads, seed, results, no_regenerate) -> None:  # fmt: skip
    """Decode tokens/s and TTFT per context length, with the bandwidth roofline, as receipts."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    on_gpu = device.startswith("cuda")
    if on_gpu and not torch.cuda.is_available():
        raise click.BadParameter("no CUDA device is visible", param_hint="--device")
    synthetic = synthetic or ("full" if on_gpu else "small")
    dtype_name = dtype or ("bf16" if on_gpu else "fp32")
    context_list = _ints(contexts or ("17,1024,8192,32768" if on_gpu else "17,256,1024"))
    batch_list = _ints(batches)
    gen_tokens = gen_tokens or (64 if on_gpu else 32)
    cap = memory_cap_gib if memory_cap_gib is not None else (32.0 if on_gpu else 16.0)
    quant = quant or ("default" if on_gpu else NO_QUANT)
    selections = _kernel_selections(kernel_selections, quant, device)

    if not on_gpu:
        torch.set_num_threads(threads or 1)
    click.echo(f"building synthetic '{synthetic}' ({dtype_name}, quant {quant}) on {device} ...", err=True)
    if quant == NO_QUANT:
        model = build_synthetic(synthetic, device, DTYPES[dtype_name], seed)
    else:
        model = build_synthetic_quantized(synthetic, device, DTYPES[dtype_name], seed, quant)
    click.echo("measuring copy bandwidth ...", err=True)
    copy = copy_bandwidth_gbs(device)
    weights = weight_bytes_per_token(model)

    plan = [(k, c, b) for k in selections for c in context_list for b in batch_list]
    written = []
    with click.progressbar(
        plan, label="decode", item_show_func=lambda p: p and f"kernels {p[0]} ctx {p[1]} batch {p[2]}"
    ) as bar:
        bound = None
        for selection, context, batch in bar:
            if selection != bound:  # bind once per selection; the modules then call the kernels directly
                variants = {} if quant == NO_QUANT else use_kernels(model, named_choices(selection))
                bound = selection
            name = f"synthetic-{synthetic}.{dtype_name}"
            if quant != NO_QUANT:
                name += f".plan-{quant}.kernels-{selection}"
            samples: dict[str, list[float]] = {}
            with MemoryCap(cap, device=device) as mem:
                measure(model, context, batch, min(gen_tokens, 4), device, seed)  # warm-up, untimed
                for r in range(repeats):
                    for key, values in measure(model, context, batch, gen_tokens, device, seed + r).items():
                        samples.setdefault(key, []).extend(values)
                    mem.check()
                state = state_bytes_per_token(model.new_cache(context + 1), context)
            samples["copy_gbs"] = copy
            # A step reads the weights once for the whole batch and each sequence's state.
            bytes_per_step = sum(weights.values()) + batch * sum(state.values())
            roofline_tok_s = batch * statistics.median(copy) * 1e9 / bytes_per_step
            written.append(
                write_receipt(
                    "decode",
                    f"{name}.ctx{context}.b{batch}",
                    config={
                        "model": f"synthetic-{synthetic}",
                        "weights": "synthetic weights",
                        "dtype": dtype_name,
                        "device": device,
                        "context": context,
                        "batch": batch,
                        "gen_tokens": gen_tokens,
                        "repeats": repeats,
                        "seed": seed,
                        "quant": quant,
                        "plan": None if quant == NO_QUANT else make_plan(quant).to_json(),
                        "kernels": None if quant == NO_QUANT else selection,
                        "kernel_variants": variants,
                        "decode": "eager decode_step, greedy argmax",
                        "bytes_per_token_components": weights | state,
                    },  # fmt: skip
                    samples=samples,
                    units={
                        k: UNITS[k]
                        for k in [*samples, "bytes_per_step", "roofline_tok_s", "fraction_of_roofline"]
                    },  # fmt: skip
                    derived={
                        "bytes_per_step": bytes_per_step,
                        "roofline_tok_s": roofline_tok_s,
                        "fraction_of_roofline": statistics.median(samples["decode_tok_s"]) / roofline_tok_s,
                    },
                    notes="synthetic weights (decode speed does not depend on weight values)",
                    memory=mem.report(),
                    results_dir=results,
                )
            )
    for path in written:
        click.echo(f"wrote {path}")
    if not no_regenerate:
        regenerate(results)


def _kernel_selections(text: str, quant: str, device: str) -> list[str]:
    """The comma-separated selections, each checked to resolve on the device before anything is measured."""
    selections = [s.strip() for s in text.split(",") if s.strip()]
    if not selections:
        raise click.BadParameter("name at least one kernel selection", param_hint="--kernels")
    if quant == NO_QUANT and selections != [DEFAULT_SELECTION]:
        raise click.BadParameter(
            "kernel selections apply to a quantised model; add --quant PLAN", param_hint="--kernels"
        )
    for selection in selections:
        try:
            resolve(device, named_choices(selection))
        except (KernelSelectionError, KernelUnavailable) as error:
            raise click.BadParameter(str(error), param_hint="--kernels") from None
    return selections
