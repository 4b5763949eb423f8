"""`--tool-parser` names and the factory."""

from __future__ import annotations

from collections.abc import Callable

from k3.tools.events import Parser
from k3.tools.hermes import HermesParser
from k3.tools.json_calls import JsonCallParser
from k3.tools.kimi_k2 import KimiK2Parser
from k3.tools.kimi_k3 import KimiK3Parser
from k3.tools.passthrough import PassthroughParser
from k3.tools.pythonic import PythonicParser

_FACTORIES: dict[str, Callable[[list[dict] | None], Parser]] = {
    "kimi_k3": lambda tools: KimiK3Parser(),
    "kimi": lambda tools: KimiK2Parser(),
    "hermes": lambda tools: HermesParser(),
    "json": JsonCallParser,
    "pythonic": PythonicParser,
    "passthrough": lambda tools: PassthroughParser(),
}

PARSER_NAMES: tuple[str, ...] = tuple(_FACTORIES)


def make_parser(name: str, tools: list[dict] | None = None) -> Parser:
    """A fresh parser for one model turn. `tools` are the request's OpenAI-Chat tool definitions."""
    try:
        factory = _FACTORIES[name]
    except KeyError:
        raise ValueError(f"unknown tool parser {name!r}; choose one of: {', '.join(PARSER_NAMES)}") from None
    return factory(tools)
