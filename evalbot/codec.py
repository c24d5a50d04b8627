"""JSON (de)serialization of the bot's plain data: ``to_dict`` / ``from_dict`` for any frozen dataclass tree.

Generic over dataclasses, enums, tuples, dicts and unions, so it needs no model type: ``evalbot.model``'s
types (and any other dataclass) round-trip through it as plain JSON data (result.json, the comment's
embedded state, the store's columns).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
import typing
from typing import Any


def to_dict(obj: Any) -> Any:
    """A dataclass tree as plain JSON data (enums by value, tuples as lists)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (list, tuple)):
        return [to_dict(x) for x in obj]
    if isinstance(obj, dict):
        return {str(k): to_dict(v) for k, v in obj.items()}
    return obj


T = typing.TypeVar("T")


def from_dict(cls: type[T], data: Any) -> T:
    """Rebuild a dataclass (recursively) from to_dict's output; unknown keys are an error, except those a
    class names in its ``RETIRED_FIELDS`` (fields it no longer has, which older records still carry)."""
    return typing.cast(T, _build(cls, data, cls.__name__))


@functools.cache
def _fields_of(tp: type) -> tuple[dict[str, Any], frozenset[str]]:
    # resolving the string annotations is the slow part of from_dict: once per class, not per object
    return typing.get_type_hints(tp), frozenset(f.name for f in dataclasses.fields(tp))


def _build(tp: Any, data: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return data
    if origin in (typing.Union, types.UnionType):
        if data is None and type(None) in args:
            return None
        errors = []
        for alt in args:
            if alt is type(None):
                continue
            try:
                return _build(alt, data, where)
            except (TypeError, ValueError) as exc:
                errors.append(str(exc))
        raise ValueError(f"{where}: {data!r} matches none of {args}: {'; '.join(errors)}")
    if origin is tuple:
        if not isinstance(data, (list, tuple)):
            raise TypeError(f"{where}: expected a list, got {type(data).__name__}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_build(args[0], x, f"{where}[{i}]") for i, x in enumerate(data))
        if len(args) != len(data):
            raise ValueError(f"{where}: expected {len(args)} items, got {len(data)}")
        return tuple(_build(a, x, f"{where}[{i}]") for i, (a, x) in enumerate(zip(args, data, strict=True)))
    if origin is dict:
        if not isinstance(data, dict):
            raise TypeError(f"{where}: expected an object, got {type(data).__name__}")
        return {k: _build(args[1], v, f"{where}.{k}") for k, v in data.items()}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp(data)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(data, dict):
            raise TypeError(f"{where}: expected an object, got {type(data).__name__}")
        hints, names = _fields_of(tp)
        # a field the class has dropped, which records written before still carry: read and ignored
        retired: frozenset[str] = getattr(tp, "RETIRED_FIELDS", frozenset())
        unknown = set(data) - names - retired
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {sorted(unknown)}")
        kwargs = {k: _build(hints[k], v, f"{where}.{k}") for k, v in data.items() if k not in retired}
        return tp(**kwargs)
    if tp is float:
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            raise TypeError(f"{where}: expected a number, got {data!r}")
        return float(data)
    if tp is int:
        if isinstance(data, bool) or not isinstance(data, int):
            raise TypeError(f"{where}: expected an integer, got {data!r}")
        return data
    if tp in (str, bool):
        if not isinstance(data, tp):
            raise TypeError(f"{where}: expected {tp.__name__}, got {data!r}")
        return data
    return data


__all__ = ["from_dict", "to_dict"]
