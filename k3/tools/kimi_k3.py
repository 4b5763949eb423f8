"""Kimi K3 XTML: `<|open|>NAME attr="v"<|sep|> … <|close|>NAME<|sep|>`, plus `<|end_of_msg|>`.

    <|open|>think<|sep|>private reasoning<|close|>think<|sep|>
    <|open|>response<|sep|>visible answer<|close|>response<|sep|>
    <|open|>tools<|sep|>
      <|open|>call tool="get_weather" index="1"<|sep|>
        <|open|>argument key="city" type="string"<|sep|>Beijing<|close|>argument<|sep|>
        <|open|>argument key="days" type="number"<|sep|>3<|close|>argument<|sep|>
      <|close|>call<|sep|>
    <|close|>tools<|sep|>

* `think` text is Reasoning; `response` text, and text outside any channel, is Text.
  `<|end_of_msg|>` resets the channel. Unknown tags outside calls are dropped.
* Typed `argument` elements (string, number, boolean, null, object, array) rebuild the argument
  object; non-string values keep the model's own JSON bytes. A `json` element gives the arguments
  byte for byte.
* Between calls inside `tools`, whitespace is formatting; prose is shown.
* A malformed call (stray text between elements, unknown or nested tags, a mismatched close, a
  missing key/type, a value that does not match its type, an empty tool name, a marker inside
  the call, or no close at all) is shown as text with the control tokens removed.

If the engine's generation prompt already opened a channel (for example it ends with
`<|open|>think<|sep|>`), feed that opening first so the parser starts in the same place.
"""

from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass, field

from common.scan import find_first, held_suffix
from k3.tools.arguments import JSON_ERRORS
from k3.tools.events import Event, Reasoning, Text, TokenStreamParser, ToolCall
from k3.tools.ids import new_call_id

OPEN, CLOSE, SEP, END = "<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"
TOKENS = (OPEN, CLOSE, SEP, END)

_ATTR = re.compile(r'([\w.-]+)="([^"]*)"')
_STRICT_HEADER = re.compile(r'\s*[^\s"=]+(?:\s+[\w.-]+="[^"]*")*\s*')
_TYPES = {
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
}


@dataclass(slots=True)
class _Tag:
    name: str
    attrs: dict[str, str]
    strict: bool  # the header is exactly `NAME key="value" …`

    @classmethod
    def parse(cls, header: str) -> _Tag:
        words = header.split()
        attrs = {k: html.unescape(v) for k, v in _ATTR.findall(header)}
        return cls(words[0] if words else "", attrs, bool(_STRICT_HEADER.fullmatch(header)))


@dataclass(slots=True)
class _Call:
    tag: _Tag
    raw: list[str] = field(default_factory=list)  # everything seen, controls removed, for degrading
    args: dict[str, str] = field(default_factory=dict)  # key -> JSON value text
    json_body: str | None = None
    element: _Tag | None = None
    body: list[str] = field(default_factory=list)
    malformed: bool = False

    def close_element(self, tag: _Tag) -> bool:
        """Close the open element `tag`; False when its body does not fit its declared type."""
        body = "".join(self.body)
        self.element, self.body = None, []
        if tag.name == "json":
            if self.json_body is not None or self.args or not _json_matches(body, tag.attrs.get("type")):
                return False
            self.json_body = body
            return True
        key, kind = tag.attrs.get("key"), tag.attrs.get("type")
        if key is None or self.json_body is not None:
            return False
        if kind == "string":
            self.args[key] = json.dumps(body, ensure_ascii=False)
            return True
        value = body.strip()
        if kind not in _TYPES or not _json_matches(value, kind):
            return False
        self.args[key] = value
        return True

    def result(self) -> ToolCall | None:
        name = self.tag.attrs.get("tool", "").strip()
        if self.malformed or not name or not self.tag.strict:
            return None
        if self.json_body is not None:
            arguments = self.json_body
        else:
            arguments = (
                "{"
                + ", ".join(f"{json.dumps(k, ensure_ascii=False)}: {v}" for k, v in self.args.items())
                + "}"
            )
        return ToolCall(new_call_id(), name, arguments)


