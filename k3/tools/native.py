"""Folding an engine's native streamed `delta.tool_calls` into complete calls.

Each delta item is `{"index", "id"?, "function": {"name"?, "arguments"?}}`; several calls may be
streamed in parallel with interleaved indices. Rules, for engines that disagree on details:

* the first id seen for an index is kept (the id announced must be the id restored later);
  a call without any id gets a fresh one;
* name pieces are joined until the first argument piece; a piece that repeats (or extends) the
  name so far replaces it, since some engines resend the full (or the growing) name on every
  delta; once both a name and arguments have arrived, further names are ignored;
* argument pieces are concatenated byte for byte, including pieces that arrive before the name;
  an engine that sends an object instead of a string gets it as compact JSON text;
* an item without an index continues the call with the same id, or else starts a new call when
  it brings an id or a name, or else continues the call touched last.

Malformed items are skipped; nothing here raises on engine output. The pipeline streams from
this fold (`fold` per item, then the touched call's state); `calls()` is the folded result.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson

from k3.tools.events import ToolCall
from k3.tools.ids import new_call_id


@dataclass(slots=True)
class NativeCall:
    """One call as folded so far. `id` is "" until the engine (or `mint_id`) gives one."""

    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)  # the pieces, as the engine sent them

    def mint_id(self) -> str:
        if not self.id:
            self.id = new_call_id()
        return self.id


class NativeToolCalls:
    def __init__(self) -> None:
        self._calls: dict[int, NativeCall] = {}
        self._last: int | None = None

    def __len__(self) -> int:
        return len(self._calls)

    def __getitem__(self, key: int) -> NativeCall:
        return self._calls[key]

    def add(self, deltas: object) -> list[int]:
        """Fold one chunk's `delta.tool_calls` (or a complete message's `tool_calls`); the keys
        of the calls it touched, in order."""
        if not isinstance(deltas, list):
            return []
        touched = (self.fold(item) for item in deltas)
        return [key for key in touched if key is not None]

    def calls(self) -> list[ToolCall]:
        """The complete calls, in index order, with the argument strings exactly as streamed."""
        return [
            ToolCall(part.mint_id(), part.name, "".join(part.arguments) or "{}")
            for _, part in sorted(self._calls.items())
        ]

    def fold(self, item: object) -> int | None:
        """Fold one delta item; the key of the call it touched, or None for an item that is not an object."""
        if not isinstance(item, dict):
            return None
        fn = nested if isinstance(nested := item.get("function"), dict) else {}
        call_id = given_id if isinstance(given_id := item.get("id"), str) else ""
        name = named if isinstance(named := fn.get("name"), str) else ""
        arguments = fn.get("arguments")
        if isinstance(arguments, dict):
            arguments = orjson.dumps(arguments).decode()
        elif not isinstance(arguments, str):
            arguments = ""
        index = self._index_for(item.get("index"), call_id, name)
        part = self._calls.setdefault(index, NativeCall())
        self._last = index
        if call_id and not part.id:
            part.id = call_id
        if name and not (part.arguments and part.name):
            part.name = name if part.name and name.startswith(part.name) else part.name + name
        if arguments:
            part.arguments.append(arguments)
        return index

    def _index_for(self, index: object, call_id: str, name: str) -> int:
        if isinstance(index, int) and not isinstance(index, bool) and index >= 0:
            return index
        if call_id:
            for known, part in self._calls.items():
                if part.id == call_id:
                    return known
        if call_id or name or self._last is None:
            return max(self._calls, default=-1) + 1
        return self._last
