"""Server configuration: everything `k3 serve` can set, with its defaults."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_UPSTREAM = "http://127.0.0.1:8000/v1"
DEFAULT_MODEL = "kimi-linear"

# Values accepted today. The text tool parsers (k3/tools) and the other reasoning vehicles
# (k3/reasoning) add theirs when they land; until then other names fail with a clear message.
TOOL_PARSERS = ("passthrough",)
REASONING_FIELDS = ("reasoning_content", "reasoning", "none")


@dataclass(frozen=True, slots=True)
class Config:
    upstream: str = DEFAULT_UPSTREAM  # OpenAI-compatible base URL; `/chat/completions` is appended
    upstream_api_key: str | None = None
    model: str = DEFAULT_MODEL  # every client model name maps to this ...
    small_model: str | None = None  # ... except small/fast ones (haiku, *-mini, ...) when this is set
    client: str | None = None  # pin one preset instead of detecting per request
    api_key: str | None = None  # require this token from clients (Bearer or x-api-key)
    reasoning_field: str = "reasoning_content"  # where the engine reads reasoning on assistant turns
    tool_parser: str = "passthrough"  # text tool-call parser applied to the engine's content
    connect_timeout: float = 10.0
    read_timeout: float = 600.0
    max_body_bytes: int = 64 * 1024 * 1024
    keepalive_interval: float = 15.0  # seconds of upstream silence before a keep-alive frame

    def __post_init__(self) -> None:
        if self.tool_parser not in TOOL_PARSERS:
            raise ValueError(
                f"--tool-parser {self.tool_parser!r} is not available yet; available: {', '.join(TOOL_PARSERS)}"
            )
        if self.reasoning_field not in REASONING_FIELDS:
            raise ValueError(
                f"--reasoning-field {self.reasoning_field!r} is not available yet; "
                f"available: {', '.join(REASONING_FIELDS)}"
            )
        for name in ("connect_timeout", "read_timeout", "keepalive_interval"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.max_body_bytes <= 0:
            raise ValueError("max_body_bytes must be positive")

    @property
    def upstream_base(self) -> str:
        return self.upstream.rstrip("/")
