"""The client dialects, each a module implementing `k3.dialects.protocol.Dialect`, by name."""

from k3.dialects import anthropic, chat, responses
from k3.dialects.protocol import Dialect

DIALECTS: dict[str, Dialect] = {"anthropic": anthropic, "chat": chat, "responses": responses}

__all__ = ["DIALECTS", "Dialect"]
