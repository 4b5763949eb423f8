"""Kimi K3 XTML."""

import pytest
from tools_support import call, run

from k3.tools import Reasoning, Text, make_parser
from k3.tools.kimi_k3 import TOKENS

O, C, S, E = "<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"


def k3(text: str, size: int | None = None):
    size = size or len(text) or 1
    return run(make_parser("kimi_k3"), [text[i : i + size] for i in range(0, len(text), size)])


def arg(key: str, kind: str, body: str) -> str:
    return f'{O}argument key="{key}" type="{kind}"{S}{body}{C}argument{S}'


def tools(*calls: str) -> str:
    return f"{O}tools{S}\n" + "\n".join(calls) + f"\n{C}tools{S}"


def xcall(name: str, *elements: str, index: int = 1) -> str:
    return f'  {O}call tool="{name}" index="{index}"{S}' + "".join(elements) + f"{C}call{S}"


def test_channels_and_typed_arguments_under_every_split():
    text = (
        f"{O}think{S}let me see{C}think{S}{O}response{S}Checking.{C}response{S}"
        + tools(
            xcall(
                "get_weather",
                arg("city", "string", 'Bei "jing"\n'),
                arg("days", "number", " 3.50 "),
                arg("hot", "boolean", "true"),
                arg("unit", "null", "null"),
                arg("opts", "object", '{"a": [1, 2]}'),
                arg("tags", "array", "[]"),
            )
        )
        + E
    )
    expected = [
        Reasoning("let me see"),
        Text("Checking."),
        call(
            "get_weather",
            '{"city": "Bei \\"jing\\"\\n", "days": 3.50, "hot": true, "unit": null, "opts": {"a": [1, 2]}, "tags": []}',
        ),
    ]
    for size in (1, 2, 5, 11, None):
        assert k3(text, size) == expected


def test_json_element_is_byte_identical():
    body = '{ "path" : "a\\\\b",\n  "n": 1e3 }'
    assert k3(tools(xcall("f", f'{O}json type="object"{S}{body}{C}json{S}')), 1) == [call("f", body)]


def test_attribute_values_are_html_unescaped():
    text = f'{O}call tool="a&amp;b" index="1"{S}{O}argument key="&quot;k&quot;" type="string"{S}v{C}argument{S}{C}call{S}'
    assert k3(text) == [call("a&b", '{"\\"k\\"": "v"}')]


def test_text_before_and_after_tools_is_kept_and_unknown_tags_dropped():
    text = f'intro {O}message role="assistant"{S}body ' + tools(xcall("f")) + f" outro{C}message{S}!"
    for size in (1, None):
        assert k3(text, size) == [Text("intro body "), call("f", "{}"), Text(" outro!")]


def test_prose_between_calls_is_shown_whitespace_is_not():
    text = tools(xcall("a"), "  (and then)  ", xcall("b"))
    assert k3(text, 1) == [call("a", "{}"), Text("\n  (and then)  \n  "), call("b", "{}")]


def test_end_of_message_resets_the_channel():
    assert k3(f"{O}think{S}r{E}visible", 1) == [Reasoning("r"), Text("visible")]


def test_prompt_opened_think_is_handled_by_feeding_the_opening_first():
    parser = make_parser("kimi_k3")
    assert parser.feed(f"{O}think{S}") == []
    assert run(parser, [f"reason{C}think{S}answer"]) == [Reasoning("reason"), Text("answer")]


@pytest.mark.parametrize(
    "element",
    [
        arg("n", "number", "abc"),  # value does not match its type
        arg("n", "number", "true"),  # booleans are not numbers
        arg("n", "boolean", "1"),
        arg("o", "object", "[1]"),
        arg("n", "date", "2024"),  # unknown type
        f'{O}argument type="string"{S}x{C}argument{S}',  # missing key
        f'{O}argument key="k" type="string"{S}x{C}json{S}',  # mismatched close
        f'{O}argument key="k" type="string"{S}x{O}argument key="j" type="string"{S}',  # nested tag
        "stray text",
        f'{O}json type="object"{S}{{bad{C}json{S}',
        f'{O}json type="object"{S}[1]{C}json{S}',
        f"{O}json{S}{{}}{C}json{S}" + arg("k", "string", "v"),  # json mixed with arguments
        f"{O}weird{S}",
        f"x{E}",  # a marker inside the call
    ],
)
def test_malformed_call_degrades_to_its_text_without_controls(element):
    text = "a " + tools(xcall("f", element)) + " b"
    for size in (1, 3, None):
        out = k3(text, size)
        assert len(out) == 1 and isinstance(out[0], Text), out
        assert out[0].text.startswith("a ") and 'call tool="f" index="1"' in out[0].text
        assert not any(tok in out[0].text for tok in TOKENS)


def test_empty_tool_name_degrades():
    assert k3(f'{O}call tool="" index="1"{S}{C}call{S}') == [Text('call tool="" index="1"call')]


def test_unterminated_call_shows_name_and_partial_value():
    out = k3(
        tools(xcall("get_weather", arg("city", "string", "Bei"))[: -len(f"{C}call{S}")])[
            : -len(f"\n{C}tools{S}")
        ]
    )
    assert len(out) == 1 and "get_weather" in out[0].text and "Bei" in out[0].text
    assert not any(tok in out[0].text for tok in TOKENS)


def test_unterminated_tag_header_is_text_without_controls():
    assert k3(f"hello {O}respon") == [Text("hello respon")]
    assert k3(f"x{O}think{O}y") == [Text("xthinky")]
