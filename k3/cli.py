"""`k3`: the protocol adapter's command line (serve, presets, detect, doctor)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import re
import sqlite3
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import httpx

from common.click_options import count_option, float_option, text_option
from common.listen import listening_socket
from common.logs import configure_logging, log_format_option
from k3 import VERSION, presets
from k3.config import (
    DEFAULT_MODEL,
    DEFAULT_UPSTREAM,
    TOOL_PARSER_ALIASES,
    TOOL_PARSERS,
    Config,
    without_credentials,
)
from k3.detect import ROUTE_DIALECT, detect
from k3.errors import ProxyError

if TYPE_CHECKING:
    from k3.app import K3App
    from k3.cassettes import Recorder

DOCTOR_CLIENTS = ("claude-code", "codex", "opencode", "aider")


def default_state_dir() -> str:
    """Where the signing secret lives unless --state-dir says otherwise: $XDG_STATE_HOME/k3."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "k3")


class Duration(click.ParamType):
    """Seconds, or a number with a unit: 90s, 30m, 12h, 7d."""

    name = "duration"
    _UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
    _FORM = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", re.I)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, int | float):
            return float(value)
        match = self._FORM.fullmatch(str(value))
        if match is None or float(match.group(1)) <= 0:
            self.fail(f"{value!r} is not a positive duration such as 3600, 90m, 12h or 7d", param, ctx)
        return float(match.group(1)) * self._UNITS[match.group(2).lower()]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="local-kimi", prog_name="k3", message="%(prog)s %(version)s")
def main() -> None:
    """k3: let Claude Code, Codex, opencode, aider and the SDKs talk to a local OpenAI-Chat engine."""


@main.command()
def version() -> None:
    """Print k3's version."""
    click.echo(f"k3 {VERSION}")


def _public_base(host: str, port: int) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    if ":" in shown:
        shown = f"[{shown}]"
    return f"http://{shown}:{port}"


def _shown_token(api_key: str | None) -> str:
    """The client token in printed setup: never the key itself (terminals and logs get copied)."""
    return "<your --api-key>" if api_key else "local"


SHELLS = ("posix", "powershell", "cmd")


def default_shell() -> str:
    """The paste-block syntax for this system: cmd or PowerShell on Windows, else posix."""
    if os.name != "nt":
        return "posix"
    return "powershell" if os.environ.get("PSModulePath") else "cmd"


def shell_line(line: str, shell: str) -> str:
    """A setup line (written for a posix shell) in `shell`'s syntax: `export` lines and comments."""
    if shell == "posix":
        return line
    if line.startswith("export ") and "=" in line:
        name, _, value = line[len("export ") :].partition("=")
        return f'$env:{name} = "{value}"' if shell == "powershell" else f"set {name}={value}"
    if line.startswith("#") and shell == "cmd":
        return "REM" + line[1:]
    return line


def _print_setup(
    names: tuple[str, ...], base: str, token: str, model: str, small_model: str | None, shell: str = "posix"
) -> None:
    for name in names:
        preset = presets.get(name)
        click.echo(f"\n# {preset.title}")
        for line in presets.setup_lines(preset, base=base, token=token, model=model, small_model=small_model):
            click.echo(f"  {shell_line(line, shell)}")


upstream_option = click.option(
    "--upstream",
    default=DEFAULT_UPSTREAM,
    show_default=True,
    help="Base URL of the OpenAI-compatible engine; /chat/completions is appended.",
)
upstream_key_option = click.option(
    "--upstream-api-key",
    envvar="K3_UPSTREAM_API_KEY",
    help="Bearer token sent to the engine (env K3_UPSTREAM_API_KEY).",
)
model_option = click.option(
    "--model", default=DEFAULT_MODEL, show_default=True, help="Engine model every client model name maps to."
)
small_model_option = click.option(
    "--small-model", help="Engine model for small/fast client models (haiku, *-mini, ...); default: --model."
)
mock_option = click.option(
    "--mock",
    is_flag=True,
    help="Answer from k3's scripted fake engine in-process (echoes the last user message; no GPU, "
    "no --upstream needed): try a client's setup before an engine runs.",
)


