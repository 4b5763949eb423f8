"""`kimi-engine serve`: load the model under a memory cap and serve the OpenAI Chat Completions API."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from common.click_options import count_option, text_option
from common.listen import listening_socket
from common.logs import configure_logging, log_format_option
from engine.cli_options import (
    cuda_graphs_option,
    device_option,
    dtype_option,
    kda_kernel_option,
    memory_cap_option,
    prefill_chunk_option,
    quant_option,
    quant_plan,
    resolve_device,
    resolve_dtype,
    resolve_memory_cap,
    synthetic_option,
)
from engine.kernels import DEFAULT_SELECTION
from engine.runtime.compiled import step_option


@click.command("serve")
@click.option(
    "--weights",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="Checkpoint directory (Hugging Face layout, real or from `kimi-engine synth`), or an INT4 artifact "
    "from `kimi-engine quantize` (recognised by its manifest.json; served with the packed kernels).",
)
@synthetic_option(
    "Random weights of this size, built in memory (no download). Default: tiny, when --weights is not given."
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the synthetic weights.")
@quant_option(
    "Quantise the synthetic weights in memory with this plan (docs/INT4.md), one tensor at a time on the "
    "device, and serve them with the packed kernels. For a checkpoint, build an artifact with `kimi-engine "
    "quantize` instead. Default: none.",
)
@click.option(
    "--kernels",
    "kernel_selection",
    default=DEFAULT_SELECTION,
    show_default=True,
    help="Kernels of quantised weights: 'default' (KIMI_KERNELS, then the shipped defaults of "
    "engine/kernels/defaults.py) or a variant name such as 'reference' or 'triton' for every operation that has it.",
)
@click.option(
    "--verify/--no-verify",
    default=True,
    show_default=True,
    help="Re-hash an INT4 artifact's shards and self-check a sample before loading it.",
)
@device_option()
@dtype_option()
@memory_cap_option("Memory the weights, one --max-context sequence and the workspaces are planned under")
@count_option(
    "--max-context",
    default=65536,
    minimum=2,
    help="Longest sequence (prompt + output); refused at start-up if it cannot fit under the cap. The "
    "default holds Claude Code's first request (25 tools) in the synthetic and trained models' tokens.",
)
@prefill_chunk_option
@count_option(
    "--max-sequences",
    default=4,
    help="Sequences in flight at once; they decode together, one batched step for all (a compiled step is "
    "warmed up at start for every batch bucket 1, 2, 4, ... up to this).",
)
@count_option(
    "--max-queue",
    default=16,
    minimum=0,
    help="Requests that may wait for a free sequence slot; beyond that, 429 with Retry-After.",
)
@click.option(
    "--prefix-cache-gib",
    type=click.FloatRange(min=0),
    help="Host memory for prompt-state snapshots (0 turns the prefix cache off). Default: 4 on a GPU, 1 on the CPU.",
)
@cuda_graphs_option
@step_option
@kda_kernel_option
@text_option("--host", default="127.0.0.1", help="Bind address (keep loopback).")
@click.option(
    "--port",
    "-p",
    type=click.IntRange(0, 65535),
    default=8000,
    show_default=True,
    help="Port; 0 picks a free one.",
)
@text_option("--served-model-name", default="kimi-linear", help="Model id in /v1/models and responses.")
@click.option(
    "--scripted-replies",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help='TESTING ONLY: JSON list of {"match", "reply"}; a request whose last message contains `match` is forced to write `reply`.',
)
@click.option(
    "--api-key",
    envvar="KIMI_ENGINE_API_KEY",
    help="Require `Authorization: Bearer KEY` on every route but /health, /metrics and /version "
    "(also read from KIMI_ENGINE_API_KEY). Give k3 the same key with `k3 serve --upstream-api-key`.",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="info",
    show_default=True,
    help="info logs one line per finished request (status, latency, tokens; never prompts or keys).",
)
@log_format_option
def serve_command(
    weights: Path | None,
    synthetic: str | None,
    seed: int,
    quant: str | None,
    kernel_selection: str,
    verify: bool,
    device: str,
    dtype: str,
    memory_cap_gib: float | None,
    max_context: int,
    prefill_chunk: int,
    max_sequences: int,
    max_queue: int,
    prefix_cache_gib: float | None,
    cuda_graphs: bool,
    step: str | None,
    kda_kernel: str,
    host: str,
    port: int,
    served_model_name: str,
    scripted_replies: Path | None,
    api_key: str | None,
    log_level: str,
    log_format: str,
) -> None:
    """Serve Kimi-Linear over the OpenAI Chat Completions API (/v1/chat/completions, /v1/models,
    /health, /tokenize), on 127.0.0.1 by default.

    Start-up plans memory first: the weights, one max-context sequence and the prefill workspace must
    fit under the cap, or the command stops and says what would fit. Put k3 in front of it for Claude
    Code, Codex and other agents: `k3 serve --upstream http://127.0.0.1:8000/v1`.
    """
    import torch
    import uvicorn

    from engine.kernels import KernelSelectionError, named_choices
    from engine.runtime import LOAD_ERRORS, Scheduler, load_on_own_thread
    from engine.runtime.batch import buckets_upto
    from engine.runtime.compiled import inductor_cache_dir
    from engine.server.app import ServerContext, create_app
    from engine.server.chat_template import SYNTHETIC_CHAT_TEMPLATE, ChatTemplate
    from engine.server.scripted import ScriptedReplies, ScriptError

    configure_logging(log_level.upper(), log_format)  # before loading: its warnings are logged too
    if weights is not None and synthetic is not None:
        raise click.UsageError("give --weights or --synthetic, not both")
    if weights is None and synthetic is None:
        synthetic = "tiny"
    resolved = torch.device(resolve_device(device))
    memory_cap_gib = resolve_memory_cap(memory_cap_gib, resolved.type)
    try:
        kernels = named_choices(kernel_selection)
    except KernelSelectionError as e:
        raise click.BadParameter(str(e), param_hint="--kernels") from None
    try:
        torch_thread, engine = load_on_own_thread(
            weights=weights,
            synthetic=synthetic,
            seed=seed,
            quant=quant_plan(quant),
            kernels=kernels,
            verify=verify,
            device=resolved,
            dtype=resolve_dtype(dtype, resolved)[1],
            memory_cap_gib=memory_cap_gib,
            max_context=max_context,
            prefill_chunk=prefill_chunk,
            cuda_graphs=cuda_graphs,
            step=step,
            kda_kernel=kda_kernel,
            prefix_cache_gib=prefix_cache_gib,
        )
    except LOAD_ERRORS + (ValueError,) as e:
        raise click.ClickException(str(e)) from None
    try:
        template_source = engine.source.chat_template()
        if template_source is None and not engine.source.synthetic:
            raise click.ClickException(
                f"{weights} has no chat template (chat_template.jinja or tokenizer_config.json)"
            )
        template = ChatTemplate(
            template_source or SYNTHETIC_CHAT_TEMPLATE, special_tokens=_template_tokens(engine)
        )
        scripted = ScriptedReplies.from_file(scripted_replies, engine.tokenizer) if scripted_replies else None
    except ScriptError as e:
        raise click.ClickException(str(e)) from None
    scheduler = Scheduler(engine, max_active=max_sequences, max_queue=max_queue, torch_thread=torch_thread)
    context = ServerContext(engine, scheduler, template, served_model_name, scripted)

    try:
        sock = listening_socket(host, port)  # before announcing the address
    except OSError as e:
        raise click.ClickException(f"cannot bind {host}:{port}: {e}") from None
    _print_start_up(engine, scripted is not None)
    if engine.step == "compiled":
        click.echo(f"compiling the decode step (Inductor cache: {inductor_cache_dir()}) ...")
        for rows in buckets_upto(max_sequences):  # every batch bucket, so none compiles mid-stream
            sys.stdout.flush()
            compile_s = torch_thread.call(engine.warm_up, batch=rows)
            if compile_s is not None:
                click.echo(f"compiled the decode step for {rows} sequence(s) in {compile_s:.1f} s")
    shown_host = f"[{host}]" if ":" in host else host
    click.echo(
        f"kimi-engine listening on http://{shown_host}:{sock.getsockname()[1]}  (OpenAI API under /v1)"
    )
    if api_key:
        click.echo("auth: on (Authorization: Bearer <the --api-key>)")
    sys.stdout.flush()
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(context, api_key),
            log_level=log_level,
            log_config=None,  # configure_logging's handler formats uvicorn's lines too
            access_log=False,
            timeout_graceful_shutdown=5,
        )
    )
    try:
        server.run(sockets=[sock])
    finally:
        engine.close()


def _template_tokens(engine) -> dict[str, str]:
    """bos_token / eos_token, as chat templates expect them."""
    tok = engine.tokenizer
    names = {v: k for k, v in tok.special_tokens.items()}
    return {"bos_token": names[tok.bos_id], "eos_token": names[tok.eos_id]}


def _print_start_up(engine, scripted: bool) -> None:
    source, plan = engine.source, engine.plan
    gib = lambda n: f"{n / (1 << 30):.2f} GiB"
    click.echo(
        f"weights: {source.name}" + ("  [SYNTHETIC WEIGHTS: random output]" if source.synthetic else "")
    )
    click.echo(
        f"device {engine.device}, {str(engine.model.dtype).removeprefix('torch.')}, KDA prefill kernel "
        f"{engine.kda_kernel}, CUDA graphs {'on' if engine.pool.cuda_graphs else 'off'}, decode step {engine.step}"
    )
    variants = engine.kernel_variants
    kernels = (
        ", ".join(f"{op}={name}" for op, name in variants.items()) if variants else "none (dense weights)"
    )
    click.echo(f"packed kernels: {kernels}")
    cap = "none" if plan.cap_bytes is None else gib(plan.cap_bytes)
    click.echo(
        f"memory: weights {gib(plan.weights_bytes)}, cache {plan.cache_bytes_per_token:.0f} B/token "
        f"({gib(plan.cache_bytes_max_context)} at {plan.max_context} tokens), prefill workspace "
        f"{gib(plan.prefill_workspace_bytes)} (chunk {plan.prefill_chunk}), cap {cap}"
    )
    report = engine.memory_report()
    click.echo(f"measured after load: peak {report['peak_gib']:.2f} GiB")
    if scripted:
        click.echo("TESTING: scripted replies are on (matching requests get a forced reply)")
