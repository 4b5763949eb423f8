"""Hermes tags, whole-reply JSON calls and pythonic call lists."""

import logging

import pytest
from tools_support import call, run

from k3.tools import Text, make_parser

WEATHER = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            },
        },
    },
    {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}},
]


def parse(name, text, size=None, tools=None):
    size = size or len(text) or 1
    return run(make_parser(name, tools), [text[i : i + size] for i in range(0, len(text), size)])


# -- hermes ---------------------------------------------------------------------------------


def test_hermes_call_with_text_around_keeps_raw_argument_bytes():
    text = 'a <tool_call>\n{"name": "f", "arguments": {"x":  [1, 2] }}\n</tool_call> b'
    for size in (1, 4, None):
        assert parse("hermes", text, size) == [Text("a "), call("f", '{"x":  [1, 2] }'), Text(" b")]


@pytest.mark.parametrize(
    "body, arguments",
    [
        ('{"function": "f", "parameters": {"y": true}}', '{"y": true}'),
        ('{"name": "f", "arguments": "{\\"x\\": 1}"}', '{"x": 1}'),  # arguments as a JSON string
        ('{"name": "f"}', "{}"),
        ('{"name": "f", "arguments": null}', "{}"),
        ('{"type": "function", "function": {"name": "f", "arguments": {"z": 0}}}', '{"z": 0}'),
    ],
)
def test_hermes_argument_shapes(body, arguments):
    assert parse("hermes", f"<tool_call>{body}</tool_call>") == [call("f", arguments)]


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>{not json}</tool_call>",
        '<tool_call>{"arguments": {}}</tool_call>',
        '<tool_call>{"name": "f"} trailing</tool_call>',
        '<tool_call>{"name": "f", "arguments": {',
        "<tool_call>" + "[" * 5000 + "</tool_call>",
    ],
)
def test_hermes_malformed_is_shown_verbatim(text):
    assert parse("hermes", text, 1) == parse("hermes", text) == [Text(text)]


def test_hermes_reopened_tag_abandons_the_first():
    text = '<tool_call>{"name": "f", <tool_call>{"name": "g"}</tool_call>'
    assert parse("hermes", text, 1) == [Text('<tool_call>{"name": "f", '), call("g", "{}")]


# -- json -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ('{"name": "f", "arguments": {"a": 1}}', [call("f", '{"a": 1}')]),
        ('  ```json\n{"name": "f", "parameters": {"a":1}}\n```\n', [call("f", '{"a":1}')]),
        ("```\n[]\n```", [Text("```\n[]\n```")]),
        (
            '[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"x": "y"}}]',
            [call("a", "{}"), call("b", '{"x": "y"}')],
        ),
        ('[{"name": "a"}, 3]', [Text('[{"name": "a"}, 3]')]),
        (
            '{"name": "f", "arguments": {}} and then prose',
            [Text('{"name": "f", "arguments": {}} and then prose')],
        ),
        ('{"answer": 42}', [Text('{"answer": 42}')]),
        ("plain answer", [Text("plain answer")]),
        ("`code`", [Text("`code`")]),
        ("``", [Text("``")]),
        ("   ", [Text("   ")]),
        ('```json\n{"name": "f"}', [call("f", "{}")]),  # the closing fence was cut off
        (
            '{"name": "f", "arguments": {"s": "a\\"}]\\\\"}}',
            [call("f", '{"s": "a\\"}]\\\\"}')],
        ),  # brackets in strings
    ],
)
def test_json_whole_reply(text, expected):
    for size in (1, 2, None):
        assert parse("json", text, size) == expected


def test_json_streams_non_calls_without_waiting_for_the_end():
    parser = make_parser("json")
    assert parser.feed("``") == []  # a fence prefix is not latched to text
    assert parser.feed("` is a fence") == [Text("``` is a fence")]
    parser = make_parser("json")
    assert parser.feed('{"answer": ') == []
    assert parser.feed("1} so") == [Text('{"answer": 1} so')]
    assert parser.feed(" there") == [Text(" there")]


def test_json_with_declared_tools_accepts_only_their_names():
    assert parse("json", '{"name": "Bob", "arguments": {}}', tools=WEATHER) == [
        Text('{"name": "Bob", "arguments": {}}')
    ]
    assert parse("json", '{"name": "ping", "arguments": {}}', tools=WEATHER) == [call("ping", "{}")]


# -- pythonic -------------------------------------------------------------------------------------


def test_pythonic_keyword_calls():
    text = '[get_weather(city="Beijing", days=3), ping()]'
    for size in (1, None):
        assert parse("pythonic", text, size) == [
            call("get_weather", '{"city": "Beijing", "days": 3}'),
            call("ping", "{}"),
        ]


def test_pythonic_positional_arguments_map_to_schema_order():
    assert parse("pythonic", '[get_weather("Paris", days=2)]', tools=WEATHER) == [
        call("get_weather", '{"city": "Paris", "days": 2}')
    ]
    assert parse("pythonic", '[get_weather("Paris", 2)]', tools=WEATHER) == [
        call("get_weather", '{"city": "Paris", "days": 2}')
    ]


@pytest.mark.parametrize(
    "text, tools, reason",
    [
        ("[get_weather('Paris')]", None, "need the tool's schema"),
        ("[get_weather('Paris', 1, 2)]", WEATHER, "3 positional arguments"),
        ("[get_weather('Paris', city='Rome')]", WEATHER, "given twice"),
        ("[nope(1)]", WEATHER, "not one of the request's tools"),
        ("[f(**kw)]", None, "**kwargs"),
        ("[f(x=y)]", None, "not a literal"),
        ("[f(x={1, 2})]", None, "no JSON form"),
        ("[f(x=1e999)]", None, "no JSON form"),
        ("[a.b(x=1)]", None, None),
        ("[f(x=1)] trailing", None, "not a Python expression"),
        ("[f(x=1), 2]", None, "not a call"),
    ],
)
def test_pythonic_rejections_are_text_and_say_why(text, tools, reason, caplog):
    with caplog.at_level(logging.WARNING, logger="k3.tools.pythonic"):
        assert parse("pythonic", text, 1, tools=tools) == [Text(text)]
    if reason:
        assert reason in caplog.text


def test_pythonic_streams_text_that_cannot_start_a_call_list():
    parser = make_parser("pythonic")
    assert parser.feed("[") == []
    assert parser.feed("1, 2]") == [Text("[1, 2]")]
    parser = make_parser("pythonic")
    assert parser.feed("[link](http://x)") == [Text("[link](http://x)")]
    assert make_parser("pythonic").feed("Hello") == [Text("Hello")]
