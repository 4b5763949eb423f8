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
from k3.ir import CanonicalRequest, ImagePart
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


def opt_int(value: Any, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad_request(f"{where} must be an integer", where)
    if isinstance(value, float) and not value.is_integer():
        raise bad_request(f"{where} must be an integer", where)
    if value < 0:
        raise bad_request(f"{where} must not be negative", where)
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

    @property
    def show_reasoning(self) -> bool:
        # Anthropic: a client that turned thinking off gets no thinking blocks (and rejects them next turn).
        if self.request.thinking_enabled is False:
            return False
        return self.preset.show_reasoning if self.show is None else self.show
