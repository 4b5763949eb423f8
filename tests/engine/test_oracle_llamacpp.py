"""Oracle 3: llama.cpp (llama-cpp-python) on the same weights, exported to an F32 GGUF by
`kimi-engine export-gguf`. With an F32 KV cache llama.cpp's logits match to ~3e-5 (its default F16 cache
costs ~1e-3); llama.cpp uses the config eps for the MLA latent norm and the q/k L2 norm where the
engine (like transformers) uses 1e-6, a difference far below the tolerance."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.gguf_export import export_gguf
from engine.model import SamplingParams, Tokenizer, generate

pytestmark = pytest.mark.oracle

ATOL = 1e-4  # stated tolerance on every logit, prefill and decode


@pytest.fixture(scope="module")
def llama(tiny_dir, tmp_path_factory):
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    path = export_gguf(tiny_dir, tmp_path_factory.mktemp("gguf") / "tiny-f32.gguf", dtype="f32")
    f32 = llama_cpp.GGML_TYPE_F32
    model = llama_cpp.Llama(
        model_path=str(path),
        n_ctx=128,
        n_batch=128,
        n_threads=1,
        logits_all=True,
        type_k=f32,
        type_v=f32,
        verbose=False,
    )
    yield model
    model.close()


def test_prefill_and_decode_logits_match_llamacpp(llama, tiny_model, rng):
    tokens = torch.randint(0, tiny_model.config.vocab_size, (1, 80), generator=rng)
    expected = tiny_model(tokens)[
        0
    ].numpy()  # full-sequence engine logits; decode agreement is tested elsewhere
    cache = tiny_model.new_cache(80)
    ours_prefill = tiny_model.prefill(tokens[:, :68], cache)[0].numpy()
    ours_decode = [tiny_model.decode_step(tokens[:, t], cache)[0].numpy() for t in range(68, 80)]

    llama.reset()
    llama.eval(tokens[0, :68].tolist())  # one batch: llama.cpp's prefill graph
    for t in range(68, 80):
        llama.eval([int(tokens[0, t])])  # one token at a time: its decode graph
    theirs = np.array(llama.scores[:80])

    np.testing.assert_allclose(theirs, expected, atol=ATOL, rtol=0)
    np.testing.assert_allclose(theirs[67], ours_prefill, atol=ATOL, rtol=0)
    np.testing.assert_allclose(theirs[68:80], np.stack(ours_decode), atol=ATOL, rtol=0)


def test_greedy_tokens_identical(llama, tiny_model, tiny_dir):
    tokenizer = Tokenizer.from_dir(tiny_dir)
    prompt = [tokenizer.bos_id, *tokenizer.encode("The cat")]
    ours = generate(tiny_model, prompt, SamplingParams(max_tokens=24)).token_ids
    llama.reset()
    llama.eval(prompt)
    theirs = []
    for _ in range(24):
        nxt = int(np.argmax(llama.scores[llama.n_tokens - 1]))
        theirs.append(nxt)
        llama.eval([nxt])
    assert len(set(ours)) >= 3
    assert ours == theirs


def test_f16_export_runs_in_llamacpp(tiny_dir, tiny_model, tmp_path, rng):
    """The F16 file (what llama-quantize starts from for speed runs) loads and runs; its weights are
    rounded to F16, so the tolerance is loose: 0.05 on logits of magnitude ~10."""
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    path = export_gguf(tiny_dir, tmp_path / "tiny-f16.gguf", dtype="f16")
    f32 = llama_cpp.GGML_TYPE_F32
    model = llama_cpp.Llama(
        model_path=str(path), n_ctx=64, n_threads=1, logits_all=True, type_k=f32, type_v=f32, verbose=False
    )
    tokens = torch.randint(0, tiny_model.config.vocab_size, (1, 30), generator=rng)
    model.eval(tokens[0].tolist())
    theirs = np.array(model.scores[:30])
    model.close()
    np.testing.assert_allclose(theirs, tiny_model(tokens)[0].numpy(), atol=0.05, rtol=0)


TEXTS = [
    "def __init__(self, name):\n    self.name = name  # the user's name\n\n",
    'tools: [{"type": "function", "name": "Bash", "description": "Runs a command.\\n"}]',
    "  Mixed   CASE words, don't we'll 12345 3.14159\r\n\ttabs\u00a0and\u2003spaces café 世界 🙂 naïve ÆØÅ",
    "<|im_user|>user<|im_middle|>hi<|im_end|>",
]


@pytest.mark.parametrize("text", TEXTS)
def test_llamacpp_tokenises_like_the_engine(llama, tiny_dir, text):
    """The exported GPT-2-style BPE with the kimi-k2 pre-tokenizer gives the engine's own ids, so text
    (not only ids) can be fed to llama.cpp's tools; special tokens are recognised as such."""
    tokenizer = Tokenizer.from_dir(tiny_dir)
    theirs = llama.tokenize(text.encode(), add_bos=False, special=True)
    assert theirs == tokenizer.encode(text)
    assert llama.detokenize(theirs, special=True).decode() == text
