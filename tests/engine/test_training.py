"""`kimi-engine train`: gradients through the engine's modules, the corpus split, the router-bias rule, the
schedule, and a few real training steps on tiny (deterministic, cached, loadable by the engine and by
transformers)."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from engine.cli import main
from engine.model import Checkpoint, load_model
from engine.model.kda import kda_chunked
from engine.server.chat_template import SYNTHETIC_CHAT_TEMPLATE
from engine.training.cli import HELDOUT_TEXT, trained_checkpoint
from engine.training.corpus import corpus_files, is_heldout
from engine.training.trainer import (
    DEFAULT_RECIPES,
    Recipe,
    learning_rate,
    new_model,
    routers,
    update_router_biases,
)
from tests.engine.transformers_support import load_with_transformers, transformers_without_fla

# Trained checkpoints have `rope_scaling: null` in config.json (as the real one does); transformers warns.
pytestmark = pytest.mark.filterwarnings("ignore:`rope_scaling` is deprecated:FutureWarning")

QUICK = dataclasses.replace(
    DEFAULT_RECIPES["tiny"], steps=6, batch_size=2, seq_len=32, warmup_steps=2, eval_tokens=256
)


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    """A small corpus of Python-like files, with at least one held out."""
    root = tmp_path_factory.mktemp("corpus")
    for i in range(40):
        body = "".join(f"def f{j}(x):\n    return x * {j} + {i}\n\n" for j in range(30))
        (root / f"module_{i:02d}.py").write_text(body)
    (root / "test").mkdir()
    (root / "test" / "test_skipped.py").write_text("skipped = True\n")
    assert any(is_heldout(f) for f in corpus_files(root))
    return root


@pytest.fixture(scope="module")
def quick_run(corpus_dir, tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    path, cached = trained_checkpoint(QUICK, cache, corpus_root=corpus_dir)
    assert not cached
    return path, cache


def recurrence(q, k, v, g, beta):
    """The delta rule token by token, out of place (autograd-friendly): the math kda_chunked implements."""
    batch, n_tokens, heads, d_k = q.shape
    state = q.new_zeros(batch, heads, d_k, v.shape[-1])
    out = []
    for t in range(n_tokens):
        state = state * g[:, t].exp().unsqueeze(-1)
        prediction = (k[:, t].unsqueeze(-2) @ state).squeeze(-2)
        delta = beta[:, t].unsqueeze(-1) * (v[:, t] - prediction)
        state = state + k[:, t].unsqueeze(-1) * delta.unsqueeze(-2)
        out.append((q[:, t].unsqueeze(-2) @ state).squeeze(-2))
    return torch.stack(out, dim=1)


def test_chunked_kda_gradients_equal_the_recurrences(rng):
    """Training differentiates kda_chunked (prefill kernel); its gradients must be the recurrence's.
    Float64, 70 tokens (two chunks, one partial), tolerance 1e-9 relative to the largest gradient."""
    b, t, h, d = 2, 70, 2, 8
    q = torch.nn.functional.normalize(torch.randn(b, t, h, d, generator=rng, dtype=torch.float64), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(b, t, h, d, generator=rng, dtype=torch.float64), dim=-1)
    v = torch.randn(b, t, h, d, generator=rng, dtype=torch.float64)
    g = -torch.rand(b, t, h, d, generator=rng, dtype=torch.float64) * 0.5
    beta = torch.rand(b, t, h, generator=rng, dtype=torch.float64)
    inputs = [x.requires_grad_() for x in (q, k, v, g, beta)]
    weight = torch.randn(b, t, h, d, generator=rng, dtype=torch.float64)
    state = torch.zeros(b, h, d, d, dtype=torch.float64)
    chunked = torch.autograd.grad((kda_chunked(*inputs, state) * weight).sum(), inputs)
    expected = torch.autograd.grad((recurrence(*inputs) * weight).sum(), inputs)
    for name, ours, ref in zip("q k v g beta".split(), chunked, expected, strict=True):
        assert torch.isfinite(ours).all(), name
        torch.testing.assert_close(ours, ref, atol=1e-9 * ref.abs().max().item(), rtol=0, msg=name)


def test_corpus_files_are_sorted_skip_tests_and_split_by_path_hash(corpus_dir):
    files = corpus_files(corpus_dir)
    assert files == sorted(files) and len(files) == 40
    assert not any(f.startswith("test/") for f in files)
    held = [f for f in files if is_heldout(f)]
    assert 0 < len(held) < len(files)
    assert [is_heldout(f) for f in files] == [is_heldout(f) for f in files]  # a pure function of the path


def test_router_bias_moves_toward_balanced_load():
    model = new_model(QUICK)
    router = routers(model)[0]
    assert not router.e_score_correction_bias.requires_grad and not router.e_score_correction_bias.any()
    load = torch.zeros(router.e_score_correction_bias.numel(), dtype=torch.long)
    load[0], load[1] = 10, 2  # mean 1.5: expert 0 over-loaded, experts 2.. under-loaded
    update_router_biases({router: load}, 0.01)
    bias = router.e_score_correction_bias
    assert bias[0].item() == pytest.approx(-0.01) and bias[1].item() == pytest.approx(-0.01)
    assert torch.allclose(bias[2:], torch.full_like(bias[2:], 0.01))


def test_learning_rate_warms_up_then_decays_by_cosine():
    r = dataclasses.replace(QUICK, lr=1.0, warmup_steps=4, min_lr_ratio=0.1)
    assert [learning_rate(r, s, 0.0) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert learning_rate(r, 10, 0.5) == pytest.approx(0.55)
    assert learning_rate(r, 10, 1.0) == pytest.approx(0.1)


def test_training_reduces_the_loss_and_records_it(quick_run):
    path, _ = quick_run
    record = json.loads((path / "training.json").read_text())
    assert record["weights"] == "trained"
    assert record["steps"] == 6 and record["tokens"] == 6 * 2 * 32 and len(record["loss_curve"]) == 6
    assert record["loss_curve"][-1] < record["loss_curve"][0] - 1.0
    assert record["corpus"]["files"] == 40 and len(record["corpus"]["sha256"]) == 64
    assert 1 < record["heldout_ppl"] < record["uniform_ppl"]
    assert math.isclose(record["heldout_bits_per_byte"] * math.log(2) * record["heldout_bytes"],
                        record["heldout_nll_nats"] * record["heldout_tokens"], rel_tol=1e-9)  # fmt: skip
    assert (path / HELDOUT_TEXT).read_text().startswith("def f0(x)")
    assert (path / "chat_template.jinja").read_text() == SYNTHETIC_CHAT_TEMPLATE


def test_trained_checkpoint_loads_in_the_engine_and_in_transformers(quick_run, rng):
    path, _ = quick_run
    assert Checkpoint.open(path).weights_kind == "trained"
    ours = load_model(path, dtype=torch.float32)
    with transformers_without_fla():
        theirs = load_with_transformers(path)
        ids = torch.randint(0, 256, (1, 40), generator=rng)
        with torch.no_grad():
            torch.testing.assert_close(ours(ids), theirs(ids).logits, atol=1e-4, rtol=0)


def test_same_seed_gives_identical_weights_and_the_cache_keys_on_the_recipe(quick_run, corpus_dir, tmp_path):
    path, cache = quick_run
    again, cached = trained_checkpoint(QUICK, cache, corpus_root=corpus_dir)
    assert cached and again == path
    fresh, cached = trained_checkpoint(QUICK, tmp_path, corpus_root=corpus_dir)  # retrained from scratch
    assert not cached
    for shard in sorted(path.glob("*.safetensors")):
        a, b = load_file(shard), load_file(fresh / shard.name)
        assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a), shard.name
    other, cached = trained_checkpoint(dataclasses.replace(QUICK, seed=1), cache, corpus_root=corpus_dir)
    assert not cached and other != path


def test_cli_trains_copies_and_refuses_a_non_empty_out(corpus_dir, tmp_path):
    out = tmp_path / "out"
    args = ["train", "--config", "tiny", "--steps", "2", "--batch-size", "2", "--seq-len", "16"]
    args += ["--corpus", str(corpus_dir), "--cache-dir", str(tmp_path / "cache"), "--out", str(out)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "trained:" in result.output and (out / "training.json").exists()
    again = CliRunner().invoke(main, args)
    assert again.exit_code != 0 and "not empty" in again.output
    both = CliRunner().invoke(main, [*args[:5], "--minutes", "1", "--out", str(tmp_path / "x")])
    assert both.exit_code == 2 and "not both" in both.output


def test_recipe_key_changes_with_every_field():
    base = QUICK.key("c" * 64, "t" * 64)
    assert QUICK.key("d" * 64, "t" * 64) != base
    assert QUICK.key("c" * 64, "u" * 64) != base  # a new tokenizer retrains cached models
    for field in dataclasses.fields(Recipe):
        value = getattr(QUICK, field.name)
        changed = (value or 0) + 1 if not isinstance(value, str) else value + "x"
        assert dataclasses.replace(QUICK, **{field.name: changed}).key("c" * 64, "t" * 64) != base, field.name


def test_a_minutes_budget_stops_on_the_clock(corpus_dir, tmp_path):
    recipe = dataclasses.replace(QUICK, steps=None, minutes=0.002)  # 0.12 s: at least one step, then stop
    path, _ = trained_checkpoint(recipe, tmp_path, corpus_root=corpus_dir)
    record = json.loads((path / "training.json").read_text())
    assert record["steps"] >= 1 and record["recipe"]["minutes"] == 0.002
    assert record["wall_seconds"] < 0.12 + 30  # stops after the step that crossed the budget
