"""Shared pieces of the three dialects: input checks that name the field, images, the turn context.

Ingress functions raise only `ProxyError(400)`, with a message that names the offending field
(`messages[2].content[0].source.data must be a string`); the hypothesis fuzz tests hold them to that.
"""

from __future__ import annotations

import math
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from k3.errors import bad_request
from k3.ir import CanonicalRequest, ImagePart, ToolDef, Usage
from k3.presets import Preset


def as_dict(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise bad_request(f"{where} must be an object", where)
    return value


def as_list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise bad_request(f"{where} must be an array", where)
    return value


def as_str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise bad_request(f"{where} must be a string", where)
    return value


def opt_str(value: Any, where: str) -> str | None:
    return None if value is None else as_str(value, where)


# The largest count an engine takes (a signed 64-bit integer); JSON numbers like 1e20 are
# integers to Python but fit no engine's int, and orjson cannot even encode them.
INT_MAX = 2**63 - 1
# The integers orjson can encode; anything forwarded verbatim must stay inside them.
_JSON_INT_MIN, _JSON_INT_MAX = -(2**63), 2**64 - 1


def opt_int(value: Any, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad_request(f"{where} must be an integer", where)
    if isinstance(value, float) and not value.is_integer():
        raise bad_request(f"{where} must be an integer", where)
    if value < 0:
        raise bad_request(f"{where} must not be negative", where)
    if value > INT_MAX:
        raise bad_request(f"{where} must be at most {INT_MAX}", where)
    return int(value)


def opt_float(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad_request(f"{where} must be a number", where)
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise bad_request(f"{where} must be a finite number", where)
    return number


def opt_bool(value: Any, where: str) -> bool | None:
    if value is None:
        return None
    if not isinstance(value, bool):
        raise bad_request(f"{where} must be a boolean", where)
    return value


def stop_list(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    items = as_list(value, where)
    return [as_str(s, f"{where}[{i}]") for i, s in enumerate(items)]


def out_of_range_int(value: Any, where: str = "") -> str | None:
    """The path (`tools[0].input_schema.maximum`) of the first integer JSON cannot carry, if any.

    Only called after an encoding failed: bodies parsed by orjson never hold one, but integers
    k3 derives, or bodies built in Python, may."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return None if _JSON_INT_MIN <= value <= _JSON_INT_MAX else (where or "(the body)")
    if isinstance(value, dict):
        for key, item in value.items():
            found = out_of_range_int(item, f"{where}.{key}" if where else str(key))
            if found:
                return found
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            found = out_of_range_int(item, f"{where}[{i}]")
            if found:
                return found
    return None


DEFAULT_SCHEMA = {"type": "object", "properties": {}}  # the parameters of a tool that declares none


def function_tool(value: Any, where: str) -> ToolDef:
    """An OpenAI function definition (name, description, JSON-schema parameters) found at `where`."""
    function = as_dict(value, where)
    params = function.get("parameters")
    return ToolDef(
        as_str(function.get("name"), f"{where}.name"),
        opt_str(function.get("description"), f"{where}.description") or "",
        DEFAULT_SCHEMA if params is None else as_dict(params, f"{where}.parameters"),
    )


def json_text(value: Any) -> str:
    """Tool outputs that are not text are shown to the engine as JSON."""
    if isinstance(value, str):
        return value
    try:
        return orjson.dumps(value).decode()
    except TypeError:  # integers beyond 64 bits and the like
        return str(value)


def arguments_text(value: Any) -> str:
    """Tool-call arguments as the engine wants them: a string kept verbatim, anything else as JSON."""
    if value is None:
        return "{}"
    return json_text(value)


def image_from_url(url: Any, where: str) -> ImagePart:
    url = as_str(url, where)
    if not url:
        raise bad_request(f"{where} must not be empty", where)
    return ImagePart(url)


def data_uri(media_type: Any, data: Any, where: str) -> ImagePart:
    media = opt_str(media_type, f"{where}.media_type") or "image/png"
    payload = as_str(data, f"{where}.data")
    return ImagePart(f"data:{media};base64,{payload}")


def new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


@dataclass(slots=True)
class Turn:
    """Everything one client turn's egress needs."""

    dialect: str
    preset: Preset
    request: CanonicalRequest
    body: dict[str, Any]  # the client's body, for values echoed back (Responses envelope)
    id: str
    created: int = field(default_factory=lambda: int(time.time()))
    show: bool | None = None  # --show-reasoning / --hide-reasoning; None: the preset decides
    status: int = 200  # what the client was answered (an error's status once the turn failed)
    usage: Usage | None = None  # the reply's token counts, once the engine's reply is translated

    @property
    def show_reasoning(self) -> bool:
        # Anthropic: a client that turned thinking off gets no thinking blocks (and rejects them next turn).
        if self.request.thinking_enabled is False:
            return False
        return self.preset.show_reasoning if self.show is None else self.show
