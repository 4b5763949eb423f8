"""One error type for every failure, rendered in the caller's own dialect.

Anthropic: `{"type":"error","error":{"type":..,"message":..}}`.
OpenAI (Chat and Responses): `{"error":{"message":..,"type":..,"param":..,"code":..}}`.
"""

from __future__ import annotations

import orjson

_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}

_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
}


class ProxyError(Exception):
    """A failure with an HTTP status, a human message, an optional machine code and field, and
    headers for the client's response."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        headers: list[tuple[bytes, bytes]] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.headers = headers or []  # response headers that go with it (an engine's Retry-After)


def bad_request(message: str, param: str | None = None) -> ProxyError:
    return ProxyError(400, message, code="invalid_request", param=param)


def anthropic_type(status: int) -> str:
    if status in _ANTHROPIC_TYPES:
        return _ANTHROPIC_TYPES[status]
    return "api_error" if status >= 500 else "invalid_request_error"


def openai_type(status: int) -> str:
    if status in _OPENAI_TYPES:
        return _OPENAI_TYPES[status]
    return "server_error" if status >= 500 else "invalid_request_error"


def anthropic_error(err: ProxyError) -> dict:
    return {"type": "error", "error": {"type": anthropic_type(err.status), "message": err.message}}


def openai_error(err: ProxyError) -> dict:
    return {
        "error": {
            "message": err.message,
            "type": openai_type(err.status),
            "param": err.param,
            "code": err.code,
        }
    }


def error_body(dialect: str, err: ProxyError) -> bytes:
    body = anthropic_error(err) if dialect == "anthropic" else openai_error(err)
    return orjson.dumps(body)