def engine_target_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The options naming the engine k3 talks to, which `serve` and `setup` both take."""
    for option in reversed(
        (upstream_option, upstream_key_option, model_option, small_model_option, mock_option)
    ):
        command = option(command)
    return command


@main.command()
@engine_target_options
@text_option("--host", default="127.0.0.1", help="Bind address (keep loopback unless --api-key).")
@click.option(
    "--port",
    "-p",
    default=8080,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="Port; 0 picks a free one.",
)
@click.option(
    "--client", "-c", type=click.Choice([p.name for p in presets.PRESETS]), help="Pin one client preset."
)
@click.option(
    "--api-key",
    envvar="K3_SERVE_API_KEY",
    help="Require this token (Bearer or x-api-key) from clients (env K3_SERVE_API_KEY; not K3_API_KEY, "
    "which is the variable Codex sends its key from).",
)
@text_option(
    "--reasoning-field",
    default="reasoning_content",
    help="Where the engine carries reasoning, both ways: a message key (reasoning_content, reasoning, "
    "or any other key name, sent back under it), inline <think> in the content (think, alias inline), "
    "the Kimi K3 think channel (kimi_k3), nowhere (none), or auto: read whichever each reply uses "
    "and send it back the same way.",
)
@click.option(
    "--tool-parser",
    type=click.Choice((*TOOL_PARSERS, *TOOL_PARSER_ALIASES)),
    default=None,
    help="Parser for tool calls the engine writes in its text (native tool_calls are always read); "
    "kimi_k2 is kimi, none is passthrough. "
    "Default: the client preset's (passthrough); kimi_k3 with --reasoning-field kimi_k3.",
)
@click.option(
    "--show-reasoning/--hide-reasoning",
    default=None,
    help="Show reasoning to clients (thinking blocks, reasoning items, reasoning_content) or hide it. "
    "Default: the client preset's (shown). Hidden reasoning is still restored on the next turn.",
)
@click.option(
    "--ledger",
    "ledger_path",
    type=click.Path(dir_okay=False),
    envvar="K3_LEDGER",
    help="SQLite file (WAL) keeping each turn's exact reasoning and tool calls, so a restart loses "
    "nothing (env K3_LEDGER); created mode 0600, refused when other users can read it. Default: in memory.",
)
@count_option(
    "--ledger-max-entries", default=4096, help="Ledger size in turns (least recently used go first)."
)
@float_option("--ledger-max-mb", default=128.0, minimum=0, above=True, help="Ledger size in MiB.")
@click.option(
    "--ledger-ttl",
    default="7d",
    show_default=True,
    type=Duration(),
    help="Forget a turn unused this long (3600, 90m, 12h, 7d).",
)
@click.option(
    "--state-dir",
    envvar="K3_STATE_DIR",
    type=click.Path(file_okay=False),
    help="Directory of the signing secret (k3-signing.key, mode 0600) that authenticates reasoning "
    "signatures across restarts (env K3_STATE_DIR). Refused when group or others can write it, or "
    "read the key, or the key is a symlink. Default: $XDG_STATE_HOME/k3 or ~/.local/state/k3.",
)
@float_option("--connect-timeout", default=10.0, help="Seconds to connect upstream.")
@float_option("--read-timeout", default=600.0, help="Longest upstream silence, in seconds.")
@float_option("--max-body-mb", default=64.0, help="Largest client body (413 above).")
@float_option(
    "--max-sse-line-mb",
    default=8.0,
    minimum=0,
    above=True,
    help="Longest line of the engine's SSE stream; a longer one ends the turn with an error event.",
)
@float_option("--keepalive", default=15.0, help="Seconds of silence before a stream keep-alive.")
@float_option(
    "--shutdown-grace",
    default=5.0,
    minimum=0,
    help="Seconds a shutdown (SIGTERM, Ctrl-C) lets turns in flight finish; the rest then end with "
    "an error event in their client's dialect.",
)
@click.option(
    "--strict-routes/--no-strict-routes",
    default=False,
    show_default=True,
    help="With --client: answer 404 on the routes of dialects that client does not speak.",
)
@click.option(
    "--cors-origin",
    "cors_origins",
    multiple=True,
    metavar="ORIGIN",
    help="Allow browser requests from this origin (repeatable; any method and header). Default: CORS off.",
)
@click.option(
    "--record",
    "record_dir",
    type=click.Path(file_okay=False),
    help="Write one cassette (JSON: request, engine exchange, reply; credentials redacted) per turn "
    "into this directory, for `k3 replay`.",
)
@click.option("--record-compress", is_flag=True, help="Gzip the cassettes (.json.gz).")
@click.option(
    "--public-url", help="Base URL shown in the setup block (e.g. behind a tunnel); default: HOST:PORT."
)
@click.option(
    "--shell",
    type=click.Choice(SHELLS),
    default=None,
    help="Syntax of the setup block's environment lines. Default: guessed from the system.",
)
@click.option(
    "--access-log/--no-access-log",
    default=False,
    show_default=True,
    help="Log one line per HTTP request (method, path, status) at INFO. Per-turn detail "
    "(preset, models, tools) is at --log-level debug.",
)
@click.option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["trace", "debug", "info", "warning", "error", "critical"]),
    help="Threshold of k3's log (stderr); trace adds uvicorn's protocol detail below debug.",
)
@log_format_option
def serve(
    upstream: str,
    upstream_api_key: str | None,
    model: str,
    small_model: str | None,
    mock: bool,
    host: str,
    port: int,
    client: str | None,
    api_key: str | None,
    reasoning_field: str,
    tool_parser: str | None,
    show_reasoning: bool | None,
    ledger_path: str | None,
    ledger_max_entries: int,
    ledger_max_mb: float,
    ledger_ttl: float,
    state_dir: str | None,
    connect_timeout: float,
    read_timeout: float,
    max_body_mb: float,
    max_sse_line_mb: float,
    keepalive: float,
    shutdown_grace: float,
    strict_routes: bool,
    cors_origins: tuple[str, ...],
    record_dir: str | None,
    record_compress: bool,
    public_url: str | None,
    shell: str | None,
    access_log: bool,
    log_level: str,
    log_format: str,
) -> None:
    """Serve the three client dialects on HOST:PORT in front of the engine at --upstream."""
    import uvicorn

    from k3.app import create_app
    from k3.draining import DrainingServer

    try:
        config = Config(
            upstream=upstream,
            upstream_api_key=upstream_api_key,
            model=model,
            small_model=small_model,
            client=client,
            api_key=api_key,
            reasoning_field=reasoning_field,
            tool_parser=tool_parser,
            show_reasoning=show_reasoning,
            ledger_path=ledger_path,
            ledger_max_entries=ledger_max_entries,
            ledger_max_bytes=max(1, int(ledger_max_mb * 1024 * 1024)),
            ledger_ttl=ledger_ttl,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            max_body_bytes=int(max_body_mb * 1024 * 1024),
            max_sse_line_bytes=max(1, int(max_sse_line_mb * 1024 * 1024)),
            keepalive_interval=keepalive,
            strict_routes=strict_routes,
            cors_origins=cors_origins,
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    state_dir = _usable_state_dir(state_dir)  # only once the options are known to be good
    config = dataclasses.replace(config, state_dir=state_dir)
    try:
        sock = listening_socket(host, port)  # before announcing the address
    except OSError as exc:
        raise click.UsageError(f"cannot bind {host}:{port}: {exc}") from None
    port = sock.getsockname()[1]
    base = _public_base(host, port)
    click.echo(f"k3 listening on {base}")
    click.echo(
        (
            "upstream mock engine (no GPU needed)"
            if mock
            else f"upstream {config.upstream_base}/chat/completions"
        )
        + f"  model {model}"
        + (f"  small {small_model}" if small_model else "")
    )
    click.echo(
        f"client {'pinned: ' + client if client else f'auto-detected per request ({len(presets.PRESETS)} presets)'}"
    )
    click.echo(
        f"reasoning field {config.reasoning_field}, tool parser {config.tool_parser or 'per preset'}; ledger "
        + (ledger_path or "in memory")
        + (f", signing key in {state_dir}" if state_dir else ", signatures valid until restart")
    )
    if record_dir:
        click.echo(f"record {record_dir}" + (" (gzip)" if record_compress else ""))
    click.echo(
        "auth: on (clients must send the --api-key as Bearer or x-api-key)"
        if api_key
        else "auth: off (any local client may connect)"
    )
    if host not in ("127.0.0.1", "::1", "localhost") and not api_key:
        click.echo("warning: listening beyond loopback without --api-key", err=True)
    _print_setup(
        (client,) if client else ("claude-code", "openai"),
        (public_url or base).rstrip("/"),
        _shown_token(api_key),
        model,
        small_model,
        shell or default_shell(),
    )
    click.echo("\nother clients: k3 presets -v   (setup for every preset)")
    sys.stdout.flush()
    k3_level = {"trace": "DEBUG"}.get(log_level, log_level.upper())  # trace: uvicorn's, below debug
    configure_logging(k3_level, log_format)
    logging.getLogger("httpx").setLevel(
        max(logging.WARNING, logging.getLogger().level)
    )  # no line per side call
    logging.getLogger("k3.access").setLevel(logging.INFO if access_log else logging.WARNING)
    try:
        app: K3App | Recorder = create_app(config, upstream_transport=mock_transport() if mock else None)
        if record_dir:
            from k3.cassettes import recording

            app = recording(app, record_dir, config, record_compress)
    except (OSError, ValueError, sqlite3.Error) as exc:  # an unreadable ledger or secret
        raise click.UsageError(f"cannot open the reasoning ledger: {exc}") from None
    server = DrainingServer(
        # k3.access logs instead of uvicorn's access log; configure_logging's handler formats uvicorn's lines
        uvicorn.Config(app, log_level=log_level, log_config=None, access_log=False, lifespan="on"),
        app.state.k3.drain,
        shutdown_grace,
    )
    server.run(sockets=[sock])


def _usable_state_dir(state_dir: str | None) -> str | None:
    """The state directory, created if needed; None (with a warning) when it cannot be."""
    path = state_dir or default_state_dir()
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError as exc:
        if state_dir:
            raise click.UsageError(f"cannot use --state-dir {path}: {exc}") from None
        click.echo(f"warning: no state directory ({exc}); signatures will not survive a restart", err=True)
        return None
    return path


@main.command(name="replay")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option("--verbose", "-v", is_flag=True, help="Show the differences of matching cassettes too.")
@click.option(
    "--state-dir",
    envvar="K3_STATE_DIR",
    type=click.Path(file_okay=False),
    help="Signing-key directory the cassettes were recorded with (default: serve's).",
)
def replay_cmd(directory: Path, verbose: bool, state_dir: str | None) -> None:
    """Replay the cassettes `serve --record` wrote: does k3 still send the engine and the client
    what it did then (ids, timestamps and signatures aside)?"""
    from k3.cassettes import load_cassettes, replay

    cassettes = load_cassettes(directory) if directory.is_dir() else []
    if not cassettes:
        click.echo(f"no cassettes in {directory}")
        sys.exit(1)
    state = _usable_state_dir(state_dir)
    matching = 0
    for cassette in cassettes:
        diffs = asyncio.run(replay(cassette, state))
        matching += not diffs
        click.echo(f"{'pass' if not diffs else 'FAIL'}  {cassette.get('name')}")
        for line in diffs if diffs or verbose else ():
            click.echo(f"      {line}")
    click.echo(f"{matching}/{len(cassettes)} cassettes match")
    sys.exit(0 if matching == len(cassettes) else 1)


@main.command(name="presets")
@click.option("--verbose", "-v", is_flag=True, help="Add detection rules, notes and setup.")
def presets_cmd(verbose: bool) -> None:
    """List the client presets."""
    width = max(len(p.name) for p in presets.PRESETS)
    for preset in presets.PRESETS:
        click.echo(
            f"{preset.name:<{width}}  {preset.status:<11}  {','.join(preset.dialects):<24}  {preset.title}"
        )
        if verbose:
            for rule in preset.rules:
                click.echo(f"    +{rule.weight:<3} {rule.label}")
            if preset.notes:
                click.echo(f"    note: {preset.notes}")
            for line in presets.setup_lines(
                preset, base="http://127.0.0.1:8080", token="local", model=DEFAULT_MODEL, small_model=None
            ):
                click.echo(f"    | {line}")


def _captured_requests(data: Any) -> list[dict[str, Any]]:
    """Requests from a JSON file: one request, a list of them, or a capture file with scenarios."""
    if isinstance(data, dict) and isinstance(data.get("scenarios"), dict):
        return [r for s in data["scenarios"].values() for r in s.get("requests", [])]
    if isinstance(data, list):
        return [r for r in data if isinstance(r, dict)]
    if isinstance(data, dict):
        return [data]
    raise click.UsageError("the file must hold a request object, a list of them, or a capture with scenarios")


def _header_dict(raw: Any) -> dict[str, str]:
    pairs = raw.items() if isinstance(raw, dict) else raw or []
    return {str(k).lower(): str(v) for k, v in pairs}


@main.command(name="detect")
@click.argument("capture", required=False, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@text_option("--path", default="/v1/messages", help="Route, when no CAPTURE is given.")
@click.option("--header", "-H", "headers", multiple=True, help="'Name: value' header, repeatable.")
@click.option(
    "--client", "-c", type=click.Choice([p.name for p in presets.PRESETS]), help="Pretend --client is set."
)
def detect_cmd(capture: Path | None, path: str, headers: tuple[str, ...], client: str | None) -> None:
    """Explain which preset a request gets and why.

    CAPTURE is a JSON file with a request ({"path", "headers", "body"}), a list of requests, or a
    capture file of the form in shared/reference/clients. Without it, --path and -H describe one.
    """
    if capture is not None:
        try:
            requests = _captured_requests(json.loads(capture.read_text()))
        except json.JSONDecodeError as exc:
            raise click.UsageError(f"{capture} is not JSON: {exc}") from None
    else:
        parsed = {}
        for line in headers:
            name, sep, value = line.partition(":")
            if not sep or not name.strip():
                raise click.UsageError(f"bad header {line!r}; expected 'Name: value'")
            parsed[name.strip()] = value.strip()
        requests = [{"method": "POST", "path": path, "headers": parsed}]
    for request in requests:
        route = str(request.get("path", "/")).split("?")[0]
        dialect = ROUTE_DIALECT.get(route)
        if dialect is None and route != "/v1/models":
            click.echo(
                f"{request.get('method', 'POST')} {request.get('path')}: not a turn route (no detection)"
            )
            continue
        body = request.get("body") if isinstance(request.get("body"), dict) else None
        found = detect(dialect, _header_dict(request.get("headers")), body, client)
        kind = " (forced)" if found.forced else " (route default)" if found.fallback else ""
        click.echo(f"{request.get('method', 'POST')} {request.get('path')} -> {found.preset.name}{kind}")
        click.echo(f"    score {found.score}: {found.reason}")
        click.echo(f"    dialect {dialect or 'any'}; {found.preset.title}")


def mock_transport() -> httpx.AsyncBaseTransport:
    """The `--mock` engine: k3's scripted fake, called in-process instead of over the network."""
    from k3.testing.fake_upstream import FakeUpstream

    return httpx.ASGITransport(app=FakeUpstream())


