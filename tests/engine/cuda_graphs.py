"""Check that a model's decode step can be captured in a CUDA graph and replays like the eager step."""

from __future__ import annotations

import torch


def assert_decode_replays_in_a_cuda_graph(
    model, prompt: torch.Tensor, *, replays: int = 3
) -> list[torch.Tensor]:
    """Prefill `prompt` [1, T] (on the GPU) into two caches, capture `decode_step` of its last token on one
    and compare every replay with an eager step on the other (BF16 tolerance). Returns the replayed logits."""
    max_len = prompt.shape[1] + replays + 1
    eager_cache, graph_cache, snapshot = (model.new_cache(max_len) for _ in range(3))
    for cache in (eager_cache, graph_cache):
        model.prefill(prompt, cache)
    snapshot.copy_from(graph_cache)
    token = prompt[:, -1]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up (and Triton compilation) outside the graph
        model.decode_step(token, graph_cache)
    torch.cuda.current_stream().wait_stream(stream)
    graph_cache.copy_from(snapshot)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        logits = model.decode_step(token, graph_cache)
    graph_cache.copy_from(snapshot)
    replayed = []
    for _ in range(replays):
        graph.replay()
        torch.testing.assert_close(logits, model.decode_step(token, eager_cache), atol=1e-2, rtol=1e-2)
        replayed.append(logits.clone())
    return replayed
