"""The whole reply is a Python list of calls: `[get_weather(city="Beijing", days=3), other(x=1)]`.

Arguments must be literals. Positional arguments are mapped to parameter names in the order of
the request's tool schema (`parameters.properties`); when that is impossible (no schema, unknown
tool, too many, or a name given twice) the reply is rejected: it is shown as text and the reason
is logged, never a call with arguments silently dropped. When the request declares tools, only
their names count as calls.

A reply that cannot begin with `[name(` is streamed as text at once; once it does, it is
buffered to the end, since only the whole reply can be a call list.
"""

from __future__ import annotations

import ast
import json
import logging
import re

from k3.tools.events import Event, Text, ToolCall
from k3.tools.ids import new_call_id
from k3.tools.schemas import parameter_names

log = logging.getLogger("k3.tools.pythonic")

_COMMITTED = re.compile(r"\s*\[\s*[A-Za-z_]\w*\s*\(")
_VIABLE = re.compile(r"\s*(?:\[\s*(?:[A-Za-z_]\w*\s*)?)?")


class Rejected(ValueError):
    """The reply looked like a call list but cannot become one."""


def _literal(node: ast.expr, where: str) -> object:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError) as exc:
        raise Rejected(f"{where}: not a literal") from exc


def parse_call_list(text: str, schemas: dict[str, list[str]]) -> list[tuple[str, str]]:
    """[(name, JSON arguments)] for a call-list reply; raises Rejected with the reason otherwise."""
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
        raise Rejected("not a Python expression") from exc
    if not isinstance(tree, ast.List) or not tree.elts:
        raise Rejected("not a list of calls")
    calls = []
    for node in tree.elts:
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            raise Rejected("list item is not a call to a plain name")
        name = node.func.id
        params = schemas.get(name)
        if schemas and params is None:
            raise Rejected(f"{name}: not one of the request's tools")
        args: dict[str, object] = {}
        if node.args:
            if params is None:
                raise Rejected(f"{name}: positional arguments need the tool's schema to be named")
            if len(node.args) > len(params):
                raise Rejected(f"{name}: {len(node.args)} positional arguments, schema has {len(params)}")
            for param, arg in zip(params, node.args, strict=False):
                if isinstance(arg, ast.Starred):
                    raise Rejected(f"{name}: *args")
                args[param] = _literal(arg, f"{name}({param})")
        for kw in node.keywords:
            if kw.arg is None:
                raise Rejected(f"{name}: **kwargs")
            if kw.arg in args:
                raise Rejected(f"{name}: argument {kw.arg!r} given twice")
            args[kw.arg] = _literal(kw.value, f"{name}({kw.arg})")
        try:
            calls.append((name, json.dumps(args, ensure_ascii=False, allow_nan=False)))
        except (TypeError, ValueError) as exc:
            raise Rejected(f"{name}: a value has no JSON form") from exc
    return calls


class PythonicParser:
    def __init__(self, tools: list[dict] | None = None) -> None:
        self._schemas = parameter_names(tools)
        self._held: list[str] = []
        self._head = ""  # the opening, while it may still become `[name(`
        self._state = "head"  # head | body | text

    def feed(self, chunk: str) -> list[Event]:
        if self._state == "text":
            return [Text(chunk)] if chunk else []
        if self._state == "body":
            self._held.append(chunk)
            return []
        self._head += chunk
        if _COMMITTED.match(self._head):
            self._state, self._held = "body", [self._head]
        elif not _VIABLE.fullmatch(self._head):
            self._state = "text"
            return [Text(self._head)]
        return []

    def finish(self) -> list[Event]:
        state, text = self._state, "".join(self._held) if self._state == "body" else self._head
        self._state, self._held, self._head = "text", [], ""
        if state != "body":
            return [Text(text)] if state == "head" and text else []
        try:
            calls = parse_call_list(text, self._schemas)
        except Rejected as exc:
            log.warning("pythonic tool call rejected, shown as text: %s", exc)
            return [Text(text)]
        return [ToolCall(new_call_id(), name, args) for name, args in calls]
