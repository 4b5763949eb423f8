"""One threshold decides decode or prefill paths (engine/model/paths.py): no other module compares a row
count with its own number, and moving the threshold moves every module that has the two paths."""

from __future__ import annotations

import ast
from pathlib import Path

import torch

from engine.model import KimiLinearForCausalLM, paths
from engine.model.moe import expert_ffn
from engine.model.presets import preset
from engine.quant import make_plan, quantized_meta_model
from engine.runtime.decode import graph_capturable

ROOT = Path(__file__).resolve().parents[2]


def test_only_the_paths_module_reads_the_threshold():
    """Modules call `takes_decode_path`; none names DECODE_MAX_ROWS in code (docstrings may)."""
    readers = []
    for path in sorted((ROOT / "engine").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        names |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        if "DECODE_MAX_ROWS" in names and path != ROOT / "engine" / "model" / "paths.py":
            readers.append(str(path.relative_to(ROOT)))
    assert readers == []


def test_moving_the_threshold_moves_every_path(monkeypatch):
    """With the threshold at 2 rows: a 3-row expert call is grouped on the host (its per-expert count read
    shows as a `.tolist()` on the counts), and a batch of 3 is no longer capturable, dense or packed."""
    cfg = preset("tiny")
    models = [
        torch.nn.Module(),  # no expert banks: any batch is capturable
        KimiLinearForCausalLM(cfg, device="meta"),
        quantized_meta_model(cfg, make_plan("default"), dtype=torch.float32),
    ]
    assert all(graph_capturable(m, 3) for m in models)
    monkeypatch.setattr(paths, "DECODE_MAX_ROWS", 2)
    assert graph_capturable(models[0], 3)
    for banked in models[1:]:
        assert graph_capturable(banked, 2) and not graph_capturable(banked, 3)

    gen = torch.Generator().manual_seed(0)
    experts, hidden, inter = 4, 8, 6
    w1, w3 = torch.randn(2, experts, inter, hidden, generator=gen)
    w2 = torch.randn(experts, hidden, inter, generator=gen)
    x = torch.randn(3, hidden, generator=gen)
    ids = torch.tensor([[0, 1], [1, 2], [3, 0]])
    weights = torch.rand(3, 2, generator=gen)
    host_reads = []
    real_tolist = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: host_reads.append(t.shape) or real_tolist(t))
    expert_ffn(x, ids, weights, w1, w3, w2)
    assert host_reads == [torch.Size([experts])]
    host_reads.clear()
    expert_ffn(x[:2], ids[:2], weights[:2], w1, w3, w2)
    assert host_reads == []
