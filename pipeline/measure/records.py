"""Typed records to JSON and back, by their fields: the one converter for records a stage or a
report writes as JSON and a reader wants as dataclasses.

In: a dataclass type and the JSON value written from it (a stage's ``meta``, a section of
``report.json``), or a record to write. Out: the frozen record, or the JSON-ready value with the
same keys and values as the JSON it was read from, so a record read and written again is the
same bytes. The field names are the JSON keys; a ``Speedup`` is the ``{"median", "ci95"}`` shape
``measure/timing.ratio_ci`` writes. A field whose key a writer leaves out when there is nothing
to say is marked ``OMIT_NONE`` (absent and None are then one value); an object with its own
``as_dict()`` (a record another module types its own way) is written by it, so the records
here have none. What it deliberately does not
do: coerce values (an int stays an int, so the bytes stay the same) or accept a key the record
lacks (a renamed key is a bug, and the error names it).
"""
from __future__ import annotations

import dataclasses
import enum
import types
import typing
from functools import lru_cache

from pipeline.measure.results import Speedup

OMIT_NONE = {"omit_none": True}  # field metadata: left out of the JSON when None


def json_key(name: str, **metadata) -> dict:
    """Field metadata: the field's JSON key is ``name`` (a record that keeps its old key while
    the attribute of that name still gives the old JSON form to other readers)."""
    return {"json_key": name, **metadata}


def _key(f) -> str:
    return f.metadata.get("json_key", f.name)


def to_json(obj):
    """``obj`` as JSON-ready values: dataclasses by their fields, tuples as lists."""
    if isinstance(obj, Speedup):
        return {"median": obj.median, "ci95": [obj.low, obj.high]}
    if callable(getattr(obj, "as_dict", None)) and not isinstance(obj, type):
        return obj.as_dict()
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {_key(f): to_json(getattr(obj, f.name)) for f in dataclasses.fields(obj)
                if not (f.metadata.get("omit_none") and getattr(obj, f.name) is None)}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (list, tuple)):
        return [to_json(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_json(v) for k, v in obj.items()}
    return obj


@lru_cache(maxsize=None)
def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def _keys_fit(cls, data: dict) -> bool:
    names = {_key(f) for f in dataclasses.fields(cls)}
    required = {_key(f) for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    return required <= data.keys() <= names


def from_json(tp, data):
    """``data`` (JSON values) as the type ``tp``: a dataclass from a dict with its field names
    (missing optional keys take the field's default), ``list[X]``/``tuple[X, ...]``/
    ``dict[str, X]`` element by element, ``X | None``, a union of dataclasses by the one whose
    fields the keys fit; anything else (``object``, ``float``) as it is."""
    if data is None:
        return None
    if tp is Speedup:
        return Speedup.of(data)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:
            return from_json(options[0], data)
        fitting = [a for a in options if dataclasses.is_dataclass(a) and isinstance(data, dict)
                   and _keys_fit(a, data)]
        if not fitting:
            raise ValueError(f"no record of {[a.__name__ for a in options]} has the keys "
                             f"{sorted(data)}")
        return from_json(fitting[0], data)
    if origin in (list, tuple):
        return origin(from_json(args[0] if args else object, v) for v in data)
    if origin is dict:
        return {k: from_json(args[1], v) for k, v in data.items()}
    if dataclasses.is_dataclass(tp):
        hints = _hints(tp)
        keys = [_key(f) for f in dataclasses.fields(tp)]
        unknown = sorted(set(data) - set(keys))
        if unknown:
            raise ValueError(f"{tp.__name__}: unknown key {unknown[0]!r} (keys: {', '.join(keys)})")
        return tp(**{f.name: from_json(hints[f.name], data[_key(f)])
                     for f in dataclasses.fields(tp) if _key(f) in data})
    return data
