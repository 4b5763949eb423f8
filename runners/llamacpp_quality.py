"""`python -m runners llamacpp-quality`: perplexity of llama.cpp's own quants of the same weights, on the
same tokens as `python -m runners accuracy`, so our INT4 plans and llama.cpp's quants share one axis.

The checkpoint is exported to an F16 GGUF (`engine.gguf_export`), quantised by llama.cpp's own quantiser
(`llama_model_quantize` in libllama, what the `llama-quantize` tool calls; tensors whose rows do not fit a
K-quant's 256-element blocks get llama.cpp's own fallback type), and each file is evaluated by llama.cpp
(llama-cpp-python's `Llama.eval`, logits of every position, F32 KV cache so only the weights differ) on
the evaluation windows the accuracy runner uses: the first N windows of the checkpoint's heldout.txt.
llama.cpp's `llama-perplexity` tool scores only the second half of each context window; this scores every
position, as the accuracy runner does, so the numbers are directly comparable with its perplexities.
Bits per weight: the GGUF's tensor bytes × 8 / its tensor elements (every tensor counted).
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import click
import gguf
import numpy as np
import torch

from common.click_options import count_option
from engine.gguf_export import export_gguf
from engine.model import Checkpoint, Tokenizer
from engine.training.cli import HELDOUT_TEXT
from harness.receipt import write_receipt
from runners.accuracy import WEIGHTS_LABELS, text_sequences, weights_kind
from runners.gguf_requantize import tensor_types
from runners.options import results_option
from runners.regenerate import regenerate

# name -> llama.cpp file type (llama_ftype), F16 = the exported file itself
GGUF_TYPES = {"f16": "LLAMA_FTYPE_MOSTLY_F16", "q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0",
              "q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0", "q4_k_m": "LLAMA_FTYPE_MOSTLY_Q4_K_M"}  # fmt: skip


def quantize_gguf(llama_cpp, src: Path, dst: Path, gguf_type: str, threads: int) -> None:
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, GGUF_TYPES[gguf_type])
    params.nthread = threads
    status = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), params)
    if status != 0:
        raise click.ClickException(
            f"llama.cpp could not quantise {src.name} to {gguf_type} (status {status})"
        )


def bits_per_weight(path: Path) -> float:
    tensors = gguf.GGUFReader(path).tensors
    return 8 * sum(int(t.n_bytes) for t in tensors) / sum(int(t.n_elements) for t in tensors)


def sequence_nll(llama_cpp, path: Path, windows: torch.Tensor, threads: int) -> list[float]:
    """Mean negative log-likelihood (nats/token) of each window's tokens 1..T-1, from llama.cpp's logits."""
    f32 = llama_cpp.GGML_TYPE_F32
    length = windows.shape[1]
    llama = llama_cpp.Llama(model_path=str(path), n_ctx=length, n_batch=length, n_threads=threads,
                            logits_all=True, type_k=f32, type_v=f32, verbose=False)  # fmt: skip
    try:
        out = []
        for window in windows.tolist():
            llama.reset()
            llama.eval(window)
            logits = torch.from_numpy(np.array(llama.scores[: length - 1], dtype=np.float32))
            log_probs = torch.log_softmax(logits.double(), dim=-1)
            targets = torch.tensor(window[1:])
            out.append(-log_probs.gather(-1, targets.unsqueeze(-1)).mean().item())
        return out
    finally:
        llama.close()


@click.command("llamacpp-quality")
@click.option("--weights", type=click.Path(exists=True, file_okay=False, path_type=Path), required=True,
              help="A checkpoint directory (trained: `kimi-engine train`).")  # fmt: skip
@click.option("--types", default=",".join(GGUF_TYPES), show_default=True, help="GGUF types, comma-separated.")
@click.option("--text", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Evaluation text. Default: the checkpoint's heldout.txt.")  # fmt: skip
@count_option("--sequences", default=64, help="Evaluation windows.")
@count_option("--seq-len", default=128, minimum=2, help="Tokens per window.")
@count_option("--threads", default=2, help="llama.cpp threads.")
@results_option
@click.option("--no-regenerate", is_flag=True, help="Write receipts only; skip RESULTS.md and figures.")
def llamacpp_quality_command(
    weights, types, text, sequences, seq_len, threads, results, no_regenerate
) -> None:
    """Perplexity of llama.cpp's F16 / Q8_0 / Q4_0 / Q4_K_M of a checkpoint on the accuracy runner's tokens."""
    try:
        import llama_cpp
    except ImportError as e:
        raise click.ClickException(f"llama-cpp-python is not installed: {e}") from None
    chosen = [t.strip() for t in types.split(",") if t.strip()]
    unknown = [t for t in chosen if t not in GGUF_TYPES]
    if unknown or not chosen:
        raise click.BadParameter(f"unknown type(s) {unknown}; available: {', '.join(GGUF_TYPES)}",
                                 param_hint="--types")  # fmt: skip
    text = text or weights / HELDOUT_TEXT
    if not text.exists():
        raise click.BadParameter(f"{weights} has no {HELDOUT_TEXT}; give --text", param_hint="--text")
    checkpoint = Checkpoint.open(weights)
    kind = weights_kind(checkpoint)
    weights_sha256 = checkpoint.weights_sha256()
    windows = text_sequences(Tokenizer.from_dir(weights), text.read_text(), sequences, seq_len)
    eval_set = f"text {text.name}: first {sequences} windows of {seq_len} tokens"
    written = []
    with tempfile.TemporaryDirectory() as tmp:
        f16 = export_gguf(weights, Path(tmp) / "f16.gguf", dtype="f16")
        with click.progressbar(chosen, label="llama.cpp quality", item_show_func=lambda t: t) as bar:
            for gguf_type in bar:
                path = f16 if gguf_type == "f16" else Path(tmp) / f"{gguf_type}.gguf"
                if path != f16:
                    quantize_gguf(llama_cpp, f16, path, gguf_type, threads)
                nll = sequence_nll(llama_cpp, path, windows, threads)
                derived = {
                    "perplexity": math.exp(sum(nll) / len(nll)),
                    "bits_per_weight": bits_per_weight(path),
                }
                written.append(write_receipt(
                    "llamacpp_quality",
                    f"{weights.name}.{gguf_type}",
                    config={"model": weights.name, "weights": WEIGHTS_LABELS[kind], "weights_kind": kind,
                            "weight_source": str(weights), "weights_sha256": weights_sha256,
                            "gguf_type": gguf_type,
                            "tensor_types": tensor_types(path), "eval_set": eval_set, "sequences": sequences,
                            "seq_len": seq_len, "threads": threads, "llama_cpp_python": llama_cpp.__version__},
                    samples={"nll_nats": nll},
                    units={"nll_nats": "nats/token", "bits_per_weight": "bits"},
                    derived=derived,
                    notes=f"{WEIGHTS_LABELS[kind]}; llama.cpp library eval of every position (F32 KV cache), "
                    "the accuracy runner's tokens; quantised by llama_model_quantize",
                    results_dir=results,
                ))  # fmt: skip
    for path in written:
        click.echo(f"wrote {path}")
    if not no_regenerate:
        regenerate(results)
