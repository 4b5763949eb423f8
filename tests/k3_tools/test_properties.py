"""Property tests for every text parser (hypothesis).

* Any chunking gives the same merged events as feeding one character at a time, and not only at
  the end: after every chunk the output so far is what char-by-char feeding had produced at that
  point, so no chunking buffers more than another.
* Control tokens never reach visible text or reasoning.
* Malformed input never raises (every generated document mixes stray and partial tokens).
* For well-formed documents, text and calls come out exactly, in order.
* Plain text is emitted by the very feed that brought it.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tools_support import chunks_at, normalise

from k3.tools import PARSER_NAMES, Reasoning, Text, ThinkSplitter, ToolCall, make_parser
from k3.tools.kimi_k2 import TOKENS as K2_TOKENS
from k3.tools.kimi_k3 import TOKENS as K3_TOKENS

SETTINGS = settings(max_examples=150, deadline=None)
TOOLS = [
    {"type": "function", "function": {"name": "f", "parameters": {"properties": {"x": {}, "y": {}}}}},
    {"type": "function", "function": {"name": "g", "parameters": {"properties": {}}}},
]
PROSE = st.text(alphabet=st.sampled_from("ab yz09.,:;!?'\"\n\t{}[]()=é漢"), min_size=1, max_size=12)
ARGS = st.sampled_from(['{"x": 1}', '{ "x" :"a b",\n "y":[1, {}]}', "{}", '{"q": "<tag>"}'])

O, C, S, E = K3_TOKENS
K3_PIECES = [
    O,
    C,
    S,
    E,
    "<|",
    "<|op",
    "<|clo",
    "think",
    "response",
    "tools",
    "call",
    "argument",
    "json",
    'call tool="f" index="1"',
    'argument key="x" type="string"',
    'argument key="n" type="number"',
    'json type="object"',
    f'{O}call tool="f" index="1"{S}{O}argument key="x" type="number"{S}2{C}argument{S}{C}call{S}',
    f"{O}tools{S}",
    f"{C}tools{S}",
    f"{O}think{S}",
    f"{C}think{S}",
    "12",
    '{"a": 1}',
    " ",
    "\n",
]
SB, SE, CB, AB, CE = (
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
)
K2_PIECES = [
    *K2_TOKENS,
    "<|",
    "<|tool_",
    "<|tool_call",
    "functions.f:0",
    "g",
    "functions.:1",
    '{"a": 1}',
    "{",
    f"{CB}functions.f:3{AB}{{}}{CE}",
    " ",
    "\n",
    "x",
]
HERMES_PIECES = [
    "<tool_call>",
    "</tool_call>",
    "<tool_",
    "</tool",
    "<",
    '{"name": "f", "arguments": {"x": 1}}',
    "{",
    "}",
    '"name"',
    " ",
    "\n",
]
JSON_PIECES = [
    "{",
    "}",
    "[",
    "]",
    "```",
    "```json\n",
    "`",
    '"name"',
    '"arguments"',
    '"f"',
    ":",
    ",",
    "{}",
    "\\",
    '"',
    " ",
    "\n",
    '{"name": "f", "arguments": {"x": 1}}',
]
PYTHONIC_PIECES = [
    "[",
    "]",
    "f(",
    "g(",
    ")",
    "x=1",
    "y='s'",
    "2",
    ",",
    " ",
    "\n",
    "(",
    "**k",
    "[f(x=1), g()]",
]
THINK_PIECES = ["<think>", "</think>", "<th", "</thi", "<", *K2_PIECES]
# Control tokens that may appear in neither text nor reasoning; with the think splitter the inner
# parser's tokens are only kept out of the visible text (reasoning is not parsed for calls).
CONTROL = {"kimi": K2_TOKENS, "kimi_k3": K3_TOKENS, "think": ("<think>", "</think>")}
VISIBLE_CONTROL = {**CONTROL, "think": (*K2_TOKENS, "<think>", "</think>")}


def factory(name: str):
    if name == "think":
        return lambda: ThinkSplitter(make_parser("kimi"))
    return lambda: make_parser(name, TOOLS)


def documents(pieces: list[str]) -> st.SearchStrategy[str]:
    return st.lists(st.one_of(st.sampled_from(pieces), PROSE), max_size=12).map("".join)


def char_by_char_prefixes(make, text: str) -> tuple[list[list], list]:
    """Merged output after each character, and the final output."""
    parser, events, after = make(), [], []
    for char in text:
        events += parser.feed(char)
        after.append(normalise(events))
    return after, normalise(events + parser.finish())


def check_chunking(name: str, text: str, cuts: list[int]) -> None:
    make = factory(name)
    after, final = char_by_char_prefixes(make, text)
    parser, events, pos = make(), [], 0
    for chunk in chunks_at(text, cuts):
        events += parser.feed(chunk)
        pos += len(chunk)
        assert normalise(events) == after[pos - 1], (name, text, pos)
    events += parser.finish()
    assert normalise(events) == final
    for event in events:
        tokens = VISIBLE_CONTROL if isinstance(event, Text) else CONTROL
        if isinstance(event, Text | Reasoning):
            assert not any(tok in event.text for tok in tokens.get(name, ())), (name, event)


CUTS = st.lists(st.integers(min_value=0, max_value=200), max_size=8)


# Each parser's documents ("think" is the think splitter composed with the kimi parser).
PIECES = {
    "kimi_k3": K3_PIECES,
    "kimi": K2_PIECES,
    "hermes": HERMES_PIECES,
    "json": JSON_PIECES,
    "pythonic": PYTHONIC_PIECES,
    "think": THINK_PIECES,
}


@pytest.mark.parametrize("name", list(PIECES))
def test_chunking(name):
    @SETTINGS
    @given(documents(PIECES[name]), CUTS)
    def run(text, cuts):
        check_chunking(name, text, cuts)

    run()


@SETTINGS
@given(documents(K2_PIECES), CUTS)
def test_passthrough_is_identity(text, cuts):
    check_chunking("passthrough", text, cuts)
    assert normalise(make_parser("passthrough").feed(text)) == ([Text(text)] if text else [])


# -- well-formed documents: exact output, order kept ----------------------------------------------


def _k2_call(i: int, args: str) -> tuple[str, ToolCall]:
    return f"{SB}\n{CB}functions.f:{i}{AB}{args}{CE}\n{SE}", ToolCall(f"functions.f:{i}", "f", args)


def _k3_call(i: int, args: str) -> tuple[str, ToolCall]:
    element = f'{O}json type="object"{S}{args}{C}json{S}'
    return f'{O}tools{S}\n {O}call tool="f" index="{i}"{S}{element}{C}call{S}\n{C}tools{S}', ToolCall(
        "call_*", "f", args
    )


def _hermes_call(i: int, args: str) -> tuple[str, ToolCall]:
    return f'<tool_call>{{"name": "f", "arguments": {args}}}</tool_call>', ToolCall("call_*", "f", args)


def _think(i: int, args: str) -> tuple[str, Reasoning]:
    return f"<think>{args}</think>", Reasoning(args)


WELL_FORMED = {"kimi": _k2_call, "kimi_k3": _k3_call, "hermes": _hermes_call, "think": _think}
ITEMS = st.lists(st.one_of(PROSE.filter(lambda s: s.strip()), ARGS.map(json.loads)), max_size=8)


def _build(name: str, items: list) -> tuple[str, list]:
    text, expected = "", []
    for i, item in enumerate(items):
        if isinstance(item, str):
            text += item
            expected.append(Text(item))
        else:
            piece, event = WELL_FORMED[name](i, json.dumps(item))
            text += piece
            expected.append(event)
    return text, normalise(expected)


@SETTINGS
@given(st.sampled_from(sorted(WELL_FORMED)), ITEMS, CUTS)
def test_well_formed_documents_parse_exactly_in_order(name, items, cuts):
    text, expected = _build(name, items)
    parser, events = factory(name)(), []
    for chunk in chunks_at(text, cuts):
        events += parser.feed(chunk)
    assert normalise(events + parser.finish()) == expected


@SETTINGS
@given(st.sampled_from(["kimi", "kimi_k3", "hermes", "think", "passthrough"]), PROSE)
def test_plain_text_is_emitted_by_the_feed_that_brought_it(name, text):
    assert normalise(factory(name)().feed(text)) == [Text(text)]


@SETTINGS
@given(st.sampled_from(PARSER_NAMES), PROSE.filter(lambda s: s.strip() and s.lstrip()[0] not in "[{`"))
def test_text_that_cannot_start_a_call_is_never_held(name, text):
    parser = make_parser(name, TOOLS)
    leading = len(text) - len(text.lstrip())
    assert normalise(parser.feed(text[:leading] + "Z" + text[leading:])) == [
        Text(text[:leading] + "Z" + text[leading:])
    ]
