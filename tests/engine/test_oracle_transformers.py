"""Oracle 2: transformers' native KimiLinearForCausalLM (torch path) on the same synthetic checkpoint.

transformers picks fla's Triton kernels whenever `fla` imports; those need a GPU, so `fla` is blocked
while this module runs and transformers takes its pure-torch KDA path. The checkpoint's config.json
carries `linear_attn_config`, so transformers builds the real layer layout (its fallback layout without
it is different); the test checks the layout it built.
"""

from __future__ import annotations

import pytest
import torch

from tests.engine.transformers_support import load_with_transformers, transformers_without_fla

# The checkpoint's config.json has `rope_scaling: null` (as the real one does); transformers warns about the key.
pytestmark = [
    pytest.mark.oracle,
    pytest.mark.filterwarnings("ignore:`rope_scaling` is deprecated:FutureWarning"),
]

# Stated tolerance: |engine - transformers| <= 1e-4 on every logit (both float32; logits reach ~10).
ATOL = 1e-4


@pytest.fixture(scope="module")
def hf_model(tiny_dir):
    with transformers_without_fla():
        yield load_with_transformers(tiny_dir)


def hf_cache_of(output):
    return output.cache if hasattr(output, "cache") else output.past_key_values


def test_transformers_builds_the_real_layer_layout(hf_model, tiny_model):
    cfg = tiny_model.config
    expected = [
        "full_attention" if cfg.is_mla_layer(i) else "linear_attention" for i in range(cfg.num_hidden_layers)
    ]
    assert hf_model.config.layer_types == expected
    assert hf_model.config.mlp_layer_types[0] == "dense" and set(hf_model.config.mlp_layer_types[1:]) == {
        "sparse"
    }


@torch.no_grad()
def test_prefill_and_every_decode_step_match_transformers(hf_model, tiny_model, rng):
    """A 70-token prefill (two KDA chunks) compared at every position, then 12 decode steps each compared."""
    vocab = tiny_model.config.vocab_size
    tokens = torch.randint(0, vocab, (1, 82), generator=rng)
    prompt = tokens[:, :70]

    hf_out = hf_model(prompt, use_cache=True)
    ours_all = tiny_model(prompt)
    torch.testing.assert_close(ours_all, hf_out.logits, atol=ATOL, rtol=0)

    cache = tiny_model.new_cache(82)
    ours = tiny_model.prefill(prompt, cache)
    torch.testing.assert_close(ours, hf_out.logits[:, -1], atol=ATOL, rtol=0)

    hf_cache = hf_cache_of(hf_out)
    for t in range(70, 82):
        hf_out = hf_model(tokens[:, t : t + 1], cache=hf_cache, use_cache=True)
        hf_cache = hf_cache_of(hf_out)
        ours = tiny_model.decode_step(tokens[:, t], cache)
        torch.testing.assert_close(ours, hf_out.logits[:, -1], atol=ATOL, rtol=0, msg=f"decode step {t}")


@torch.no_grad()
def test_greedy_continuations_agree(hf_model, tiny_model):
    from engine.model import SamplingParams, generate

    prompt = [256, 72, 101, 108, 108, 111]  # [BOS] "Hello"
    ours = generate(tiny_model, prompt, SamplingParams(max_tokens=16)).token_ids
    ids = torch.tensor([prompt])
    out = hf_model(ids, use_cache=True)
    theirs = []
    for _ in range(16):
        nxt = out.logits[0, -1].argmax().item()
        theirs.append(nxt)
        out = hf_model(torch.tensor([[nxt]]), cache=hf_cache_of(out), use_cache=True)
    assert len(set(ours)) >= 3  # a repetitive continuation would make agreement meaningless
    assert ours == theirs
