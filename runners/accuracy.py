"""`python -m runners accuracy`: quantised against unquantised model, on the same weights and inputs.

The candidate for each (plan, group size) is the unquantised model with every tensor the plan quantises
replaced by its dequantised value (runners/dequantized.py): exactly what INT4/INT8 storage does to the
weights, independent of kernels. One receipt per (plan, group size): KL divergence of the next-token
distributions (mean and max), top-1 agreement, perplexity of both models on a fixed token set and its
change, greedy-sequence identity over N tokens, router expert-set agreement per MoE layer, and the bytes
each tensor class of Kimi-Linear-48B occupies under the plan. Method: docs/METHODS.md.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import click
import torch

from common.click_options import count_option, text_option
from engine.cli_options import device_option, dtype_option, resolve_device, resolve_dtype, synthetic_option
from engine.codec import ROUNDINGS
from engine.model import Checkpoint, KimiLinearForCausalLM, Tokenizer, load_model, preset, sample
from engine.model.checkpoint_spec import checkpoint_tensors
from engine.quant import PLANS, make_plan
from engine.quant.plan import PlanError
from engine.training.cli import HELDOUT_TEXT
from harness.receipt import write_receipt
from runners.dequantized import (
    PlanApplier,
    checkpoint_source,
    fill,
    stored_bytes_by_class,
    synthetic_source,
)
from runners.options import positive_ints, results_option
from runners.outcome import report
from runners.quality_metrics import (
    ForcedPass,
    common_prefix,
    expert_set_agreement,
    forced_pass,
    greedy_tokens,
    kl_per_position,
    top1_agreement,
)
from runners.regenerate import regenerate
from runners.threads import apply_threads, threads_option


def sampled_sequences(model: KimiLinearForCausalLM, count: int, length: int, seed: int) -> torch.Tensor:
    """The default evaluation set: `count` sequences of `length` tokens sampled from the unquantised model
    itself at temperature 1 (seeded CPU generator), each starting from a seeded random token.

    On text drawn from the reference distribution p, a candidate q's expected NLL is H(p) + KL(p ‖ q), so
    the perplexity change is a damage measure that a flatter candidate cannot improve by chance (it could
    on uniform random ids, which no model predicts)."""
    generator = torch.Generator().manual_seed(seed)
    device = model.device
    token = torch.randint(0, model.config.vocab_size, (count,), generator=generator)
    cache = model.new_cache(length, batch_size=count)
    logits = model.prefill(token.view(count, 1).to(device), cache)
    out = [token]
    for _ in range(length - 1):
        token = sample(logits.float().cpu(), 1.0, 1.0, generator)
        out.append(token)
        if len(out) < length:
            logits = model.decode_step(token.to(device), cache)
    return torch.stack(out, dim=1)


def text_sequences(tokenizer: Tokenizer, text: str, count: int, length: int) -> torch.Tensor:
    """The first `count` consecutive `length`-token windows of a text file, tokenised by the checkpoint's tokenizer."""
    ids = tokenizer.encode(text)
    if len(ids) < count * length:
        raise click.BadParameter(
            f"the text has {len(ids)} tokens; {count} sequences of {length} need {count * length}",
            param_hint="--text",
        )
    return torch.tensor(ids[: count * length]).view(count, length)


def compare(reference: ForcedPass, candidate: ForcedPass, ref_greedy, cand_greedy) -> tuple[dict, dict]:
    """Samples (raw, per position / sequence / layer) and derived summary values of one candidate."""
    kl = kl_per_position(reference, candidate)
    top1 = top1_agreement(reference, candidate)
    prefix = common_prefix(ref_greedy, cand_greedy)
    n_greedy = ref_greedy.shape[1]
    layers = sorted(reference.expert_sets)
    routing = {i: expert_set_agreement(reference.expert_sets[i], candidate.expert_sets[i]) for i in layers}
    ppl_ref = math.exp(reference.nll.mean().item())
    ppl_cand = math.exp(candidate.nll.mean().item())
    samples = {
        "kl_nats": kl.flatten().tolist(),
        "top1_agreement": top1.mean(-1).tolist(),
        "nll_reference_nats": reference.nll.mean(-1).tolist(),
        "nll_candidate_nats": candidate.nll.mean(-1).tolist(),
        "greedy_common_prefix_tokens": prefix.tolist(),
    }
    if layers:
        samples["router_exact_set_agreement"] = [routing[i][0] for i in layers]
        samples["router_overlap"] = [routing[i][1] for i in layers]
    derived = {
        "kl_mean_nats": kl.mean().item(),
        "kl_max_nats": kl.max().item(),
        "top1_agreement": top1.mean().item(),
        "perplexity_reference": ppl_ref,
        "perplexity_candidate": ppl_cand,
        "perplexity_delta": ppl_cand - ppl_ref,
        "perplexity_relative_delta": ppl_cand / ppl_ref - 1,
        "greedy_identical_fraction": (prefix == n_greedy).float().mean().item(),
        "greedy_first_divergence_median": statistics.median(prefix.tolist()),
    }
    for i in layers:
        derived[f"router_exact_set_agreement_layer{i}"] = routing[i][0]
        derived[f"router_overlap_layer{i}"] = routing[i][1]
    return samples, derived


