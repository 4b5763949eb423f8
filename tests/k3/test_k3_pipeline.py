"""Upstream chunks -> canonical events: ordering, native tool-call folding, the text-parser seam."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from k3 import ir
from k3.errors import ProxyError
from k3.pipeline import Collector, Translator, completion_to_chunk, make_text_parser
from k3.sse import SSEDecoder, named, typed
from k3.testing.fake_upstream import FakeUpstream, Reply, ToolCall
from k3.tools import PARSER_NAMES, Reasoning, Text, ThinkSplitter
from k3.tools import ToolCall as ParsedCall
from k3.tools.passthrough import PassthroughParser


def chunk(delta=None, finish=None, **extra):
    return {"choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}], **extra}


def run(chunks, parser=None, stop=None):
    translator = Translator(parser or PassthroughParser(), stop)
    events = []
    for c in chunks:
        events += translator.feed(c)
    return events + translator.finish()


def kinds(events):
    return [type(e).__name__ for e in events]


def fold(events):
    collector = Collector()
    for e in events:
        collector.add(e)
    return collector.response()


def test_reasoning_closes_before_text_and_reopens_as_a_new_segment():
    events = run(
        [
            chunk({"reasoning_content": "r1"}),
            chunk({"content": "t1"}),
            chunk({"reasoning_content": "r2"}),
            chunk({"content": "t2"}, "stop"),
        ]
    )
    assert kinds(events) == [
        "ReasoningDelta", "ReasoningEnd", "TextDelta", "ReasoningDelta", "ReasoningEnd", "TextDelta", "Finish",
    ]  # fmt: skip
    assert [e.text for e in events if isinstance(e, ir.ReasoningEnd)] == ["r1", "r2"]
    response = fold(events)
    assert response.parts == [
        ir.ReasoningPart("r1"),
        ir.TextPart("t1"),
        ir.ReasoningPart("r2"),
        ir.TextPart("t2"),
    ]


def test_reasoning_field_named_reasoning_is_read_too():
    events = run([chunk({"reasoning": "why"}), chunk({"content": "x"}, "stop")])
    assert [e.text for e in events if isinstance(e, ir.ReasoningDelta)] == ["why"]


def test_native_call_held_until_name_whole_and_arguments_begun():
    events = run(
        [
            chunk({"tool_calls": [{"index": 0, "id": "call_a", "function": {"name": "get_"}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"name": "weather", "arguments": ""}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city"'}}]}),
            chunk(
                {"tool_calls": [{"index": 0, "function": {"name": "get_weather", "arguments": ': "SF"}'}}]}
            ),
            chunk({}, "tool_calls"),
        ]
    )
    starts = [e for e in events if isinstance(e, ir.ToolCallStart)]
    assert starts == [
        ir.ToolCallStart(0, "call_a", "get_weather")
    ]  # name split, then repeated: announced once, whole
    assert "".join(e.text for e in events if isinstance(e, ir.ToolCallDelta)) == '{"city": "SF"}'
    end = next(e for e in events if isinstance(e, ir.ToolCallEnd))
    assert end == ir.ToolCallEnd(0, "call_a", "get_weather", '{"city": "SF"}')
    assert events[-1].stop_reason == "tool_calls"


def test_arguments_before_the_name_still_reach_the_client():
    events = run(
        [
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"a":'}}]}),
            chunk(
                {"tool_calls": [{"index": 0, "id": "call_x", "function": {"name": "f", "arguments": " 1}"}}]}
            ),
            chunk({}, "stop"),
        ]
    )
    assert "".join(e.text for e in events if isinstance(e, ir.ToolCallDelta)) == '{"a": 1}'
    assert next(e for e in events if isinstance(e, ir.ToolCallStart)).name == "f"


def test_id_is_frozen_at_start_and_minted_when_missing():
    events = run(
        [
            chunk({"tool_calls": [{"index": 0, "function": {"name": "f", "arguments": "{}"}}]}),
            chunk({"tool_calls": [{"index": 0, "id": "late_id", "function": {"arguments": ""}}]}),
            chunk({}, "tool_calls"),
        ]
    )
    start = next(e for e in events if isinstance(e, ir.ToolCallStart))
    end = next(e for e in events if isinstance(e, ir.ToolCallEnd))
    assert start.id.startswith("call_") and len(start.id) == 29
    assert end.id == start.id


def test_sequential_calls_never_interleave_and_late_fragments_are_an_error():
    events = run(
        [
            chunk({"tool_calls": [{"index": 0, "id": "a", "function": {"name": "f", "arguments": "{}"}}]}),
            chunk({"tool_calls": [{"index": 1, "id": "b", "function": {"name": "g", "arguments": "{"}}]}),
            chunk({"tool_calls": [{"index": 1, "function": {"arguments": "}"}}]}),
            chunk({}, "tool_calls"),
        ]
    )
    assert kinds(events) == [
        "ToolCallStart", "ToolCallDelta", "ToolCallEnd", "ToolCallStart", "ToolCallDelta", "ToolCallDelta",
        "ToolCallEnd", "Finish",
    ]  # fmt: skip
    assert [e.index for e in events if isinstance(e, ir.ToolCallStart)] == [0, 1]
    translator = Translator(PassthroughParser())
    translator.feed(
        chunk({"tool_calls": [{"index": 0, "id": "a", "function": {"name": "f", "arguments": "{"}}]})
    )
    translator.feed(
        chunk({"tool_calls": [{"index": 1, "id": "b", "function": {"name": "g", "arguments": "{"}}]})
    )
    with pytest.raises(ProxyError) as err:
        translator.feed(chunk({"tool_calls": [{"index": 0, "function": {"arguments": "}"}}]}))
    assert err.value.status == 502


def test_a_call_that_never_got_arguments_is_still_announced_at_the_end():
    events = run(
        [chunk({"tool_calls": [{"index": 0, "id": "a", "function": {"name": "ls"}}]}), chunk({}, "stop")]
    )
    assert kinds(events) == ["ToolCallStart", "ToolCallEnd", "Finish"]
    assert events[1].arguments == ""


def test_a_call_never_named_is_dropped_rather_than_sent_nameless():
    events = run(
        [chunk({"tool_calls": [{"index": 0, "id": "a", "function": {"arguments": "{}"}}]}), chunk({}, "stop")]
    )
    assert kinds(events) == ["Finish"] and events[0].stop_reason == "stop"


class ScriptedParser:
    """A stand-in for a text tool-call parser: it finds `CALL` in the text."""

    def __init__(self):
        self.buffer = ""

    def feed(self, chunk):
        self.buffer += chunk
        return []

    def finish(self):
        before, _, after = self.buffer.partition("CALL")
        return [Text(before), Reasoning("hidden"), ParsedCall("", "f", '{"x": 1}'), Text(after)]


def test_text_parser_seam_expands_parsed_calls_and_upgrades_stop():
    events = run(
        [chunk({"content": "Sure. CALL"}), chunk({"content": " done"}, "stop")], parser=ScriptedParser()
    )
    assert kinds(events) == [
        "TextDelta", "ReasoningDelta", "ReasoningEnd", "ToolCallStart", "ToolCallDelta", "ToolCallEnd",
        "TextDelta", "Finish",
    ]  # fmt: skip
    assert events[-1].stop_reason == "tool_calls"
    assert fold(events).parts[2] == ir.ToolCallPart(events[3].id, "f", '{"x": 1}')


def test_make_text_parser_builds_every_parser_and_wraps_inline_think():
    for name in PARSER_NAMES:
        assert not isinstance(make_text_parser(name, "reasoning_content"), ThinkSplitter)
        assert isinstance(make_text_parser(name, "think"), ThinkSplitter)
        assert isinstance(make_text_parser(name, "auto"), ThinkSplitter)
    with pytest.raises(ValueError):
        make_text_parser("nope", "reasoning_content")


def test_reasoning_segments_are_signed_where_they_close():
    signed = []

    def sign(text):
        signed.append(text)
        return f"sig-{len(signed)}"

    translator = Translator(PassthroughParser(), sign=sign)
    events = translator.feed(chunk({"reasoning_content": "r1"})) + translator.feed(chunk({"content": "t"}))
    events += translator.feed(chunk({"reasoning": "r2"}, "stop")) + translator.finish()
    ends = [e for e in events if isinstance(e, ir.ReasoningEnd)]
    assert [(e.text, e.signature) for e in ends] == [("r1", "sig-1"), ("r2", "sig-2")]
    assert translator.reasoning_field == "reasoning_content"


def test_reasoning_found_in_text_names_the_parsers_field():
    translator = Translator(make_text_parser("hermes", "think"), parser_field="think")
    events = translator.feed(chunk({"content": "<think>plan</think>ok"}, "stop")) + translator.finish()
    assert kinds(events) == ["ReasoningDelta", "ReasoningEnd", "TextDelta", "Finish"]
    assert translator.reasoning_field == "think" and events[1].signature is None


@pytest.mark.parametrize(
    ("upstream", "expected"),
    [("stop", "stop"), ("length", "length"), ("tool_calls", "tool_calls"), ("content_filter", "content_filter"),
     ("function_call", "tool_calls"), ("weird", "stop"), (None, "stop")],
)  # fmt: skip
def test_finish_reason_mapping(upstream, expected):
    assert run([chunk({"content": "x"}, upstream)])[-1].stop_reason == expected


def test_length_stays_length_with_tool_calls():
    events = run(
        [
            chunk(
                {"tool_calls": [{"index": 0, "id": "a", "function": {"name": "f", "arguments": "{"}}]},
                "length",
            )
        ]
    )
    assert events[-1].stop_reason == "length"


def test_stop_sequence_reported_when_the_engine_names_it():
    events = run(
        [
            chunk({"content": "x"}, "stop", usage=None)
            | {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop", "stop_reason": "</s1>"}]}
        ],
        stop=["</s1>"],
    )
    assert events[-1].stop_sequence == "</s1>"
    assert run([chunk({"content": "x"}, "stop")], stop=["</s1>"])[-1].stop_sequence is None


def test_usage_parsed_or_estimated():
    usage = {
        "prompt_tokens": 10, "completion_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": 4}, "completion_tokens_details": {"reasoning_tokens": 2},
    }  # fmt: skip
    finish = run([chunk({"content": "x"}, "stop"), {"choices": [], "usage": usage}])[-1]
    assert (finish.usage.input_tokens, finish.usage.output_tokens) == (10, 5)
    assert (finish.usage.cached_input_tokens, finish.usage.reasoning_tokens) == (4, 2)
    translator = Translator(PassthroughParser(), input_estimate=123)
    translator.feed(chunk({"content": "x" * 40}, "stop"))
    estimated = translator.finish()[-1]
    assert (estimated.usage.input_tokens, estimated.usage.output_tokens) == (123, 10)


def test_empty_upstream_gives_only_finish():
    assert kinds(run([])) == ["Finish"]


@pytest.mark.parametrize(
    "reply",
    [
        Reply(content="plain text answer"),
        Reply(reasoning="thinking about it", content="answer"),
        Reply(
            reasoning="r",
            content="calling",
            tool_calls=[ToolCall("a", '{"x": [1, 2]}', "c1"), ToolCall("b", "{}", "c2")],
        ),
        Reply(content="truncated", finish_reason="length"),
    ],
)
def test_stream_and_json_replies_fold_to_the_same_response(reply):
    fake = FakeUpstream()
    payload = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    streamed = fold(run(fake.chunks(payload, reply)))
    whole = fold(run([completion_to_chunk(fake.completion(payload, reply))]))
    assert streamed == whole


def test_sse_decoder_is_split_invariant():
    raw = (
        b': comment\r\n\r\nevent: x\ndata: {"a": 1}\n\n'
        b"data: line1\ndata: line2\n\nid: 7\ndata:no-space\n\ndata: [DONE]\n\n"
    )
    expected = [b'{"a": 1}', b"line1\nline2", b"no-space", b"[DONE]"]
    rng = random.Random(0)
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(raw)), 5))
        decoder = SSEDecoder()
        out = []
        for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True):
            out += decoder.feed(raw[a:b])
        assert out + decoder.finish() == expected
    decoder = SSEDecoder()
    assert decoder.feed(b"data: tail-without-blank-line") == []
    assert decoder.finish() == [b"tail-without-blank-line"]


def _reference_sse(raw: bytes) -> list[bytes]:
    """The SSE spec's data payloads of a whole body, line by line (the decoder's reference)."""
    out, data = [], []
    for line in (raw + b"\n\n").split(b"\n")[:-1]:
        line = line.removesuffix(b"\r")
        if not line:
            if data:
                out.append(b"\n".join(data))
            data = []
        elif line.startswith(b"data:"):
            value = line[5:]
            data.append(value[1:] if value.startswith(b" ") else value)
    return out


_SSE_PIECES = st.sampled_from(
    [b"data: ", b"data:", b"data:  ", b": ping", b"event: x", b"id: 1", b"\n", b"\n\n", b"\r\n",
     b'{"a":1}', b"[DONE]", b"x", b" ", b"\r"]
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.lists(_SSE_PIECES, max_size=30).map(b"".join), st.lists(st.integers(0, 200), max_size=6))
def test_sse_decoder_matches_the_line_by_line_reference_under_any_split(raw, cuts):
    cuts = sorted({c for c in cuts if 0 < c < len(raw)})
    decoder = SSEDecoder()
    out = []
    for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True):
        out += decoder.feed(raw[a:b])
    assert out + decoder.finish() == _reference_sse(raw)


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(["response.created", "response.output_text.delta", "error"]),
    st.dictionaries(
        st.text(max_size=8).filter(lambda k: k not in ("type", "sequence_number")),
        st.none() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=8) | st.lists(st.booleans()),
        min_size=1,
        max_size=5,
    ),
    st.integers(0, 10**6),
)
def test_typed_frames_are_the_dict_built_frames_byte_for_byte(event, fields, n):
    assert typed(event, fields, n) == named(event, {"type": event, **fields, "sequence_number": n})


def check_contract(events):
    """The ordering contract of k3.ir, checked event by event."""
    assert isinstance(events[-1], ir.Finish) and not any(isinstance(e, ir.Finish) for e in events[:-1])
    reasoning: list[str] | None = None
    call: ir.ToolCallStart | None = None
    args: list[str] = []
    for event in events:
        if call is not None:
            assert isinstance(event, ir.ToolCallDelta | ir.ToolCallEnd), f"{event} inside call {call}"
            assert event.index == call.index
            if isinstance(event, ir.ToolCallDelta):
                args.append(event.text)
            else:
                assert (event.id, event.name, event.arguments) == (call.id, call.name, "".join(args))
                call, args = None, []
            continue
        if isinstance(event, ir.ReasoningDelta):
            reasoning = (reasoning or []) + [event.text]
        elif isinstance(event, ir.ReasoningEnd):
            assert reasoning is not None and event.text == "".join(reasoning)
            reasoning = None
        else:
            assert reasoning is None, f"{event} before the reasoning segment closed"
            if isinstance(event, ir.ToolCallStart):
                assert event.name
                call = event
            else:
                assert isinstance(event, ir.TextDelta | ir.Finish), event
    assert call is None


def test_any_chunk_sequence_keeps_the_event_contract_or_fails_as_502():
    text = st.text(max_size=4)
    fragment = st.fixed_dictionaries(
        {},
        optional={
            "index": st.integers(0, 2),
            "id": st.sampled_from(["a", "b", ""]),
            "function": st.fixed_dictionaries(
                {}, optional={"name": st.sampled_from(["f", "g", "", "f"]), "arguments": text}
            ),
        },
    )
    delta = st.fixed_dictionaries(
        {},
        optional={
            "content": text,
            "reasoning_content": text,
            "reasoning": text,
            "tool_calls": st.lists(fragment, max_size=2),
        },
    )
    chunk_ = st.builds(
        lambda d, f, u: {
            "choices": [{"index": 0, "delta": d, "finish_reason": f}],
            **({"usage": u} if u else {}),
        },
        delta,
        st.sampled_from([None, None, "stop", "length", "tool_calls"]),
        st.sampled_from([None, {"prompt_tokens": 3, "completion_tokens": 2}]),
    )

    @settings(max_examples=300, deadline=None)
    @given(st.lists(chunk_, max_size=8))
    def run_(chunks):
        try:
            events = run(chunks)
        except ProxyError as err:
            assert err.status == 502
            return
        check_contract(events)

    run_()


# The production stream folds native calls with k3.tools.native's rules (these failed when the
# pipeline had its own folder).


def test_a_growing_name_resent_on_each_delta_is_announced_once_not_joined():
    events = run(
        [
            chunk({"tool_calls": [{"index": 0, "id": "call_a", "function": {"name": "get_"}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"name": "get_weather", "arguments": "{}"}}]}),
            chunk({}, "tool_calls"),
        ]
    )
    assert [e for e in events if isinstance(e, ir.ToolCallStart)] == [
        ir.ToolCallStart(0, "call_a", "get_weather")
    ]


def test_items_without_index_that_repeat_their_id_continue_that_call():
    events = run(
        [
            chunk({"tool_calls": [{"id": "call_a", "function": {"name": "f", "arguments": ""}}]}),
            chunk({"tool_calls": [{"id": "call_a", "function": {"arguments": '{"a"'}}]}),
            chunk({"tool_calls": [{"id": "call_a", "function": {"arguments": ": 1}"}}]}),
            chunk({}, "tool_calls"),
        ]
    )
    ends = [e for e in events if isinstance(e, ir.ToolCallEnd)]
    assert ends == [ir.ToolCallEnd(0, "call_a", "f", '{"a": 1}')]


def test_items_without_index_or_id_that_bring_a_name_start_a_new_call():
    events = run(
        [
            chunk({"tool_calls": [{"function": {"name": "f", "arguments": '{"x": 1}'}}]}),
            chunk({"tool_calls": [{"function": {"name": "g", "arguments": "{"}}]}),
            chunk({"tool_calls": [{"function": {"arguments": "}"}}]}),  # continues g, the last touched
            chunk({}, "tool_calls"),
        ]
    )
    ends = [(e.index, e.name, e.arguments) for e in events if isinstance(e, ir.ToolCallEnd)]
    assert ends == [(0, "f", '{"x": 1}'), (1, "g", "{}")]


def test_object_arguments_become_json_text():
    events = run(
        [chunk({"tool_calls": [{"index": 0, "id": "c", "function": {"name": "f", "arguments": {"a": 1}}}]})]
    )
    assert next(e for e in events if isinstance(e, ir.ToolCallEnd)).arguments == '{"a":1}'


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["f", "get_weather", "a_b"]), st.text(max_size=30)), min_size=1, max_size=3
    ),
    st.booleans(),
    st.randoms(),
)
def test_streamed_native_calls_reassemble_however_the_engine_splits_them(calls, indexed, rnd):
    """Calls one after another, names split or resent growing, arguments cut anywhere, with
    indices or with repeated ids: the client gets every call whole, arguments byte for byte."""
    chunks = []
    for index, (name, arguments) in enumerate(calls):
        cut = rnd.randint(1, len(name))
        names = [name[:cut], name] if rnd.random() < 0.5 else [name[:cut], name[cut:]]
        cuts = sorted(rnd.sample(range(len(arguments) + 1), min(2, len(arguments) + 1)))
        pieces = [arguments[a:b] for a, b in zip([0, *cuts], [*cuts, len(arguments)], strict=False)]
        items = [{"id": f"call_{index}", "function": {"name": names[0]}}, {"function": {"name": names[1]}}]
        items += [{"function": {"arguments": p}} for p in pieces]
        for item in items:
            if indexed:
                item["index"] = index
            else:  # engines without indices repeat the id (a bare new name would start a new call)
                item["id"] = f"call_{index}"
            chunks.append(chunk({"tool_calls": [item]}))
    ends = [e for e in run([*chunks, chunk({}, "tool_calls")]) if isinstance(e, ir.ToolCallEnd)]
    assert [e.index for e in ends] == list(range(len(calls)))
    # A call with no arguments is announced at the end (it cannot start before they begin).
    assert sorted((e.id, e.name, e.arguments) for e in ends) == [
        (f"call_{i}", n, a) for i, (n, a) in enumerate(calls)
    ]
