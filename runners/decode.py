"""`python -m runners decode`: engine decode and prefill throughput against the bandwidth roofline.

Measured through the serving runtime (`engine.runtime.Engine`): the same memory plan, cache pool, chunked
prefill and static-buffer decode runner that `kimi-engine serve` uses, so on a GPU every decoded token is
one CUDA-graph replay. For each (context length, batch): prefill a seeded random prompt and sample the
first token (TTFT), then decode greedily, timing every token through the runtime's per-token hook;
repeated. One receipt per (model, kernel selection, context, batch), holding the raw per-token times,
tokens/s per repeat, TTFT, the measured copy bandwidth, the bytes a step must read (counted from the loaded
tensors) and the fraction of the roofline reached. With `--quant PLAN` (or an INT4 artifact as
`--weights`) the packed weights run through the kernel registry; each `--kernels` selection is measured on
the same model, and the receipt records the variant actually bound for every operation and whether CUDA
graphs were replayed. Method: docs/METHODS.md.
"""

from __future__ import annotations

import itertools
import statistics
import time
from pathlib import Path

import click
import torch

from common.click_options import count_option, text_option
from common.memory_cap import MemoryCap
from engine.cli_options import (
    NO_QUANT,
    cuda_graphs_option,
    device_option,
    dtype_option,
    memory_cap_option,
    prefill_chunk_option,
    quant_option,
    resolve_device,
    resolve_dtype,
    resolve_memory_cap,
    synthetic_option,
)
from engine.kernels import DEFAULT_SELECTION, KernelSelectionError, KernelUnavailable, named_choices, resolve
from engine.model import SamplingParams, SequenceCache
from engine.quant.manifest import MANIFEST_NAME
from engine.runtime import LOAD_ERRORS, Engine
from engine.runtime.compiled import step_option
from harness.receipt import write_receipt
from runners.bandwidth import copy_bandwidth_gbs
from runners.options import positive_ints, results_option
from runners.outcome import report
from runners.regenerate import regenerate
from runners.roofline import state_bytes_per_token, weight_bytes_per_token
from runners.threads import apply_threads, threads_option

WARMUP_TOKENS = 4  # decoded by the untimed warm-up repeat
GREEDY = SamplingParams(temperature=0.0)


@torch.inference_mode()
def measure(
    engine: Engine, context: int, batch: int, gen_tokens: int, *, repeats: int, seed: int
) -> dict[str, list[float]]:
    """Time the engine on `batch` seeded random prompts of `context` tokens: one untimed warm-up repeat, then
    `repeats` timed ones, each on fresh prompts and admitted for the same `gen_tokens + 1` new tokens (so
    they take the same cache size, whose CUDA graph the warm-up captured). Per repeat:

    - `ttft_ms`: `engine.prefill` (every chunk) plus the first token sampled from its logits and on the host;
    - `decode_ms`: each of the next `gen_tokens` tokens, from the previous token on the host to this one
      (one decode step, i.e. one graph replay on a GPU, greedy sampling, the copy to the host);
    - `decode_tok_s` = batch × gen_tokens / their sum, `prefill_tok_s` = batch × context / TTFT;
    - `raw_decode_tok_s`: right after, the same prompts through the model's bare eager `decode_step` loop,
      so a receipt shows what the runtime around the step costs or saves.

    The prefix cache must be off: a hit would skip the prefill being timed.
    """
    if engine.prefix_cache is not None:
        raise ValueError("measure needs an engine without a prefix cache (prefix_cache_gib=0)")
    generator = torch.Generator().manual_seed(seed)
    vocab = engine.model.config.vocab_size
    prompts = lambda: torch.randint(0, vocab, (batch, context), generator=generator).tolist()
    _repeat(engine, prompts(), gen_tokens, min(gen_tokens, WARMUP_TOKENS))
    capacity = engine.pool.capacity_for(context + gen_tokens)
    samples: dict[str, list[float]] = {}
    for _ in range(repeats):
        chosen = prompts()
        for key, values in _repeat(engine, chosen, gen_tokens, gen_tokens).items():
            samples.setdefault(key, []).extend(values)
        raw = raw_decode_tok_s(engine.model, chosen, gen_tokens, capacity, engine.plan.prefill_chunk)
        samples.setdefault("raw_decode_tok_s", []).append(raw)
    return samples