def _json_matches(text: str, kind: str | None) -> bool:
    try:
        value = json.loads(text)
    except JSON_ERRORS:
        return False
    return kind is None or kind not in _TYPES or _TYPES[kind](value)


class KimiK3Parser(TokenStreamParser):
    def __init__(self) -> None:
        self._buf = ""
        self._tag_kind: str | None = None  # OPEN or CLOSE while a tag header is being read
        self._channel = "text"  # text | think
        self._in_tools = False
        self._prose_run = False  # inside tools, the current run between tags has shown prose
        self._call: _Call | None = None

    def _flush(self, out: list[Event]) -> None:
        # What is left is plain text, or an unterminated tag header shown as text.
        self._tag_kind = None
        self._text(out, self._buf, partial=False)
        self._buf = ""
        if self._call is not None:
            self._degrade_call(out, self._call)

    # -- lexing --------------------------------------------------------------------------

    def _drain(self, out: list[Event]) -> None:
        while True:
            pos, tok = find_first(self._buf, TOKENS)
            if pos == -1:
                if self._tag_kind is None:
                    keep = held_suffix(self._buf, TOKENS)
                    if self._text(out, self._buf[: len(self._buf) - keep], partial=True):
                        self._buf = self._buf[len(self._buf) - keep :]
                return
            before, self._buf = self._buf[:pos], self._buf[pos + len(tok) :]
            if self._tag_kind is not None:
                kind, self._tag_kind = self._tag_kind, None
                if tok == SEP:
                    self._tag(out, kind, before)
                    continue
                self._text(out, before, partial=False)  # header cut short by another marker
                if self._call is not None:
                    self._call.malformed = True
            else:
                self._text(out, before, partial=False)
            if tok in (OPEN, CLOSE):
                self._tag_kind = tok
            elif tok == END:
                if self._call is not None:
                    self._degrade_call(out, self._call)
                self._in_tools, self._channel = False, "text"
            # a stray SEP is dropped

    # -- routing text ----------------------------------------------------------------------

    def _text(self, out: list[Event], text: str, partial: bool) -> bool:
        """Route text by context; returns False when it must stay buffered."""
        call = self._call
        if call is not None:
            call.raw.append(text)
            if call.element is not None:
                call.body.append(text)
            elif text.strip():
                call.malformed = True
            return True
        if self._in_tools and not self._prose_run:
            if not text.strip():
                return not partial  # formatting between calls: dropped when the run ends
            self._prose_run = True
        if text:
            out.append(Reasoning(text) if self._channel == "think" and not self._in_tools else Text(text))
        return True

    # -- structure -------------------------------------------------------------------------

    def _tag(self, out: list[Event], kind: str, header: str) -> None:
        tag = _Tag.parse(header)
        if self._call is not None:
            self._call_tag(out, self._call, kind, tag, header)
            return
        self._prose_run = False
        if kind == OPEN:
            if tag.name == "call":
                self._call = _Call(tag, raw=[header])
            elif tag.name == "tools":
                self._in_tools = True
            elif tag.name in ("think", "response") and not self._in_tools:
                self._channel = "think" if tag.name == "think" else "text"
        elif tag.name == "tools":
            self._in_tools = False
        elif tag.name in ("think", "response") and not self._in_tools:
            self._channel = "text"

    def _call_tag(self, out: list[Event], call: _Call, kind: str, tag: _Tag, header: str) -> None:
        call.raw.append(header)
        if kind == CLOSE and tag.name in ("call", "tools"):
            # Closing the call (or the tools around it) always ends the call; it only counts
            # if every element was closed properly.
            result = call.result() if tag.name == "call" and call.element is None else None
            if result is None:
                self._degrade_call(out, call)
            else:
                self._call = None
                out.append(result)
            if tag.name == "tools":
                self._in_tools = False
            return
        if call.malformed:
            return
        if kind == OPEN and call.element is None and tag.name in ("argument", "json") and tag.strict:
            call.element = tag
        elif kind == CLOSE and call.element is not None and tag.name == call.element.name:
            call.malformed = not call.close_element(call.element)
        else:
            call.malformed = True

    def _degrade_call(self, out: list[Event], call: _Call) -> None:
        raw = "".join(call.raw)
        self._call = None
        if raw:
            out.append(Text(raw))