@main.command()
@engine_target_options
@click.option(
    "--port", "-p", default=8080, show_default=True, type=int, help="Port k3 will serve on (for the setup)."
)
@click.option(
    "--api-key",
    envvar="K3_SERVE_API_KEY",
    help="Client token k3 will require (for the setup; env K3_SERVE_API_KEY).",
)
@click.option("--no-generate", is_flag=True, help="Skip the one short streamed completion.")
def doctor(
    upstream: str,
    upstream_api_key: str | None,
    model: str,
    small_model: str | None,
    mock: bool,
    port: int,
    api_key: str | None,
    no_generate: bool,
) -> None:
    """Probe the engine, then print copy-paste setup for Claude Code, Codex, opencode and aider."""
    config = Config(upstream=upstream, upstream_api_key=upstream_api_key, model=model)
    ok, engine = asyncio.run(_doctor(config, not no_generate, mock_transport() if mock else None))
    _print_setup(DOCTOR_CLIENTS, _public_base("127.0.0.1", port), _shown_token(api_key), model, small_model)
    parser = ENGINE_TOOL_PARSERS.get(engine or "")
    click.echo(
        f"\nstart k3: k3 serve --upstream {without_credentials(upstream)} --model {model}"
        + (f" --small-model {small_model}" if small_model else "")
        + (f" --tool-parser {parser}   # {engine} writes tool calls in its text" if parser else "")
    )
    sys.exit(0 if ok else 1)


