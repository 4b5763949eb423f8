"""`python -m runners llamacpp`: our engine against llama.cpp on the same model and machine, in one run.

The same synthetic weights are written as a checkpoint (`engine.synth`), exported with the project's
GGUF exporter in F16 and re-quantised to Q4_0 (runners/gguf_requantize.py), and quantised by the project
into an INT4 artifact (`engine.quant.build_artifact`, plan `default`); files are cached under
`.cache/llamacpp-models/` and rebuilt when the code that writes them changes. llama.cpp's own
`llama-bench` and `llama-server` (runners/llamacpp_tools.py: built from the llama-cpp-python sdist, with
CUDA on a GPU machine) time prefill and decode of each GGUF file; our engine runs its counterpart through
the serving runtime and the decode runner's `measure()`: the dense checkpoint against F16, the INT4
artifact against Q4_0. Same prompt length, generated tokens and thread count for all. Receipts: one per
engine run, one per GGUF type with llama-bench and llama-server samples and the engine/llama.cpp ratios
against its counterpart. Method: docs/METHODS.md.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import click
import torch

from common.click_options import count_option
from engine.cli_options import (
    DTYPES,
    device_option,
    dtype_option,
    resolve_device,
    resolve_dtype,
    synthetic_option,
)
from engine.gguf_export import export_gguf
from engine.model import preset
from engine.quant import build_artifact, make_plan
from engine.runtime import Engine
from engine.synth import write_synthetic_checkpoint
from harness.hardware import REPO_ROOT
from harness.receipt import write_receipt
from runners import gguf_requantize
from runners.decode import measure, step_method
from runners.llamacpp_server import completion_timings, running_server
from runners.llamacpp_tools import Tools, ensure_tools
from runners.options import results_option
from runners.outcome import report
from runners.regenerate import regenerate
from runners.threads import apply_threads, threads_option

MODELS = REPO_ROOT / ".cache" / "llamacpp-models"
# Whatever decides the bytes of the files: a change to any of these rebuilds them.
_MODEL_SOURCES = (
    "engine/synth.py",
    "engine/gguf_export.py",
    "engine/model/checkpoint_spec.py",
    "runners/gguf_requantize.py",
    "engine/quant/build.py",
    "engine/codec.py",
    "engine/quant/plan.py",
)
GGUF_TYPES = ("f16", "q4_0")
INT4 = make_plan("default", group_size=32)  # Q4_0's blocks are 32 weights too
# Which engine model each GGUF type is measured against.
COUNTERPART = {"f16": "dense", "q4_0": "int4"}


@dataclass(frozen=True)
class Models:
    checkpoint: Path
    artifact: Path  # the checkpoint quantised by the project with the plan INT4
    gguf: dict[str, Path]  # "f16" / "q4_0" -> file
    tensor_types: dict[str, dict[str, int]]  # GGUF type -> tensor count per ggml type

    def engine_weights(self, kind: str) -> Path:
        return self.checkpoint if kind == "dense" else self.artifact


def prepare_models(preset_name: str, seed: int, root: Path = MODELS) -> Models:
    """The checkpoint, its INT4 artifact and both GGUF files for (preset, seed), built once and reused
    while unchanged."""
    stamp = hashlib.sha256(
        json.dumps([preset_name, seed]).encode()
        + b"".join((REPO_ROOT / s).read_bytes() for s in _MODEL_SOURCES)
    ).hexdigest()
    folder = root / f"synthetic-{preset_name}-seed{seed}"
    manifest = folder / "models.json"
    models = Models(
        folder / "checkpoint",
        folder / f"int4-{INT4.name}-g{INT4.group_size}",
        {t: folder / f"model-{t}.gguf" for t in GGUF_TYPES},
        {},
    )
    if manifest.exists() and json.loads(manifest.read_text()).get("stamp") == stamp:
        types = json.loads(manifest.read_text())["tensor_types"]
        return Models(models.checkpoint, models.artifact, models.gguf, types)
    shutil.rmtree(folder, ignore_errors=True)
    click.echo(
        f"writing synthetic-{preset_name} (seed {seed}) and its GGUF files into {folder} ...", err=True
    )
    write_synthetic_checkpoint(
        preset(preset_name), models.checkpoint, seed=seed, preset_name=preset_name, progress=True
    )
    build_artifact(models.checkpoint, models.artifact, INT4)
    export_gguf(models.checkpoint, models.gguf["f16"], dtype="f16", progress=True)
    types = {"q4_0": gguf_requantize.requantize_q4_0(models.gguf["f16"], models.gguf["q4_0"])}
    types["f16"] = gguf_requantize.tensor_types(models.gguf["f16"])
    manifest.write_text(json.dumps({"stamp": stamp, "tensor_types": types}, indent=1))
    return Models(models.checkpoint, models.artifact, models.gguf, types)


def llama_bench(
    tools: Tools, model: Path, *, prompt: int, gen: int, threads: int, repeats: int, gpu_layers: int
) -> dict:
    """Prefill of `prompt` tokens from an empty context and `gen` decode steps after `prompt` tokens of
    context, each repeated (llama-bench warms up first); tokens/s of every repeat."""
    common = ["-m", str(model), "-t", str(threads), "-r", str(repeats), "-ngl", str(gpu_layers), "-o", "json"]
    prefill = _bench_json(tools, [*common, "-p", str(prompt), "-n", "0"])
    decode = _bench_json(tools, [*common, "-p", "0", "-n", str(gen), "-d", str(prompt)])
    return {
        "pp_tok_s": prefill["samples_ts"],
        "tg_tok_s": decode["samples_ts"],
        "build": prefill["build_commit"],
    }


def _bench_json(tools: Tools, args: list[str]) -> dict:
    proc = subprocess.run([str(tools.bench), *args], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise click.ClickException(f"llama-bench {' '.join(args)} failed:\n{proc.stderr[-2000:]}")
    (result,) = json.loads(proc.stdout)
    return result


def server_runs(
    tools: Tools, model: Path, prompt_ids: list[int], *, gen: int, threads: int, repeats: int, gpu_layers: int
) -> dict:
    """`repeats` timed /completion requests after one untimed warm-up, on a fresh server."""
    samples: dict[str, list[float]] = {
        "server_prompt_tok_s": [],
        "server_decode_tok_s": [],
        "server_request_ms": [],
    }
    with running_server(
        tools.server, model, threads=threads, context=len(prompt_ids) + gen + 16, gpu_layers=gpu_layers
    ) as url:
        completion_timings(url, prompt_ids, gen)
        for _ in range(repeats):
            t = completion_timings(url, prompt_ids, gen)
            samples["server_prompt_tok_s"].append(t["prompt_per_second"])
            samples["server_decode_tok_s"].append(t["predicted_per_second"])
            samples["server_request_ms"].append(t["request_ms"])
    return samples


@dataclass(frozen=True)
class EngineRun:
    samples: dict[str, list[float]]
    method: str
    kernel_variants: dict[str, str]  # op -> variant bound ({} for the dense model)
    decode_step: str  # eager / compiled
    compile_s: float | None  # the compiled step's compile time (None: eager)


def engine_runs(
    weights: Path, *, prompt: int, gen: int, repeats: int, device: str, dtype: str, seed: int
) -> EngineRun:
    """The decode runner's measurement through the serving runtime on `weights` (a checkpoint or an INT4
    artifact): one untimed warm-up repeat, then `repeats` (runners.decode.measure)."""
    engine = Engine.load(
        weights=weights, device=device, dtype=DTYPES[dtype], max_context=prompt + gen, prefix_cache_gib=0
    )
    try:
        samples = measure(engine, prompt, 1, gen, repeats=repeats, seed=seed)
        graphs, compiled = engine.pool.graphs_for(1), engine.pool.compiled_for(1)
        compile_s = engine.pool.compile_s.get((engine.pool.capacity_for(prompt + gen), 1))
        return EngineRun(
            samples,
            _engine_method(graphs, compiled),
            engine.kernel_variants,
            "compiled" if compiled else "eager",
            compile_s if compiled else None,
        )
    finally:
        engine.close()


UNITS = {
    "ttft_ms": "ms", "prefill_tok_s": "tok/s", "decode_ms": "ms/step", "decode_tok_s": "tok/s", "raw_decode_tok_s": "tok/s",
    "pp_tok_s": "tok/s", "tg_tok_s": "tok/s", "server_prompt_tok_s": "tok/s", "server_decode_tok_s": "tok/s",
    "server_request_ms": "ms",
}  # fmt: skip


def ratios(engine: dict[str, list[float]], llama: dict[str, list[float]]) -> dict[str, float]:
    """Engine tokens/s over llama.cpp tokens/s (medians): above 1, the engine is faster."""
    med = {k: statistics.median(v) for k, v in (engine | llama).items()}
    return {
        "engine_decode_tok_s": med["decode_tok_s"],
        "engine_prefill_tok_s": med["prefill_tok_s"],
        "engine_over_llama_bench_decode": med["decode_tok_s"] / med["tg_tok_s"],
        "engine_over_llama_bench_prefill": med["prefill_tok_s"] / med["pp_tok_s"],
        "engine_over_llama_server_decode": med["decode_tok_s"] / med["server_decode_tok_s"],
        "engine_over_llama_server_prefill": med["prefill_tok_s"] / med["server_prompt_tok_s"],
    }


def _engine_method(graphs: bool, compiled: bool) -> str:
    return (
        f"engine.runtime.Engine (chunked prefill, {step_method(graphs, compiled)}, prefix cache off), greedy, "
        "timed per token on the host (runners.decode.measure)"
    )


BENCH_METHOD = "prefill: -p PROMPT -n 0; decode: -p 0 -n GEN -d PROMPT; tokens/s of every repeat"
SERVER_METHOD = (
    "/completion with the token-id prompt, temperature 0, ignore_eos, cache_prompt false; "
    "timings.prompt_per_second / predicted_per_second; one untimed warm-up request"
)


def _engine_label(kind: str, dtype: str) -> str:
    return (
        f"{dtype} dense" if kind == "dense" else f"INT4 {INT4.name} g{INT4.group_size}, {dtype} activations"
    )


def _engine_notes(kind: str, variants: dict[str, str]) -> str:
    if kind == "dense":
        gemv = variants.get("w16a16_gemv")
        return "synthetic weights; dense checkpoint" + (
            f"; decode GEMVs through w16a16_gemv {gemv}" if gemv else ""
        )
    notes = (
        f"synthetic weights; INT4 artifact (plan {INT4.name}, group {INT4.group_size}) of the same checkpoint, "
        "packed weights through the kernel registry"
    )
    if set(variants.values()) == {"reference"}:
        notes += (
            "; every kernel bound is the reference (dequantise, then a plain PyTorch matmul), not an "
            "optimised INT4 path"
        )
    else:
        backends = {
            "int4pack": "torch's own CPU int4pack kernels",
            "cpp": "our C++ CPU kernels (engine/kernels/cpp_cpu.py)",
        }
        if used := [text for name, text in backends.items() if name in variants.values()]:
            notes += f"; INT4 matmuls through {' and '.join(used)} (BF16 activations)"
    return notes


def _llama_notes(gguf_type: str, kind: str, dtype: str) -> str:
    notes = (
        f"synthetic weights; llama.cpp {gguf_type.upper()} GGUF against our engine's "
        f"{_engine_label(kind, dtype)} model; ratios = engine / llama.cpp tokens/s"
    )
    if gguf_type == "q4_0":
        notes += (
            "; Q4_0 differs from our INT4 codec: scale = extreme/-8 with codes -8..7 for both (our plans' "
            f"'signed' rounding), in FP16 (ours BF16), group 32 for both, 8-bit activations in llama.cpp's CPU "
            f"matmuls (ours {dtype}); "
            "Q4_0 covers attention projections, dense MLP and experts, our plan also the MLA kv_b projection"
        )
    return notes


@click.command("llamacpp")
@synthetic_option(
    "Synthetic model, built once as a checkpoint and its GGUF files.",
    choices=("tiny", "small", "wide"),
    default="small",
)
@count_option("--prompt", "prompt_len", default=128, help="Prompt tokens.")
@count_option("--gen", default=32, minimum=2, help="Generated tokens timed.")
@count_option("--repeats", default=3, help="Timed runs per engine and GGUF type.")
@threads_option("both engines (llama.cpp -t and torch.set_num_threads)")
@click.option(
    "--types", default=",".join(GGUF_TYPES), show_default=True, help="GGUF types to run, comma-separated."
)
@device_option("Where our engine runs")
@dtype_option(what="Our engine's dtype")
@click.option("--seed", default=0, show_default=True, help="Seed of the synthetic weights and the prompt.")
@click.option(
    "--models",
    "models_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=MODELS,
    show_default=".cache/llamacpp-models of this checkout",
    help="Where the checkpoint and GGUF files are built and reused.",
)
@results_option
@click.option("--no-regenerate", is_flag=True, help="Write receipts only; skip RESULTS.md and figures.")
def llamacpp_command(synthetic, prompt_len, gen, repeats, threads, types, device, dtype, seed, models_dir, results,
                     no_regenerate) -> None:  # fmt: skip
    """Our engine against llama.cpp (llama-bench and llama-server) on the same synthetic model."""
    chosen = [t.strip() for t in types.split(",") if t.strip()]
    if not chosen or set(chosen) - set(GGUF_TYPES):
        raise click.BadParameter(
            f"expected some of {', '.join(GGUF_TYPES)}, got {types!r}", param_hint="--types"
        )
    device = resolve_device(device)
    dtype = resolve_dtype(dtype, device)[0]
    threads = apply_threads(threads)
    tools = ensure_tools()
    gpu_layers = 999 if tools.cuda else 0
    models = prepare_models(synthetic, seed, models_dir)
    vocab = preset(synthetic).vocab_size
    prompt_ids = torch.randint(
        0, vocab, (prompt_len,), generator=torch.Generator().manual_seed(seed)
    ).tolist()
    label = f"synthetic-{synthetic}.p{prompt_len}.n{gen}.t{threads}"
    common = {
        "model": f"synthetic-{synthetic}", "weights": "synthetic weights", "seed": seed, "prompt_tokens": prompt_len,
        "generated_tokens": gen, "repeats": repeats, "threads": threads,
    }  # fmt: skip
    command = [sys.executable, "-m", "runners", *sys.argv[1:]]

    # Each GGUF type right after the engine run it is compared with.
    steps = [(tool, t) for t in chosen for tool in ("engine", "llama.cpp")]
    written, engines = [], {}
    show = lambda s: s and (f"engine {COUNTERPART[s[1]]}" if s[0] == "engine" else f"llama.cpp {s[1]}")
    with click.progressbar(steps, label="llama.cpp head to head", item_show_func=show) as bar:
        for tool, gguf_type in bar:
            kind = COUNTERPART[gguf_type]
            if tool == "engine":
                run = engine_runs(models.engine_weights(kind), prompt=prompt_len, gen=gen, repeats=repeats,
                                  device=device, dtype=dtype, seed=seed)  # fmt: skip
                name = f"engine.{label}.{dtype}" + ("" if kind == "dense" else f".int4-{INT4.name}")
                engines[kind] = (name, run)
                config = common | {
                    "engine": run.method, "dtype": dtype, "device": device, "weights_format": kind,
                    "quant": None if kind == "dense" else INT4.to_json(),
                    "kernel_variants": run.kernel_variants, "counterpart_gguf_type": gguf_type,
                    "decode_step": run.decode_step, "compile_s": run.compile_s,
                }  # fmt: skip
                receipt = {
                    "name": name,
                    "config": config,
                    "samples": run.samples,
                    "derived": {},
                    "notes": _engine_notes(kind, run.kernel_variants),
                }
            else:
                engine_name, run = engines[kind]
                gguf_file = models.gguf[gguf_type]
                bench = llama_bench(tools, gguf_file, prompt=prompt_len, gen=gen, threads=threads,
                                    repeats=repeats, gpu_layers=gpu_layers)  # fmt: skip
                served = server_runs(tools, gguf_file, prompt_ids, gen=gen, threads=threads,
                                     repeats=repeats, gpu_layers=gpu_layers)  # fmt: skip
                samples = {"pp_tok_s": bench["pp_tok_s"], "tg_tok_s": bench["tg_tok_s"], **served}
                config = common | {
                    "gguf_type": gguf_type, "gguf_bytes": gguf_file.stat().st_size,
                    "gguf_tensor_types": models.tensor_types[gguf_type], "llama_cpp": tools.version(),
                    "llama_cpp_build": "cuda" if tools.cuda else "cpu", "n_gpu_layers": gpu_layers,
                    "kv_cache_type": "f16 (llama.cpp default)", "llama_bench": BENCH_METHOD,
                    "llama_server": SERVER_METHOD,
                    "engine": {"label": _engine_label(kind, dtype), "weights_format": kind, "dtype": dtype,
                               "device": device, "receipt_name": engine_name},
                }  # fmt: skip
                receipt = {
                    "name": f"llama.cpp.{label}.{gguf_type}",
                    "config": config,
                    "samples": samples,
                    "derived": ratios(run.samples, samples),
                    "notes": _llama_notes(gguf_type, kind, dtype),
                }
            units = {k: UNITS[k] for k in receipt["samples"]} | {
                k: "tok/s" if k.endswith("tok_s") else "ratio" for k in receipt["derived"]
            }
            written.append(
                write_receipt("llamacpp", **receipt, units=units, command=command, results_dir=results)
            )
    report(written)
    if not no_regenerate:
        regenerate(results)
