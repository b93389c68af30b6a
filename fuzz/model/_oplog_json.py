"""An operation log (:class:`fuzz.model.OpLog`) as JSON, and back.

The campaign's sidecar keeps a finding's whole log under ``oplog``, so that
``python -m fuzz replay`` can rerun it through the harness with every check
on. Encoding is generic: each dataclass becomes an object naming its class
under ``"@type"`` beside its fields, tuples become lists, enums their values.
Decoding reads the declared field types (``typing.get_type_hints``) to
restore tuples, lists, optional values, enums and nested dataclasses, and
uses ``"@type"`` only to pick among the members of a union (a log's
operations). No per-class code: a new field or operation needs none here.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
import typing
from typing import Any

from fuzz.model._oplog import OpLog

__all__ = ["decode_oplog", "encode_oplog"]

TYPE_KEY = "@type"
FORMAT = 1  # bumped when an old sidecar's log can no longer be read


def encode_oplog(log: OpLog) -> dict[str, Any]:
    """``log`` as a JSON-ready object (dicts, lists, strings, numbers, None)."""
    return {"format": FORMAT, "log": _encode(log)}


def decode_oplog(data: object) -> OpLog:
    """The log :func:`encode_oplog` wrote; ``ValueError`` naming the first
    thing that does not fit the declared types."""
    if not isinstance(data, dict) or data.get("format") != FORMAT or "log" not in data:
        raise ValueError(f"not an operation log of format {FORMAT} (an object with 'format' and 'log')")
    return _decode(data["log"], OpLog, "log")


def _encode(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {TYPE_KEY: type(value).__name__}
        for f in dataclasses.fields(value):
            if f.init:
                out[f.name] = _encode(getattr(value, f.name))
        return out
    if isinstance(value, enum.Enum):
        return _encode(value.value)
    if isinstance(value, (tuple, list)):
        return [_encode(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _encode(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"cannot encode {type(value).__name__} {value!r} in an operation log")


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _decode(value: Any, hint: Any, where: str) -> Any:
    """``value`` restored to the declared type ``hint``; ``where`` names it in errors."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        members = [a for a in args if a is not type(None)]
        if isinstance(value, dict) and TYPE_KEY in value:
            named = [a for a in members if isinstance(a, type) and a.__name__ == value[TYPE_KEY]]
            if not named:
                names = [getattr(a, "__name__", a) for a in members]
                raise ValueError(f"{where}: {value[TYPE_KEY]!r} is none of {names}")
            return _decode(value, named[0], where)
        for member in members:
            try:
                return _decode(value, member, where)
            except (TypeError, ValueError):
                continue
        raise ValueError(f"{where}: {value!r} fits none of {hint}")
    if origin is tuple or origin is list:
        if not isinstance(value, list):
            raise ValueError(f"{where}: expected a list for {hint}, got {value!r}")
        if origin is list:
            return [_decode(v, args[0] if args else Any, f"{where}[{i}]") for i, v in enumerate(value)]
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_decode(v, args[0], f"{where}[{i}]") for i, v in enumerate(value))
        if args and len(args) != len(value):
            raise ValueError(f"{where}: expected {len(args)} items for {hint}, got {len(value)}")
        return tuple(_decode(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(value, args or [Any] * len(value))))
    if origin is dict:
        if not isinstance(value, dict):
            raise ValueError(f"{where}: expected an object for {hint}, got {value!r}")
        key_t, val_t = args or (Any, Any)
        return {_decode(k, key_t, where): _decode(v, val_t, f"{where}[{k!r}]") for k, v in value.items()}
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _decode_dataclass(value, hint, where)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        try:
            return hint(value)
        except ValueError:
            raise ValueError(f"{where}: {value!r} is no {hint.__name__}") from None
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint in (bool, int, float, str):
        # bool is an int in Python: an int field holding True is a wrong type, not a 1.
        if type(value) is not hint:
            raise ValueError(f"{where}: expected {hint.__name__}, got {value!r}")
        return value
    if hint is type(None):
        if value is not None:
            raise ValueError(f"{where}: expected null, got {value!r}")
        return None
    raise TypeError(f"{where}: cannot decode the declared type {hint!r}")


def _decode_dataclass(value: Any, cls: type, where: str) -> Any:
    if not isinstance(value, dict):
        raise ValueError(f"{where}: expected a {cls.__name__} object, got {value!r}")
    name = value.get(TYPE_KEY, cls.__name__)
    if name != cls.__name__:
        raise ValueError(f"{where}: expected a {cls.__name__}, got a {name!r}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(value) - set(fields) - {TYPE_KEY})
    if unknown:
        raise ValueError(f"{where}: {cls.__name__} has no field {unknown[0]!r} (a log from another version)")
    hints = _hints(cls)
    # A field missing from the object keeps its default (a log written before the field existed).
    kwargs = {n: _decode(value[n], hints[n], f"{where}.{n}") for n in fields if n in value}
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ValueError(f"{where}: {exc}") from None
