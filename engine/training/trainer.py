"""Next-token training of the engine's own Kimi-Linear modules (chunked KDA, MLA, MoE) on the CPU.

- Forward: `KimiLinearForCausalLM.logits`, the same code the engine serves with (KDA through `kda_chunked`,
  which is differentiable: tests/engine/test_training.py checks its gradients against the token-by-token
  recurrence). FP32 throughout; the checkpoint stores the real dtypes (BF16 except the FP32 tensors), and
  the held-out numbers are measured after rounding to them, i.e. on exactly the weights written.
- Router: the sigmoid router's weight is trained by the loss; the score-correction bias is not (it only
  selects experts, so it has no gradient) and is updated the auxiliary-loss-free way (DeepSeek-V3): after
  every step, bias_i += rate * sign(mean load - load_i), load = tokens routed to expert i in that step.
- AdamW (no weight decay on norms, A_log, dt_bias), linear warm-up then cosine decay to `min_lr_ratio` of
  the peak, gradient-norm clipping. Batches are windows at seeded random offsets of the training stream.
- Repeatable for a seed on one machine with a fixed thread count (`--steps`; `--minutes` stops on the
  clock, so its step count depends on load), though not always bit for bit: tiny retrains identically,
  two runs of small at two threads differed in a loss's last bit from step 3 (docs/ENGINE.md).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.model.checkpoint_spec import checkpoint_tensors
from engine.model.loading import parameter_for
from engine.model.model import KimiLinearForCausalLM
from engine.model.moe import Router
from engine.model.presets import PRESETS
from engine.model.tokenizer import Tokenizer
from engine.synth import init_synthetic_weights
from engine.training.corpus import Corpus

# Bump when the training algorithm changes, so cached checkpoints of the old algorithm are not reused.
TRAINER_VERSION = 1
_NO_DECAY = ("norm.weight", "layernorm.weight", "A_log", "dt_bias")


@dataclass(frozen=True)
class Recipe:
    """Everything a trained checkpoint depends on (with the corpus); its hash is the cache key."""

    preset: str
    seed: int
    steps: int | None  # exactly this many optimizer steps, or
    minutes: float | None  # as many as fit in this wall time
    batch_size: int
    seq_len: int
    lr: float
    warmup_steps: int
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    beta2: float = 0.95
    grad_clip: float = 1.0
    bias_update_rate: float = 1e-3
    eval_tokens: int = 32_768

    def key(self, corpus_sha256: str, tokenizer_sha256: str) -> str:
        blob = json.dumps(
            {
                "recipe": dataclasses.asdict(self),
                "corpus": corpus_sha256,
                "tokenizer": tokenizer_sha256,
                "trainer": TRAINER_VERSION,
            },
            sort_keys=True,
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @property
    def seconds(self) -> float:
        """The wall-time budget of a recipe that gives minutes rather than steps."""
        if self.minutes is None:
            raise ValueError("this recipe gives steps, not minutes")
        return self.minutes * 60


# Per-preset defaults (the CLI's --steps/--minutes override the length). Sized for the goals on 2 quiet
# cores: tiny within 5 minutes, small within 30 (their training receipts, `python -m runners training`).
DEFAULT_RECIPES = {
    "tiny": Recipe("tiny", 0, steps=300, minutes=None, batch_size=8, seq_len=128, lr=3e-3, warmup_steps=40),
    "small": Recipe(
        "small", 0, steps=150, minutes=None, batch_size=8, seq_len=128, lr=1.5e-3, warmup_steps=15
    ),
}


def recipe_for(
    preset: str,
    *,
    seed: int,
    steps: int | None = None,
    minutes: float | None = None,
    batch_size: int | None = None,
    seq_len: int | None = None,
    lr: float | None = None,
) -> Recipe:
    """The preset's default recipe with the given fields changed; the warm-up is at most a tenth of a
    step-count run. Without --steps or --minutes, the preset's step count."""
    base = DEFAULT_RECIPES[preset]
    if minutes is not None and steps is not None:
        raise ValueError("give steps or minutes, not both")
    recipe = dataclasses.replace(
        base, seed=seed, steps=None if minutes is not None else (steps or base.steps), minutes=minutes,
        batch_size=batch_size or base.batch_size, seq_len=seq_len or base.seq_len, lr=lr or base.lr,
    )  # fmt: skip
    if recipe.steps is not None:
        recipe = dataclasses.replace(
            recipe, warmup_steps=min(recipe.warmup_steps, max(1, recipe.steps // 10))
        )
    return recipe


def learning_rate(recipe: Recipe, step: int, fraction_done: float) -> float:
    """Linear warm-up over `warmup_steps`, then cosine from the peak to `min_lr_ratio` of it."""
    if step < recipe.warmup_steps:
        return recipe.lr * (step + 1) / recipe.warmup_steps
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, fraction_done)))
    return recipe.lr * (recipe.min_lr_ratio + (1 - recipe.min_lr_ratio) * cosine)


@dataclass
class TrainingRun:
    model: KimiLinearForCausalLM
    steps: int
    tokens: int
    wall_seconds: float
    losses: list[float]  # training loss of every step (nats/token)


def new_model(recipe: Recipe) -> KimiLinearForCausalLM:
    """The starting point: the synthetic initialisation of the seed, router biases at zero."""
    model = KimiLinearForCausalLM(PRESETS[recipe.preset], dtype=torch.float32)
    init_synthetic_weights(model, recipe.seed)
    model.requires_grad_(True)
    for router in routers(model):
        router.e_score_correction_bias.requires_grad_(False)
        router.e_score_correction_bias.data.zero_()
    return model


