"""Loading a checkpoint with transformers' native KimiLinearForCausalLM (torch path), for the oracle tests
and the trained-checkpoint tests."""

from __future__ import annotations

import contextlib
import sys

import pytest
import torch


@contextlib.contextmanager
def transformers_without_fla():
    """transformers picks fla's Triton kernels whenever `fla` imports (they need a GPU): block it."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(sys.modules, "fla", None)
        yield


def load_with_transformers(path):
    """The checkpoint as transformers' model in FP32 (eval); skips when transformers lacks KimiLinear,
    fails when any key is missing, unexpected or mismatched. Call inside `transformers_without_fla()`."""
    try:
        from transformers import KimiLinearForCausalLM
    except ImportError as e:
        pytest.skip(f"transformers with KimiLinear is not importable: {e}")
    model, info = KimiLinearForCausalLM.from_pretrained(path, dtype=torch.float32, output_loading_info=True)
    assert not any(info.values()), f"transformers did not load the checkpoint cleanly: {info}"
    return model.eval()
