"""What a client dialect provides: `k3.dialects.anthropic`, `chat` and `responses` each implement
`Dialect` as a module, and the turn (k3.app) uses nothing of them but this."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from k3.dialects.common import Turn
from k3.errors import ProxyError
from k3.ir import CanonicalRequest, CanonicalResponse, Event


class StreamEncoder(Protocol):
    """One streamed reply in the dialect's SSE frames."""

    keepalive: bytes  # the frame sent during silence

    def start(self) -> bytes: ...
    def feed(self, event: Event) -> bytes: ...
    def error(self, err: ProxyError) -> bytes: ...  # the frames that end a stream that failed


@runtime_checkable
class Dialect(Protocol):
    ID_PREFIX: str  # of the ids the dialect gives a reply (msg_, chatcmpl-, resp_)

    def ingress(self, body: dict[str, Any], default_model: str) -> CanonicalRequest:
        """The client's body as a canonical request (ProxyError 400 when it is malformed)."""
        ...

    def render(self, response: CanonicalResponse, turn: Turn) -> dict[str, Any]:
        """A whole reply as the dialect's JSON body."""
        ...

    @property
    def Stream(self) -> Callable[[Turn], StreamEncoder]:
        """The stream encoder for a turn (the module's class `Stream`)."""
        ...