def routers(model: KimiLinearForCausalLM) -> list[Router]:
    return [m for m in model.modules() if isinstance(m, Router)]


class LoadCounter:
    """Counts the tokens each router sends to each expert while installed (forward hooks)."""

    def __init__(self, model: KimiLinearForCausalLM):
        self.loads: dict[Router, torch.Tensor] = {}
        self._handles = [r.register_forward_hook(self._record) for r in routers(model)]

    def _record(self, router: Router, _inputs, output) -> None:
        ids = output[1].detach().flatten()
        self.loads[router] = torch.bincount(ids, minlength=router.e_score_correction_bias.numel())

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


@torch.no_grad()
def update_router_biases(loads: dict[Router, torch.Tensor], rate: float) -> None:
    """Auxiliary-loss-free balancing: raise the bias of under-loaded experts, lower over-loaded ones."""
    for router, load in loads.items():
        load = load.float()
        router.e_score_correction_bias.add_(rate * torch.sign(load.mean() - load))


def _optimizer(model: KimiLinearForCausalLM, recipe: Recipe) -> torch.optim.AdamW:
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if name.endswith(_NO_DECAY) else decay).append(p)
    groups = [
        {"params": decay, "weight_decay": recipe.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=recipe.lr, betas=(0.9, recipe.beta2), eps=1e-8)


def train(
    recipe: Recipe,
    corpus: Corpus,
    *,
    on_step: Callable[[int, float, float], None] = lambda step, loss, elapsed: None,
) -> TrainingRun:
    """Train from the seed's initialisation; `on_step(step, loss, elapsed_seconds)` after every step."""
    if (recipe.steps is None) == (recipe.minutes is None):
        raise ValueError("a recipe has exactly one of steps and minutes")
    torch.manual_seed(recipe.seed)
    model = new_model(recipe)
    optimizer = _optimizer(model, recipe)
    params = [p for p in model.parameters() if p.requires_grad]
    data = corpus.train_ids
    if data.numel() <= recipe.seq_len + 1:
        raise ValueError(f"the training stream has {data.numel()} tokens, fewer than a window")
    generator = torch.Generator().manual_seed(recipe.seed)
    offsets = torch.arange(recipe.seq_len + 1)
    counter = LoadCounter(model)
    losses: list[float] = []
    start = time.monotonic()
    step = 0
    try:
        while True:
            elapsed = time.monotonic() - start
            if recipe.steps is not None:
                if step >= recipe.steps:
                    break
                fraction = step / recipe.steps
            else:
                if elapsed >= recipe.seconds:
                    break
                fraction = elapsed / recipe.seconds
            starts = torch.randint(
                0, data.numel() - recipe.seq_len - 1, (recipe.batch_size, 1), generator=generator
            )
            window = data[starts + offsets].long()
            logits = model.logits(window[:, :-1])
            loss = F.cross_entropy(logits.float().flatten(0, 1), window[:, 1:].flatten())
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, recipe.grad_clip)
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(recipe, step, fraction)
            optimizer.step()
            update_router_biases(counter.loads, recipe.bias_update_rate)
            step += 1
            losses.append(loss.item())
            on_step(step, losses[-1], time.monotonic() - start)
    finally:
        counter.remove()
    wall = time.monotonic() - start
    model.requires_grad_(False)
    round_to_checkpoint_dtypes(model)
    return TrainingRun(model.eval(), step, step * recipe.batch_size * recipe.seq_len, wall, losses)


@torch.no_grad()
def round_to_checkpoint_dtypes(model: KimiLinearForCausalLM) -> None:
    """Round every parameter through the dtype the checkpoint stores it in, so what is measured is what
    is written."""
    for spec in checkpoint_tensors(model.config):
        p = parameter_for(model, spec.name)
        p.copy_(p.to(spec.dtype))


@torch.no_grad()
def evaluate(
    model: KimiLinearForCausalLM, ids: torch.Tensor, tokenizer: Tokenizer, seq_len: int, max_tokens: int
) -> dict:
    """Held-out perplexity and bits per byte over consecutive windows of `seq_len` predicted tokens from
    the start of `ids`, at most `max_tokens` predictions. Bits per byte counts the UTF-8 bytes of the
    predicted tokens (special tokens: none), so it compares across tokenizers."""
    n_windows = max(1, min(max_tokens // seq_len, (ids.numel() - 1) // seq_len))
    if ids.numel() < seq_len + 1:
        raise ValueError(f"the held-out stream has {ids.numel()} tokens, fewer than a window")
    special = set(tokenizer.special_tokens.values())
    byte_len = torch.tensor(
        [0 if i in special else len(tokenizer.decode_bytes([i])) for i in range(tokenizer.vocab_size)]
    )
    nll, n_bytes = 0.0, 0
    for first in range(0, n_windows, 8):
        rows = [
            ids[w * seq_len : w * seq_len + seq_len + 1].long()
            for w in range(first, min(first + 8, n_windows))
        ]
        window = torch.stack(rows)
        logits = model(window[:, :-1]).float()
        targets = window[:, 1:]
        nll += F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum").item()
        n_bytes += int(byte_len[targets].sum())
    n_tokens = n_windows * seq_len
    return {
        "heldout_tokens": n_tokens,
        "heldout_bytes": n_bytes,
        "heldout_nll_nats": nll / n_tokens,
        "heldout_ppl": math.exp(nll / n_tokens),
        "heldout_bits_per_byte": nll / math.log(2) / max(n_bytes, 1),
    }
