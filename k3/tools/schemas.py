"""What the text parsers need from the request's tool definitions: names and parameter order."""

from __future__ import annotations


def parameter_names(tools: list[dict] | None) -> dict[str, list[str]]:
    """{tool name: [parameter names in schema order]} from OpenAI-Chat tool definitions.

    The flat Responses shape (`{"type": "function", "name": …}`) is accepted too. Malformed
    entries are skipped.
    """
    names: dict[str, list[str]] = {}
    for tool in tools or []:
        if not isinstance(tool, dict):
            continue
        fn = nested if isinstance(nested := tool.get("function"), dict) else tool
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            continue
        params = fn.get("parameters")
        props = params.get("properties") if isinstance(params, dict) else None
        names[name] = list(props) if isinstance(props, dict) else []
    return names