# Engines that answer GET /version with their name, and the --tool-parser their text needs.
ENGINE_TOOL_PARSERS = {"kimi-engine": "kimi"}


async def _doctor(
    config: Config, generate: bool, transport: httpx.AsyncBaseTransport | None = None
) -> tuple[bool, str | None]:
    """-> (whether the engine answered every probe, the engine's name if its /version gives one)."""
    from k3.upstream import Upstream

    upstream = Upstream(config, transport)
    ok, engine = True, None
    try:
        click.echo(f"engine  {config.upstream_base}")
        try:
            models = await upstream.models()
            served = (
                "served"
                if config.model in models
                else f"NOT listed (the engine lists: {', '.join(models) or 'none'})"
            )
            click.echo(f"  ok    GET /models: model {config.model!r} {served}")
        except ProxyError as err:
            click.echo(f"  FAIL  GET /models: {err.message}")
            click.echo("        start the engine first (see docs/K3.md), or pass --upstream")
            return False, None
        engine = await upstream.engine_name()
        if engine:
            click.echo(f"  ok    GET /version: {engine}")
        context = await _max_context(upstream, config.model)
        if context is not None:
            short = context < CLAUDE_CODE_CONTEXT
            click.echo(
                f"  {'WARN' if short else 'ok  '}  max context {context} tokens"
                + (
                    f": Claude Code's first request (25 tools) may not fit; restart the engine with "
                    f"--max-context {CLAUDE_CODE_CONTEXT}"
                    if short
                    else ""
                )
            )
        messages = [{"role": "user", "content": "Say OK."}]
        count = await upstream.count_tokens({"model": config.model, "messages": messages})
        tokenizer = (
            f"{upstream.tokenizer} /tokenize ({count} tokens)" if count is not None else "none (estimates)"
        )
        click.echo(f"  ok    tokenizer for count_tokens: {tokenizer}")
        if generate:
            ok = await _probe_stream(upstream, config.model, messages)
    finally:
        await upstream.aclose()
    return ok, engine


