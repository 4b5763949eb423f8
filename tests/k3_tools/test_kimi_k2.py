"""Kimi K2 control-token tool calls."""

import pytest
from tools_support import call, run

from k3.tools import Text, make_parser
from k3.tools.kimi_k2 import TOKENS

SB, SE = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CB, AB, CE = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"


def k2(text: str, size: int | None = None):
    size = size or len(text) or 1
    return run(make_parser("kimi"), [text[i : i + size] for i in range(0, len(text), size)])


def test_one_call_in_a_section_keeps_the_text_around_it_and_the_raw_arguments():
    text = f'Sure. {SB}\n{CB}functions.get_weather:0{AB}{{"city":  "Beijing"}}{CE}\n{SE} done'
    for size in (1, 3, 7, None):
        assert k2(text, size) == [
            Text("Sure. "),
            call("get_weather", '{"city":  "Beijing"}', id="functions.get_weather:0"),
            Text(" done"),
        ]


def test_two_calls_and_a_bare_call_without_section():
    two = f'{SB}{CB}functions.a:0{AB}{{}}{CE}\n  {CB}functions.b:1{AB}{{"x":1}}{CE}{SE}'
    assert k2(two, 1) == [call("a", "{}", "functions.a:0"), call("b", '{"x":1}', "functions.b:1")]
    assert k2(f"x{CB}b{AB}{{}}{CE}y") == [Text("x"), call("b", "{}"), Text("y")]


def test_header_without_functions_prefix_gets_a_fresh_id_and_duplicate_ids_are_replaced():
    text = f"{SB}{CB}functions.a:0{AB}{{}}{CE}{CB}functions.a:0{AB}{{}}{CE}{SE}"
    first, second = k2(text)
    assert first.id == "functions.a:0" and second.id != first.id and second.name == "a"


def test_prose_between_calls_is_kept_verbatim_whitespace_only_runs_are_dropped():
    text = f"{SB}{CB}a{AB}{{}}{CE}  note: \n {CB}b{AB}{{}}{CE}\n\n{SE}"
    for size in (1, 2, None):
        assert k2(text, size) == [call("a", "{}"), Text("  note: \n "), call("b", "{}")]


def test_section_truncated_right_after_the_begin_token_keeps_the_prose():
    assert k2(f"{SB}I was cut off", 1) == [Text("I was cut off")]
    assert k2(f"{SB}  \n") == []


@pytest.mark.parametrize(
    "text, expected",
    [
        (f"{CB}functions.f:0", "functions.f:0"),  # unterminated header
        (f'{CB}functions.f:0{AB}{{"a": 1', 'functions.f:0{"a": 1'),  # unterminated arguments
        (f"{CB}f{AB}{{}}{SE}after", "f{}after"),  # call cut by a section end
        (f"{CB}  {AB}{{}}{CE}", "  {}"),  # empty tool name
    ],
)
def test_malformed_calls_degrade_to_text_without_control_tokens(text, expected):
    for size in (1, None):
        out = k2(text, size)
        assert out == [Text(expected)]
        assert not any(tok in out[0].text for tok in TOKENS)


def test_call_interrupted_by_another_call_keeps_the_second():
    out = k2(f'{CB}f{AB}{{"a"{CB}g{AB}{{}}{CE}')
    assert out == [Text('f{"a"'), call("g", "{}")]


def test_stray_tokens_are_dropped_and_non_json_arguments_are_wrapped():
    assert k2(f"a{CE}b{AB}c{SE}d") == [Text("abcd")]
    assert k2(f"{CB}f{AB}not json{CE}") == [call("f", '{"value": "not json"}')]
    assert k2(f"{CB}f{AB}  {CE}") == [call("f", "{}")]