def raw_decode_tok_s(model, prompts: list[list[int]], gen_tokens: int, capacity: int, chunk: int) -> float:
    """The baseline the runtime must not fall behind: the model's own eager `decode_step` loop, greedy, each
    token to the host, on a cache of the capacity the engine gave the same prompts. Tokens/s."""
    cache = model.new_cache(capacity, batch_size=len(prompts))
    ids = torch.tensor(prompts, device=model.device)
    for begin in range(0, ids.shape[1], chunk):
        logits = model.prefill(ids[:, begin : begin + chunk], cache)
    tokens = logits.argmax(-1)
    tokens.tolist()
    start = time.perf_counter()
    for _ in range(gen_tokens):
        tokens = model.decode_step(tokens, cache).argmax(-1)
        tokens.tolist()
    return len(prompts) * gen_tokens / (time.perf_counter() - start)


def _repeat(engine: Engine, prompts: list[list[int]], gen_tokens: int, steps: int) -> dict[str, list[float]]:
    """Prefill, then the first token and `steps` decoded ones, stamped as each reaches the host."""
    stamps: list[float] = []
    if engine.device.type == "cuda":
        torch.cuda.synchronize(engine.device)
    start = time.perf_counter()
    seq = engine.prefill(prompts, max_new_tokens=gen_tokens + 1)
    try:
        engine.decode(seq, steps + 1, GREEDY, on_token=lambda i, ids: stamps.append(time.perf_counter()))
    finally:
        engine.release(seq)
    ttft = stamps[0] - start
    step_s = [later - earlier for earlier, later in itertools.pairwise(stamps)]
    batch, context = len(prompts), len(prompts[0])
    return {
        "ttft_ms": [ttft * 1e3],
        "prefill_tok_s": [batch * context / ttft],
        "decode_ms": [s * 1e3 for s in step_s],
        "decode_tok_s": [batch * len(step_s) / sum(step_s)],
    }


UNITS = {
    "ttft_ms": "ms",
    "prefill_tok_s": "tok/s",
    "decode_ms": "ms/step",
    "decode_tok_s": "tok/s",
    "raw_decode_tok_s": "tok/s",
    "engine_over_raw_decode": "ratio",
    "copy_gbs": "GB/s",
    "bytes_per_step": "B",
    "roofline_tok_s": "tok/s",
    "fraction_of_roofline": "fraction",
}


def step_method(graphs: bool, compiled: bool) -> str:
    """How a decode step runs, in words (receipts' method strings)."""
    step = "Inductor-compiled static-buffer step" if compiled else "eager static-buffer step"
    return f"{step}, one CUDA-graph replay per token" if graphs else step