# Context that holds Claude Code's first request (system prompt and 25 tools) with room for the reply, in
# kimi-engine's synthetic and trained models' tokens (kimi-engine serve's default --max-context).
CLAUDE_CODE_CONTEXT = 65536


async def _max_context(upstream: Any, model: str) -> int | None:
    """`max_model_len` of the model in GET /models (vLLM and kimi-engine list it), else None."""
    try:
        response = await upstream.client.get(upstream.base + "/models", timeout=10.0)
        entries = response.json().get("data", []) if response.status_code == 200 else []
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    for entry in entries:
        if (
            isinstance(entry, dict)
            and entry.get("id") == model
            and isinstance(entry.get("max_model_len"), int)
        ):
            return entry["max_model_len"]
    return None


async def _probe_stream(upstream: Any, model: str, messages: list[dict[str, Any]]) -> bool:
    import orjson

    payload = {
        "model": model,
        "messages": messages,
        "stream": True,
        "max_tokens": 16,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    seen = {"content": 0, "reasoning": 0, "usage": False}
    try:
        async with upstream.stream(orjson.dumps(payload)) as chunks:
            async for batch in chunks:
                for chunk in batch:
                    seen["usage"] = seen["usage"] or isinstance(chunk.get("usage"), dict)
                    for choice in chunk.get("choices") or []:
                        delta = choice.get("delta") or {}
                        seen["content"] += bool(delta.get("content"))
                        seen["reasoning"] += bool(delta.get("reasoning_content") or delta.get("reasoning"))
    except ProxyError as err:
        click.echo(f"  FAIL  streamed completion: HTTP {err.status}: {err.message}")
        return False
    elapsed = time.perf_counter() - started
    click.echo(
        f"  ok    streamed completion in {elapsed:.2f}s: {seen['content']} content and {seen['reasoning']} "
        f"reasoning chunks, usage {'sent' if seen['usage'] else 'NOT sent (k3 estimates it)'}"
    )
    return True
