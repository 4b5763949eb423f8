"""Log set-up of both servers (`k3 serve`, `kimi-engine serve`): `--log-format text` (one readable line per
record) or `json` (one JSON object per line, for log shippers: ts, level, logger, msg, and the finished
request's fields).

The per-request fields come from the `extra=` of a finished-request log call and only those named in
REQUEST_FIELDS are written: counts, codes and timings, never prompts, outputs or keys. Standard library
only: k3 runs without the engine's dependencies.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

import click

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# What a finished-request line may carry into a JSON record (the servers' `extra=` names).
REQUEST_FIELDS = (
    "method",
    "path",
    "status",
    "latency_ms",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "dialect",
    "preset",
)

log_format_option = click.option(
    "--log-format",
    type=click.Choice(LOG_FORMATS),
    default="text",
    show_default=True,
    help="text: one readable line per record; json: one JSON object per line (ts, level, logger, msg, and "
    "a finished request's method, path, status, latency_ms and token counts; never prompts or keys).",
)


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for name in REQUEST_FIELDS:
            if name in record.__dict__:
                out[name] = record.__dict__[name]
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def configure_logging(level: str | int, log_format: str = "text") -> None:
    """Route every logger (uvicorn's too: start it with `log_config=None`) to one stderr handler."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, got {log_format!r}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level, handlers=[handler], force=True)
