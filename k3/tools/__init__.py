"""Tool calls (and inline reasoning) parsed out of model text, plus native tool-call folding.

Public interface:

* Events (frozen dataclasses): `Text(text)`, `Reasoning(text)`, `ToolCall(id, name, arguments)`;
  `arguments` is the JSON argument string, the model's own bytes wherever it wrote JSON.
  `Event` is their union; `merge_events(events)` joins adjacent Text / adjacent Reasoning
  (chunking may split text anywhere, so compare merged lists).
* `make_parser(name, tools=None) -> Parser` for `name` in `PARSER_NAMES`
  (`kimi_k3`, `kimi`, `hermes`, `json`, `pythonic`, `passthrough`); `tools` are the request's
  OpenAI-Chat tool definitions (`json` and `pythonic` use them). A parser is single-use, one per
  model turn: `feed(chunk) -> list[Event]` as text arrives, then `finish() -> list[Event]` once.
  Guarantees for every parser: the merged events do not depend on how the text is chunked;
  visible text is emitted as soon as it cannot be the start of a delimiter; control tokens
  never reach visible text; malformed input never raises and degrades to text; text around
  calls keeps its order.
* `ThinkSplitter(inner=None, *, start_in_think=False)`: `<think>…</think>` in content becomes
  Reasoning, the rest goes through `inner` (a parser from `make_parser`). Same feed/finish.
* `NativeToolCalls()`: the one native tool-call folder (the pipeline streams from it):
  `.add(delta["tool_calls"])` per upstream chunk (or once with a full message's `tool_calls`),
  or `.fold(item)` per item; `.calls() -> list[ToolCall]` in index order, arguments byte-exact.
* `k3.tools.ids`: `new_call_id()`, `to_anthropic_id` / `from_anthropic_id` (`toolu_…`),
  `to_responses_id` / `from_responses_id` (`call_…`): reversible maps from the upstream id.
"""

from k3.tools.events import Event, Parser, Reasoning, Text, ToolCall, merge_events
from k3.tools.native import NativeToolCalls
from k3.tools.registry import PARSER_NAMES, make_parser
from k3.tools.think import ThinkSplitter

__all__ = [
    "PARSER_NAMES",
    "Event",
    "NativeToolCalls",
    "Parser",
    "Reasoning",
    "Text",
    "ThinkSplitter",
    "ToolCall",
    "make_parser",
    "merge_events",
]
