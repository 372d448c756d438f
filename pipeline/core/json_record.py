"""Frozen dataclasses to JSON and back, by their fields: for records a run writes as JSON and
reads back (a report's body, a stage's meta), so that code reads fields and one function knows
the shape on disk.

In: a dataclass instance (``to_json``), or a class and the parsed JSON (``from_json``). Out: the
plain JSON value, or the instance. The JSON key is the field's name unless ``key("...")`` names
another (``"4"`` is not an identifier); a field made with ``omitted()`` is left out when it is
None (keys that only some records carry), one made with ``inline()`` spreads a nested record's
keys into its parent's (and reads as None when none of the keys only it writes is there). Enums are written as their
values, dict keys as strings; a class with ``to_json`` / ``from_json`` of its own converts
itself. Deliberately not handled: type checking of the values (a JSON record this pipeline wrote
is trusted as it is read; a key it lacks reads as the field's default, else None), unions of
records, and tuples of records.
"""
from __future__ import annotations

import dataclasses
import typing
from enum import Enum
from functools import cache
from types import NoneType, UnionType

_KEY, _OMIT, _INLINE = "json_key", "json_omit_none", "json_inline"


def key(name: str, **kw):
    """A field written under ``name`` in the JSON."""
    return dataclasses.field(metadata={_KEY: name}, **kw)


def omitted(default=None, name: str | None = None):
    """A field whose key (``name``, else the field's) is absent from the JSON when it is None."""
    return dataclasses.field(default=default,
                             metadata={_OMIT: True, **({_KEY: name} if name else {})})


def inline():
    """A nested record (or None) whose keys sit in its parent's JSON object."""
    return dataclasses.field(default=None, metadata={_INLINE: True})


def to_json(value):
    """``value`` as plain JSON values: records by field, enums by value, dict keys as strings."""
    if hasattr(value, "to_json"):
        return value.to_json()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {}
        for f in dataclasses.fields(value):
            v = getattr(value, f.name)
            if f.metadata.get(_INLINE):
                out.update(to_json(v) if v is not None else {})
            elif not (v is None and f.metadata.get(_OMIT)):
                out[f.metadata.get(_KEY, f.name)] = to_json(v)
        return out
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {str(k.value if isinstance(k, Enum) else k): to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    return value


def from_json(cls, data):
    """The record of class ``cls`` (a dataclass) read from ``data`` (its JSON object)."""
    return _read(cls, data)


@cache
def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def _read(tp, data):
    if data is None:
        return None
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, UnionType):
        inner = [a for a in args if a is not NoneType]
        return _read(inner[0], data) if len(inner) == 1 else data
    if hasattr(tp, "from_json"):
        return tp.from_json(data)
    if dataclasses.is_dataclass(tp):
        return _record(tp, data)
    if isinstance(tp, type) and issubclass(tp, Enum):
        return tp(data)
    if origin is list and args:
        return [_read(args[0], v) for v in data]
    if origin is dict and len(args) == 2:
        return {_read(args[0], k): _read(args[1], v) for k, v in data.items()}
    if tp in (int, float) and isinstance(data, str):  # a dict key written as a string
        return tp(data)
    return data


def _names(cls) -> set[str]:
    return {f.metadata.get(_KEY, f.name) for f in dataclasses.fields(cls)}


def _record(cls, data: dict):
    hints, values = _hints(cls), {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        if f.metadata.get(_INLINE):  # there when a key only it writes is there
            nested = _inner(hints[f.name])
            values[f.name] = _record(nested, data) if (_names(nested) - _names(cls)) & set(data) \
                else None
            continue
        name = f.metadata.get(_KEY, f.name)
        if name in data:
            values[f.name] = _read(hints[f.name], data[name])
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            values[f.name] = None  # a key this record lacks: an older run, or a partial body
    return cls(**values)


def _inner(tp):
    """The record class of an optional field (``X | None`` -> ``X``)."""
    return next((a for a in typing.get_args(tp) if a is not NoneType), tp)
