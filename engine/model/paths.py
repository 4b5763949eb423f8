"""Decode or prefill: the one place that decides which path a batch takes, for every module that has two.

A row is one token of one sequence: a decode step of B sequences has B rows, a prefill chunk of T tokens of
B sequences has B * T. Up to `DECODE_MAX_ROWS` rows take the decode paths, whose shapes depend only on the
row count and which read nothing on the host, so the step can be compiled in one graph or captured in a
CUDA graph (`engine.runtime.decode.graph_capturable`):
- a dense `ExpertBank` gathers each row's experts (`moe.expert_ffn`), or, with the CPU's grouped kernels
  bound, reads the union of the rows' experts once (`ExpertBank.bind_decode_kernels`);
- a packed projection or expert bank runs its kernels (`engine.quant.packed`).
More rows take the prefill paths: experts grouped by expert after a host read of the counts, and a packed
weight whose kernel is a GEMV (not ``many_rows``) dequantised once per call for one matmul.

Per sequence, one new token runs KDA's recurrent and conv steps and several tokens its chunked kernel: that
follows from the token count itself (`engine.model.kda`) and needs no threshold.
"""

from __future__ import annotations

DECODE_MAX_ROWS = 16


def takes_decode_path(rows: int) -> bool:
    """Whether a batch of `rows` rows runs the decode paths (see the module docstring)."""
    return rows <= DECODE_MAX_ROWS
