"""Server configuration: everything `k3 serve` can set, with its defaults."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote, urlsplit, urlunsplit

from k3.reasoning.fields import FIELD_ALIASES, check_field
from k3.sse import DEFAULT_MAX_LINE
from k3.tools.registry import PARSER_NAMES

DEFAULT_UPSTREAM = "http://127.0.0.1:8000/v1"
DEFAULT_MODEL = "kimi-linear"

TOOL_PARSERS = PARSER_NAMES  # kimi_k3, kimi, hermes, json, pythonic, passthrough
# Where the engine carries reasoning (k3.reasoning.fields), or "auto": read from each reply; any
# other key name is accepted too (sent back under that key).
REASONING_FIELDS = ("reasoning_content", "reasoning", "think", "kimi_k3", "none", "auto")
# The reference k3's names for the same things (its documented CLI values are all accepted).
TOOL_PARSER_ALIASES = {"kimi_k2": "kimi", "none": "passthrough"}


def without_credentials(url: str) -> str:
    """`url` with any `user:password@` removed."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


@dataclass(frozen=True, slots=True)
class Config:
    upstream: str = DEFAULT_UPSTREAM  # OpenAI-compatible base URL; `/chat/completions` is appended
    upstream_api_key: str | None = None
    model: str = DEFAULT_MODEL  # every client model name maps to this ...
    small_model: str | None = None  # ... except small/fast ones (haiku, *-mini, ...) when this is set
    client: str | None = None  # pin one preset instead of detecting per request
    api_key: str | None = None  # require this token from clients (Bearer or x-api-key)
    reasoning_field: str = "reasoning_content"  # how the engine carries reasoning, both ways
    tool_parser: str | None = None  # text tool-call parser for the engine's content; None: the preset's
    show_reasoning: bool | None = None  # reasoning shown to clients; None: the preset decides
    ledger_path: str | None = None  # SQLite file for the reasoning ledger; None: in memory
    ledger_max_entries: int = 4096
    ledger_max_bytes: int = 128 << 20
    ledger_ttl: float = 7 * 24 * 3600.0  # seconds since an entry was last used
    state_dir: str | None = None  # holds the signing secret; None: a secret that dies with the process
    connect_timeout: float = 10.0
    read_timeout: float = 600.0
    max_body_bytes: int = 64 * 1024 * 1024
    max_sse_line_bytes: int = DEFAULT_MAX_LINE  # longest upstream SSE line; longer ends the turn (502)
    keepalive_interval: float = 15.0  # seconds of upstream silence before a keep-alive frame
    strict_routes: bool = False  # with `client`: 404 on the routes of dialects it does not speak
    cors_origins: tuple[str, ...] = ()  # browser origins allowed (CORS); none: CORS off

    def __post_init__(self) -> None:
        # Aliases become the canonical name, so the rest of k3 sees one spelling.
        parser = TOOL_PARSER_ALIASES.get(self.tool_parser or "", self.tool_parser)
        object.__setattr__(self, "tool_parser", parser)
        if self.tool_parser is not None and self.tool_parser not in TOOL_PARSERS:
            raise ValueError(
                f"unknown --tool-parser {self.tool_parser!r}; choose one of: "
                f"{', '.join((*TOOL_PARSERS, *TOOL_PARSER_ALIASES))}"
            )
        if self.reasoning_field != "auto":
            try:
                object.__setattr__(self, "reasoning_field", check_field(self.reasoning_field))
            except ValueError:
                raise ValueError(
                    f"unknown --reasoning-field {self.reasoning_field!r}; choose one of: "
                    f"{', '.join((*REASONING_FIELDS, *FIELD_ALIASES))}, or name a message key"
                ) from None
        if self.reasoning_field == "kimi_k3" and self.tool_parser not in (None, "kimi_k3"):
            # The K3 think channel is part of the XTML that only the kimi_k3 parser reads.
            raise ValueError("--reasoning-field kimi_k3 needs --tool-parser kimi_k3 (or none given)")
        for name in ("connect_timeout", "read_timeout", "keepalive_interval", "ledger_ttl"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        for name in ("max_body_bytes", "max_sse_line_bytes", "ledger_max_entries", "ledger_max_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")

    @property
    def upstream_base(self) -> str:
        """The base URL without credentials: the only form k3 uses, prints, logs or returns."""
        return without_credentials(self.upstream).rstrip("/")

    @property
    def upstream_credentials(self) -> tuple[str, str] | None:
        """(user, password) from a `http://user:pass@host/v1` --upstream, sent as Basic auth."""
        parts = urlsplit(self.upstream)
        if parts.username is None and parts.password is None:
            return None
        return unquote(parts.username or ""), unquote(parts.password or "")

    def parser_for(self, preset_parser: str) -> str:
        """The text tool parser a turn uses: the flag, else what the reasoning field needs, else the preset's."""
        if self.tool_parser is not None:
            return self.tool_parser
        return "kimi_k3" if self.reasoning_field == "kimi_k3" else preset_parser
