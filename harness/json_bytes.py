"""JSON to and from bytes with orjson where it is installed, else the standard library, byte for byte alike.

Receipts are hashed over their JSON bytes, so the two paths must agree exactly: the fallback writes what
orjson writes (keys sorted, compact or 2-space indented, UTF-8 unescaped, NaN and infinities as null,
orjson's float spelling: `0.00001` and `1e-7` where Python's repr says `1e-05` and `1e-07`). The GPU image
has no orjson (docs/RUNTIME.md); tests/harness/test_receipts.py checks both paths give the same bytes.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

try:
    import orjson
except ImportError:  # the device image: the standard library writes the same bytes
    orjson = None  # type: ignore[assignment]  # the module or None: checked before each use

DecodeError = ValueError  # orjson.JSONDecodeError and json.JSONDecodeError are both ValueErrors


def dumps(obj: object, *, indent: bool = False) -> bytes:
    """Keys sorted; `indent`: two spaces per level (orjson's OPT_INDENT_2)."""
    if orjson is not None:
        option = orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY | (orjson.OPT_INDENT_2 if indent else 0)
        return orjson.dumps(obj, option=option)
    return stdlib_dumps(obj, indent=indent)


def loads(data: bytes | str) -> Any:
    return orjson.loads(data) if orjson is not None else json.loads(data)


def stdlib_dumps(obj: object, *, indent: bool = False) -> bytes:
    """What `dumps` writes, with the standard library alone."""
    parts: list[str] = []
    _write(obj, parts, 0 if indent else None)
    return "".join(parts).encode()


def _write(obj: object, out: list[str], depth: int | None) -> None:
    if hasattr(obj, "tolist") and type(obj).__module__ == "numpy":  # numpy arrays and scalars
        obj = obj.tolist()
    if obj is None or isinstance(obj, bool):
        out.append({None: "null", True: "true", False: "false"}[obj])
    elif isinstance(obj, int):
        out.append(str(int(obj)))
    elif isinstance(obj, float):
        out.append(_float(obj))
    elif isinstance(obj, str):
        out.append(json.dumps(obj, ensure_ascii=False))
    elif isinstance(obj, dict):
        if any(not isinstance(k, str) for k in obj):
            raise TypeError("Dict key must be str")
        items = sorted(obj.items())
        _container("{", "}", [(json.dumps(k, ensure_ascii=False) + ":", v) for k, v in items], out, depth)
    elif isinstance(obj, list | tuple):
        _container("[", "]", [("", v) for v in obj], out, depth)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        _write({f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}, out, depth)
    else:
        raise TypeError(f"Type is not JSON serializable: {type(obj).__name__}")


def _container(opening: str, closing: str, items: list, out: list[str], depth: int | None) -> None:
    if not items:
        out.append(opening + closing)
        return
    inner = None if depth is None else depth + 1
    out.append(opening)
    for i, (key, value) in enumerate(items):
        if i:
            out.append(",")
        if inner is not None:
            out.append("\n" + "  " * inner)
        out.append(key + (" " if key and inner is not None else ""))
        _write(value, out, inner)
    if depth is not None:
        out.append("\n" + "  " * depth)
    out.append(closing)


def _float(value: float) -> str:
    if not math.isfinite(value):
        return "null"
    text = repr(value)
    mantissa, sep, exponent = text.partition("e-")
    if not sep:
        return text
    if int(exponent) == 5:  # orjson writes 1e-5 <= |x| < 1e-4 as a plain decimal
        sign, digits = ("-", mantissa[1:]) if mantissa.startswith("-") else ("", mantissa)
        return f"{sign}0.0000{digits.replace('.', '')}"
    return f"{mantissa}e-{int(exponent)}"
