"""Typed records to and from the JSON the pipeline writes, by their dataclass fields.

In: a dataclass whose field names are the JSON's keys (or a JSON value and the type to read it
as). Out: the JSON-ready value (``to_json``), or the record (``from_json``), nested records,
lists, tuples, ``dict[str, X]`` and ``X | None`` included, by the fields' type hints. A field
marked ``omit_none`` is left out of the JSON while it is None (a key that earlier runs wrote only
sometimes); a class with its own JSON form (``as_dict`` and a classmethod ``of``, e.g. a ratio
written as ``{"median", "ci95"}``) is written and read by those. It is the one place where a
record meets its JSON, so that the code reading a record reads fields and a report written
before a change reads back the same. Not a schema validator: a key the record does not name is
ignored on reading, and a value of another type is taken as it is.
"""
from __future__ import annotations

import dataclasses
import types
import typing
from functools import cache

OMIT_NONE = {"omit_none": True}  # field(metadata=OMIT_NONE): no key while the value is None


def to_json(obj):
    """The JSON-ready value of a record (or of a list, tuple or dict of them)."""
    if hasattr(obj, "as_dict") and not isinstance(obj, type):
        return obj.as_dict()
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return fields_json(obj)
    if isinstance(obj, (list, tuple)):
        return [to_json(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_json(v) for k, v in obj.items()}
    return obj


def fields_json(obj) -> dict:
    """A record's JSON by its fields (what ``as_dict`` of a record without a form of its own
    returns)."""
    return {f.name: to_json(getattr(obj, f.name)) for f in dataclasses.fields(obj)
            if not (f.metadata.get("omit_none") and getattr(obj, f.name) is None)}


@cache
def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def from_json(tp, data):
    """``data`` (JSON, or already a record) read as ``tp``: a record class, ``list[X]``,
    ``tuple[X, ...]``, ``dict[str, X]``, ``X | None`` or a plain type."""
    if data is None:
        return None
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return from_json(inner[0], data) if len(inner) == 1 else data
    if origin in (list, tuple):
        items = [from_json(args[0], v) for v in data] if args else list(data)
        return tuple(items) if origin is tuple else items
    if origin is dict:
        return {k: from_json(args[1], v) for k, v in data.items()}
    if not isinstance(tp, type):
        return data
    if isinstance(data, tp):
        return data
    if dataclasses.is_dataclass(data):  # another record of the same shape: through its JSON
        data = to_json(data)
    if hasattr(tp, "of") and hasattr(tp, "as_dict"):
        return tp.of(data)
    if dataclasses.is_dataclass(tp):
        return fields_from_json(tp, data)
    return data


def fields_from_json(cls, data: dict):
    """A record read from its JSON by its fields (what ``of`` of such a record returns)."""
    if dataclasses.is_dataclass(data):  # another record of the same shape: through its JSON
        data = to_json(data)
    hints = _hints(cls)
    return cls(**{f.name: from_json(hints[f.name], data[f.name])
                  for f in dataclasses.fields(cls) if f.name in data})