UNITS = {
    "kl_nats": "nats",
    "top1_agreement": "fraction",
    "nll_reference_nats": "nats/token",
    "nll_candidate_nats": "nats/token",
    "greedy_common_prefix_tokens": "tokens",
    "router_exact_set_agreement": "fraction",
    "router_overlap": "fraction",
    "kl_mean_nats": "nats",
    "kl_max_nats": "nats",
    "perplexity_delta": "perplexity",
    "greedy_first_divergence_median": "tokens",
    "bits_per_weight": "bits",
}


# Which weights a receipt measured: random weights say nothing about a real model's quantisation damage
# (no logit margins), so their numbers are a stress test, reported apart from trained/real weights.
WEIGHTS_LABELS = {"random": "synthetic weights", "trained": "trained weights", "real": "real weights"}
WEIGHTS_NOTES = {
    "random": "stress test: synthetic weights (random values, not a trained model)",
    "trained": "trained weights (kimi-engine train: see the checkpoint's training.json)",
    "real": "real weights",
}


def weights_kind(checkpoint: Checkpoint | None) -> str:
    """ "random" (in-memory or `kimi-engine synth`), "trained" (`kimi-engine train`) or "real"."""
    if checkpoint is None:
        return "random"
    return {"synthetic": "random"}.get(checkpoint.weights_kind, checkpoint.weights_kind)


def bits_per_weight(config, plan) -> float:
    """Stored bits per parameter of the measured model's checkpoint under `plan` (every tensor counted)."""
    params = sum(spec.numel for spec in checkpoint_tensors(config))
    return 8 * sum(stored_bytes_by_class(config, plan).values()) / params


def _plans(names: str, groups: list[int], rounding: str | None) -> list:
    chosen = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in chosen if n not in PLANS]
    if unknown or not chosen:
        raise click.BadParameter(
            f"unknown plan(s) {unknown}; available: {', '.join(PLANS)}", param_hint="--plans"
        )
    try:
        return [make_plan(n, group_size=g, rounding=rounding) for n in chosen for g in groups]
    except PlanError as e:
        raise click.BadParameter(str(e), param_hint="--groups") from None


def plan_label(plan) -> str:
    """The plan's name, with its rounding when that is not the named plan's own."""
    own = PLANS[plan.name].rounding
    return plan.name if plan.rounding == own else f"{plan.name}.{plan.rounding}"


def _model(weights: Path | None, synthetic: str, device: str, dtype: torch.dtype, seed: int):
    """The unquantised model, its weight source, and the HF config dict."""
    if weights is not None:
        checkpoint = Checkpoint.open(weights)
        model = load_model(weights, device=device, dtype=dtype, progress=True)
        return model, checkpoint_source(checkpoint, device), checkpoint
    with torch.device("meta"):
        model = KimiLinearForCausalLM(preset(synthetic), dtype=dtype)
    model = model.to_empty(device=device).eval()
    source = synthetic_source(seed, device)
    fill(model, source)
    return model, source, None