@click.command("decode")
@synthetic_option(
    "Synthetic model (no download). Default: small on the CPU, full on a GPU, unless --weights."
)
@click.option(
    "--weights",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="Measure this checkpoint or INT4 artifact (from `kimi-engine quantize`) instead of a synthetic model.",
)
@device_option()
@dtype_option(what="Weight (and activation) dtype")
@click.option(
    "--contexts",
    default=None,
    help="Prompt lengths, comma-separated. Default: 17,256,1024 on the CPU; 17,1024,8192,32768 on a GPU.",
)
@text_option("--batch", "batches", default="1", help="Batch sizes, comma-separated.")
@click.option(
    "--gen-tokens",
    type=click.IntRange(2),
    default=None,
    help="Decode steps timed per repeat. Default: 32 on the CPU, 64 on a GPU.",
)
@count_option("--repeats", default=3, help="Timed generations per configuration (after one untimed warm-up).")
@quant_option(
    "Quantise the synthetic model in memory with this plan (docs/INT4.md) and run it through the kernel "
    f"registry. Default: {NO_QUANT} on the CPU, default on a GPU. An artifact given as --weights has its own.",
)
@click.option(
    "--kernels",
    "kernel_selections",
    default=DEFAULT_SELECTION,
    show_default=True,
    help="Kernel selections to compare on the same quantised model, comma-separated: 'default' (KIMI_KERNELS, "
    "then the shipped defaults) or a variant name such as 'reference' or 'triton' (used for every "
    "operation that has it). Needs quantised weights.",
)
@memory_cap_option()
@prefill_chunk_option
@cuda_graphs_option
@step_option
@threads_option("torch")
@click.option("--seed", default=0, show_default=True, help="Seed of the synthetic weights and the prompts.")
@results_option
@click.option("--no-regenerate", is_flag=True, help="Write receipts only; skip RESULTS.md and figures.")
def decode_command(synthetic, weights, device, dtype, contexts, batches, gen_tokens, repeats, quant,
                   kernel_selections, memory_cap_gib, prefill_chunk, cuda_graphs, step, threads, seed, results,
                   no_regenerate) -> None:  # fmt: skip
    """Decode tokens/s and TTFT per context length, through the serving runtime, with the bandwidth
    roofline, as receipts."""
    device = resolve_device(device)
    on_gpu = device.startswith("cuda")
    if weights is not None and (synthetic is not None or quant is not None):
        raise click.UsageError("--weights measures the directory as it is: drop --synthetic and --quant")
    if weights is None:
        synthetic = synthetic or ("full" if on_gpu else "small")
        quant = quant or ("default" if on_gpu else NO_QUANT)
    dtype_name, torch_dtype = resolve_dtype(dtype, device)
    context_list = positive_ints(contexts or ("17,1024,8192,32768" if on_gpu else "17,256,1024"))
    batch_list = positive_ints(batches)
    gen_tokens = gen_tokens or (64 if on_gpu else 32)
    cap = resolve_memory_cap(memory_cap_gib, device)
    quantised = quant not in (None, NO_QUANT) or (weights is not None and (weights / MANIFEST_NAME).is_file())
    selections = _kernel_selections(kernel_selections, quantised, device)

    threads = apply_threads(threads)
    label = weights.resolve().name if weights is not None else f"synthetic-{synthetic}"
    click.echo(
        f"loading {label} ({dtype_name}, quant {quant or 'from the artifact'}) on {device} ...", err=True
    )
    try:
        engine = Engine.load(
            weights=weights,
            synthetic=synthetic,
            seed=seed,
            quant=None if quant == NO_QUANT else quant,
            kernels=named_choices(selections[0]),
            device=device,
            dtype=torch_dtype,
            memory_cap_gib=cap,
            max_context=max(context_list) + gen_tokens,
            prefill_chunk=prefill_chunk,
            cuda_graphs=cuda_graphs,
            step=step,
            prefix_cache_gib=0,  # every repeat must prefill its prompt
            progress=True,
        )
    except LOAD_ERRORS as e:
        raise click.ClickException(str(e)) from None
    try:
        written = _measure_all(engine, label, dtype_name, selections, context_list, batch_list, gen_tokens,
                               repeats, cap, seed, threads, results)  # fmt: skip
    finally:
        engine.close()
    report(written)
    if not no_regenerate:
        regenerate(results)


