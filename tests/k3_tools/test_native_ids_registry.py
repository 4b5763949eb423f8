"""Native tool-call folding, id mapping, the think splitter and the parser registry."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tools_support import run

from k3.tools import PARSER_NAMES, NativeToolCalls, Reasoning, Text, ThinkSplitter, ToolCall, make_parser
from k3.tools.ids import (
    from_anthropic_id,
    from_client_id,
    from_responses_id,
    new_call_id,
    to_anthropic_id,
    to_client_id,
    to_responses_id,
)


def fn(index=None, id=None, name=None, arguments=None) -> dict:
    item: dict = {"type": "function", "function": {}}
    if index is not None:
        item["index"] = index
    if id is not None:
        item["id"] = id
    if name is not None:
        item["function"]["name"] = name
    if arguments is not None:
        item["function"]["arguments"] = arguments
    return item


# -- native tool calls -----------------------------------------------------------------------


def test_parallel_interleaved_calls_come_out_in_index_order_with_exact_arguments():
    acc = NativeToolCalls()
    acc.add([fn(1, "call_b", "read", "")])
    acc.add([fn(0, "call_a", "write", '{"path": ')])
    acc.add([fn(1, arguments='{ "p" : 1 }'), fn(0, arguments='"x"}')])
    assert acc.calls() == [
        ToolCall("call_a", "write", '{"path": "x"}'),
        ToolCall("call_b", "read", '{ "p" : 1 }'),
    ]


def test_name_split_repeated_or_after_arguments():
    acc = NativeToolCalls()
    acc.add([fn(0, name="get_")])
    acc.add([fn(0, name="weather")])  # split name
    acc.add([fn(0, id="call_1", name="get_weather", arguments="{}")])  # repeated full name
    acc.add([fn(0, name="get_weather")])  # after arguments: ignored
    assert acc.calls() == [ToolCall("call_1", "get_weather", "{}")]
    acc = NativeToolCalls()
    acc.add([fn(0, name="ls")])
    acc.add([fn(0, name="ls")])
    assert acc.calls()[0].name == "ls"


def test_arguments_before_name_and_id_are_kept_and_first_id_wins():
    acc = NativeToolCalls()
    acc.add([fn(0, arguments='{"city":')])
    acc.add([fn(0, id="call_x", name="w", arguments='"SF"}')])
    acc.add([fn(0, id="call_other")])
    assert acc.calls() == [ToolCall("call_x", "w", '{"city":"SF"}')]


def test_missing_id_is_minted_once_and_stays_stable():
    acc = NativeToolCalls()
    acc.add([fn(0, name="f")])
    first = acc.calls()
    assert first[0].id.startswith("call_") and first[0].arguments == "{}"
    assert acc.calls() == first


def test_items_without_index_match_by_id_or_start_new_calls():
    acc = NativeToolCalls()
    acc.add([fn(id="a", name="f", arguments="{"), fn(id="b", name="g", arguments="[")])
    acc.add([fn(id="a", arguments="}")])  # matched by id
    acc.add([fn(id="b", arguments="1")])
    acc.add([fn(arguments="]")])  # no index, no id: continues the call touched last
    assert [(c.id, c.arguments) for c in acc.calls()] == [("a", "{}"), ("b", "[1]")]


@pytest.mark.parametrize(
    "junk", [None, "x", [None, 3, "s", {"function": "notadict"}], [{"index": True}], {"index": 0}]
)
def test_malformed_deltas_never_raise(junk):
    acc = NativeToolCalls()
    acc.add(junk)
    acc.add([{"index": -1, "function": {"name": 5, "arguments": None}}])
    assert isinstance(acc.calls(), list)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["f", "g_h", "i"]), st.text(max_size=30)), min_size=1, max_size=4),
    st.randoms(),
)
def test_any_interleaving_of_fragments_reassembles_every_call(calls, rnd):
    fragments = []
    for index, (name, arguments) in enumerate(calls):
        cuts = sorted(rnd.sample(range(len(arguments) + 1), min(3, len(arguments) + 1)))
        pieces = [arguments[a:b] for a, b in zip([0, *cuts], [*cuts, len(arguments)], strict=False)]
        fragments.append(
            [fn(index, f"call_{index}", name, pieces[0])] + [fn(index, arguments=p) for p in pieces[1:]]
        )
    acc = NativeToolCalls()
    while any(fragments):
        queue = rnd.choice([q for q in fragments if q])
        acc.add([queue.pop(0)])
    assert acc.calls() == [ToolCall(f"call_{i}", n, a or "{}") for i, (n, a) in enumerate(calls)]


# -- ids ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "upstream",
    [
        "abc",
        "toolu_k3_abc",
        "toolu_k3_",
        "",
        "call_x",
        "toolu_abc",
        "functions.get_weather:0",
        "call_k3e_x",
        "ü/+=",
        new_call_id(),
    ],
)
def test_id_mapping_is_reversible_and_uses_the_dialect_alphabet(upstream):
    for to, back, prefix in (
        (to_anthropic_id, from_anthropic_id, "toolu_"),
        (to_responses_id, from_responses_id, "call_"),
    ):
        client = to(upstream)
        assert client.startswith(prefix)
        assert all(c.isascii() and (c.isalnum() or c in "_-") for c in client)
        assert back(client) == upstream


def test_parsed_call_ids_pass_to_responses_unchanged_and_foreign_ids_come_back_unchanged():
    cid = new_call_id()
    assert to_responses_id(cid) == cid
    assert to_anthropic_id("abc") == "toolu_k3_abc"
    for foreign in ("toolu_01ABC", "call_123", "toolu_k3e_!!", "toolu_k3e_YWJj="):
        assert from_anthropic_id(foreign) == foreign or to_anthropic_id(from_anthropic_id(foreign)) == foreign


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40), st.text(max_size=40), st.sampled_from(["toolu_", "call_"]))
def test_id_mapping_is_injective(a, b, prefix):
    assert from_client_id(to_client_id(a, prefix), prefix) == a
    if a != b:
        assert to_client_id(a, prefix) != to_client_id(b, prefix)


# -- think splitter -------------------------------------------------------------------------------


def test_think_block_at_every_split_point():
    text = "<think>abc</think>visible"
    for cut in range(len(text) + 1):
        assert run(ThinkSplitter(), [text[:cut], text[cut:]]) == [Reasoning("abc"), Text("visible")]


def test_think_split_inside_the_opening_tag_does_not_leak():
    parser = ThinkSplitter()
    assert parser.feed("<th") == []
    assert parser.feed("ink>r") == [Reasoning("r")]


def test_think_composes_with_a_tool_parser_and_can_start_inside_think():
    text = 'pre<think>r1</think>mid<tool_call>{"name": "f"}</tool_call><think>r2</think>post'
    out = run(ThinkSplitter(make_parser("hermes")), [text[i : i + 3] for i in range(0, len(text), 3)])
    assert out == [
        Text("pre"),
        Reasoning("r1"),
        Text("mid"),
        ToolCall("call_*", "f", "{}"),
        Reasoning("r2"),
        Text("post"),
    ]
    assert run(ThinkSplitter(start_in_think=True), ["reason</think>answer"]) == [
        Reasoning("reason"),
        Text("answer"),
    ]


def test_unterminated_think_is_reasoning_and_stray_close_is_dropped():
    assert run(ThinkSplitter(), ["<think>still thinking"]) == [Reasoning("still thinking")]
    assert run(ThinkSplitter(), ["a</think>b"]) == [Text("ab")]


# -- registry -------------------------------------------------------------------------------------


def test_registry_names_and_fresh_instances():
    assert PARSER_NAMES == ("kimi_k3", "kimi", "hermes", "json", "pythonic", "passthrough")
    for name in PARSER_NAMES:
        assert make_parser(name) is not make_parser(name)


def test_unknown_parser_lists_the_names():
    with pytest.raises(ValueError, match="kimi_k3, kimi, hermes"):
        make_parser("nope")


def test_passthrough_keeps_control_tokens_untouched():
    text = "<|tool_call_begin|>f<|tool_call_argument_begin|>{}<|tool_call_end|>"
    assert run(make_parser("passthrough"), [text[:5], text[5:]]) == [Text(text)]