@click.command("accuracy")
@synthetic_option(
    "Synthetic model (weights generated in memory from --seed) when --weights is not given.",
    choices=("tiny", "small", "wide"),
    default="small",
)
@click.option(
    "--weights",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="A checkpoint directory (real or `kimi-engine synth`) instead of an in-memory synthetic model.",
)
@click.option(
    "--plans", default=",".join(PLANS), show_default=True, help="Quantisation plans, comma-separated."
)
@text_option("--groups", default="32,64,128", help="Group sizes, comma-separated.")
@click.option(
    "--rounding",
    type=click.Choice(ROUNDINGS),
    default=None,
    help="How group scales are chosen, for every plan (engine/codec.py). Default: each plan's own; another "
    "rounding is named in the receipt (model.plan.rounding.gG).",
)
@count_option("--sequences", default=64, help="Evaluation sequences.")
@count_option("--seq-len", default=128, minimum=2, help="Tokens per sequence.")
@click.option(
    "--text",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Evaluate on this text (tokenised with the checkpoint's tokenizer). Default: the checkpoint's "
    "heldout.txt when it has one (trained checkpoints), else text sampled from the unquantised model.",
)
@count_option(
    "--prompts",
    default=4,
    help="Greedy prompts: the first --prompt-len tokens of the first evaluation sequences.",
)
@count_option("--prompt-len", default=16, help="Prompt tokens before the greedy continuation is compared.")
@count_option(
    "--greedy-tokens",
    "greedy_tokens_n",
    default=32,
    help="Greedy tokens generated per prompt, compared token for token.",
)
@device_option()
@dtype_option(
    default="fp32", what="Model dtype (fp32 holds dequantised values exactly; bf16 rounds them once more)"
)
@threads_option("torch")
@click.option(
    "--seed", default=0, show_default=True, help="Seed of the synthetic weights and the token sets."
)
@results_option
@click.option("--no-regenerate", is_flag=True, help="Write receipts only; skip RESULTS.md and figures.")
def accuracy_command(synthetic, weights, plans, groups, rounding, sequences, seq_len, text, prompts, prompt_len,
                     greedy_tokens_n, device, dtype, threads, seed, results, no_regenerate) -> None:  # fmt: skip
    """Quantised against unquantised model: KL, top-1, perplexity, greedy identity, router agreement."""
    device = resolve_device(device)
    candidates = _plans(plans, positive_ints(groups), rounding)
    if prompts > sequences or prompt_len >= seq_len:
        raise click.BadParameter(
            f"greedy prompts are prefixes of the evaluation sequences: need --prompts <= --sequences "
            f"({sequences}) and --prompt-len < --seq-len ({seq_len})",
            param_hint="--prompts/--prompt-len",
        )
    if text is not None and weights is None:
        raise click.BadParameter(
            "--text needs --weights (a checkpoint with a tokenizer)", param_hint="--text"
        )
    threads = apply_threads(threads)
    label = weights.name if weights is not None else f"synthetic-{synthetic}"
    dtype, torch_dtype = resolve_dtype(dtype, device)
    click.echo(f"building {label} ({dtype}) on {device} ...", err=True)
    model, source, checkpoint = _model(weights, synthetic, device, torch_dtype, seed)
    applier = PlanApplier(model, source)
    try:  # refuse a group size that does not fit the model before measuring anything
        for plan in candidates:
            applier.check(plan)
    except PlanError as e:
        raise click.BadParameter(str(e), param_hint="--groups") from None
    kind = weights_kind(checkpoint)
    weights_sha256 = checkpoint.weights_sha256() if checkpoint is not None else None
    if text is None and weights is not None and (weights / HELDOUT_TEXT).exists():
        text = weights / HELDOUT_TEXT
    if text is not None:
        eval_ids = text_sequences(Tokenizer.from_dir(weights), text.read_text(), sequences, seq_len)
        eval_set = f"text {text.name}: first {sequences} windows of {seq_len} tokens"
    else:
        with torch.inference_mode():
            eval_ids = sampled_sequences(model, sequences, seq_len, seed)
        eval_set = f"{sequences} x {seq_len} tokens sampled from the unquantised model (T=1, seed {seed})"
    # Greedy prompts: the first tokens of the evaluation sequences.
    prompt_ids = eval_ids[:prompts, :prompt_len]

    written = []
    steps = [None, *candidates]
    with click.progressbar(
        steps, label="accuracy", item_show_func=lambda p: p and f"{plan_label(p)} g{p.group_size}"
    ) as bar:
        for plan in bar:
            counts = applier.apply(plan)
            run = forced_pass(model, eval_ids.to(device))
            greedy = greedy_tokens(model, prompt_ids.to(device), greedy_tokens_n)
            if plan is None:
                reference, ref_greedy = run, greedy
                continue
            samples, derived = compare(reference, run, ref_greedy, greedy)
            bytes_full = stored_bytes_by_class(preset("full"), plan)
            derived |= {f"full_weight_bytes_{k}": v for k, v in bytes_full.items()}
            derived["bits_per_weight"] = bits_per_weight(model.config, plan)
            notes = [
                WEIGHTS_NOTES[kind],
                "candidate = dequantised weights (exact storage damage, no kernels)",
            ]
            if text is None:
                notes.append("evaluation text sampled from the unquantised model")
            written.append(
                write_receipt(
                    "accuracy",
                    f"{label}.{plan_label(plan)}.g{plan.group_size}",
                    config={
                        "model": label,
                        "weights": WEIGHTS_LABELS[kind],
                        "weights_kind": kind,
                        "weight_source": source.describe,
                        "weights_sha256": weights_sha256,
                        "dtype": dtype,
                        "device": device,
                        "plan": plan.to_json() | {"label": plan_label(plan)},
                        "tensors_per_precision": counts,
                        "eval_set": eval_set,
                        "sequences": sequences,
                        "seq_len": seq_len,
                        "prompts": prompts,
                        "prompt_len": prompt_len,
                        "greedy_tokens": greedy_tokens_n,
                        "seed": seed,
                        "threads": threads,
                        "router_layers": sorted(reference.expert_sets),
                        "full_config": "Kimi-Linear-48B-A3B (engine.model.preset('full')) for full_weight_bytes_*",
                    },
                    samples=samples,
                    units={k: UNITS[k] for k in samples}
                    | {k: "B" for k in derived if "weight_bytes_" in k}
                    | {k: UNITS[k] for k in derived if k in UNITS},
                    derived=derived,
                    notes="; ".join(notes),
                    results_dir=results,
                )
            )
    report(written)
    if not no_regenerate:
        regenerate(results)