def _measure_all(engine, label, dtype_name, selections, contexts, batches, gen_tokens, repeats, cap, seed,
                 threads, results, copy: list[float] | None = None) -> list[Path]:  # fmt: skip
    """One receipt per (selection, context, batch); `copy`: the device's copy bandwidth samples when the
    caller measured them already (gpu-check measures once for every receipt of its run)."""
    source, model, device = engine.source, engine.model, str(engine.device)
    plan = source.plan
    if copy is None:
        click.echo("measuring copy bandwidth ...", err=True)
        copy = copy_bandwidth_gbs(device)
    weights = weight_bytes_per_token(model)
    runs = [(k, c, b) for k in selections for c in contexts for b in batches]
    written = []
    with click.progressbar(
        runs, label="decode", item_show_func=lambda p: p and f"kernels {p[0]} ctx {p[1]} batch {p[2]}"
    ) as bar:
        bound = selections[0]
        variants = engine.kernel_variants
        for selection, context, batch in bar:
            if selection != bound:  # bind once per selection; the modules then call the kernels directly
                variants, bound = engine.use_kernels(named_choices(selection)), selection
            name = f"{label}.{dtype_name}"
            if plan is not None:
                name += f".plan-{plan.name}.kernels-{selection}"
            # Poll RSS as often as the engine's own cap: a 10 ms poller contends for the GIL with a
            # one-thread CPU decode.
            with MemoryCap(cap, device=device, poll_s=0.1) as mem:
                samples = measure(engine, context, batch, gen_tokens, repeats=repeats, seed=seed)
            state = state_bytes_per_token(
                SequenceCache(model.config, context + 1, device="meta", dtype=model.dtype), context
            )
            samples["copy_gbs"] = copy
            # A step reads the weights once for the whole batch and each sequence's state.
            bytes_per_step = sum(weights.values()) + batch * sum(state.values())
            roofline_tok_s = batch * statistics.median(copy) * 1e9 / bytes_per_step
            graphs = engine.pool.graphs_for(batch)
            compiled = engine.pool.compiled_for(batch)
            cache_tokens = engine.pool.capacity_for(context + gen_tokens)
            compile_s = engine.pool.compile_s.get((cache_tokens, batch)) if compiled else None
            if compile_s is not None:
                click.echo(f"\ncompiled the decode step for {cache_tokens} tokens x {batch} in {compile_s:.1f} s",
                           err=True)  # fmt: skip
            written.append(
                write_receipt(
                    "decode",
                    f"{name}.ctx{context}.b{batch}",
                    config={
                        "model": label,
                        "weights": "synthetic weights" if source.synthetic else source.name,
                        "dtype": dtype_name,
                        "device": device,
                        "context": context,
                        "batch": batch,
                        "gen_tokens": gen_tokens,
                        "repeats": repeats,
                        "seed": seed,
                        "quant": NO_QUANT if plan is None else plan.name,
                        "plan": None if plan is None else plan.to_json(),
                        "kernels": None if plan is None else selection,
                        "kernel_variants": variants,
                        "cuda_graphs": graphs,
                        "decode_step": "compiled" if compiled else "eager",
                        "compile_s": compile_s,
                        "threads": threads,
                        "decode": f"engine.runtime.Engine: {step_method(graphs, compiled)}, greedy, timed per "
                        "token on the host",
                        "prefill_chunk": engine.plan.prefill_chunk,
                        "kda_prefill_kernel": engine.kda_kernel,
                        "cache_tokens": cache_tokens,
                        "bytes_per_token_components": weights | state,
                    },
                    samples=samples,
                    units={
                        k: UNITS[k]
                        for k in [
                            *samples,
                            "bytes_per_step",
                            "roofline_tok_s",
                            "fraction_of_roofline",
                            "engine_over_raw_decode",
                        ]
                    },
                    derived={
                        "bytes_per_step": bytes_per_step,
                        "roofline_tok_s": roofline_tok_s,
                        "fraction_of_roofline": statistics.median(samples["decode_tok_s"]) / roofline_tok_s,
                        "engine_over_raw_decode": statistics.median(samples["decode_tok_s"])
                        / statistics.median(samples["raw_decode_tok_s"]),
                    },
                    notes="synthetic weights (decode speed does not depend on weight values)"
                    if source.synthetic
                    else "",
                    memory=mem.report(),
                    results_dir=results,
                )
            )
    return written


def _kernel_selections(text: str, quantised: bool, device: str) -> list[str]:
    """The comma-separated selections, each checked to resolve on the device before anything is loaded."""
    selections = [s.strip() for s in text.split(",") if s.strip()]
    if not selections:
        raise click.BadParameter("name at least one kernel selection", param_hint="--kernels")
    if not quantised and selections != [DEFAULT_SELECTION]:
        raise click.BadParameter(
            "kernel selections apply to quantised weights; add --quant PLAN", param_hint="--kernels"
        )
    for selection in selections:
        try:
            resolve(device, named_choices(selection))
        except (KernelSelectionError, KernelUnavailable) as error:
            raise click.BadParameter(str(error), param_hint="--kernels") from None
    return selections
