"""JSON records as frozen dataclasses and back, by field name: the dataclass is the schema.

In: a dataclass type and a JSON-shaped value (a stage's ``meta``, a report read back), or a
dataclass to write. Out: the dataclass, its fields converted by their type hints (nested
dataclasses, ``X | None``, ``tuple[X, ...]``, ``list[X]``, ``dict[str, X]``), or the plain
value ``json.dumps`` writes. Two field markers keep a record's JSON byte for byte what its
producer wrote while the code reads only the fields it needs: ``REST`` collects the keys no field
names (and writes them back at the top level), ``OMIT`` leaves a field out of the JSON while it
is ``None`` (a key the producer writes only sometimes). An object with ``as_dict()`` (the gate's
``Verdict``) writes itself. No coercion: a value keeps its JSON type; a key that no field names,
in a record without ``REST``, raises (a renamed key is a bug, not missing data).
"""
from __future__ import annotations

import dataclasses
import enum
import types
import typing
from functools import lru_cache

REST = {"typed_json": "rest"}   # this field holds every key no other field names
OMIT = {"typed_json": "omit"}   # None: the key is left out of the JSON


def rest() -> dataclasses.Field:
    return dataclasses.field(default_factory=dict, metadata=REST)


def omitted(default=None) -> dataclasses.Field:
    return dataclasses.field(default=default, metadata=OMIT)


@lru_cache(maxsize=None)
def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def _rest_field(cls) -> str | None:
    return next((f.name for f in dataclasses.fields(cls) if f.metadata == REST), None)


def load(cls, data: dict, known_only: bool = False):
    """``cls`` from ``data``; ``known_only``: ignore the keys no field names (a view of a record
    that holds more than the reader needs, nested records too), instead of keeping them in
    its ``REST`` field."""
    if not isinstance(data, dict):
        raise TypeError(f"{cls.__name__}: expected a JSON object, got {type(data).__name__}")
    hints, spill = _hints(cls), _rest_field(cls)
    names = {f.name for f in dataclasses.fields(cls)} - {spill}
    kwargs = {k: _value(hints[k], v, known_only) for k, v in data.items() if k in names}
    others = {k: v for k, v in data.items() if k not in names}
    if others and not known_only:
        if spill is None:
            raise TypeError(f"{cls.__name__}: no field for {sorted(others)}")
        kwargs[spill] = others
    return cls(**kwargs)


def _value(hint, v, known_only: bool = False):
    if v is None:
        return None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return _value(inner[0], v, known_only) if len(inner) == 1 else v
    if dataclasses.is_dataclass(hint) and isinstance(v, dict):
        return load(hint, v, known_only)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return hint(v)
    if origin is tuple and isinstance(v, list):
        item = args[0] if args else object
        return tuple(_value(item, x, known_only) for x in v) if args[-1:] == (Ellipsis,) or len(args) == 1 \
            else tuple(_value(a, x, known_only) for a, x in zip(args, v))
    if origin is list and isinstance(v, list):
        return [_value(args[0], x, known_only) for x in v] if args else v
    if origin is dict and isinstance(v, dict):
        return {k: _value(args[1], x, known_only) for k, x in v.items()} if args else v
    return v


def dump(obj):
    """The JSON value of a record: fields by name, ``REST`` spread, ``OMIT`` fields left out
    while None; enums as their values; tuples as lists."""
    if hasattr(obj, "as_dict") and not isinstance(obj, type):
        return obj.as_dict()
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = {}
        for f in dataclasses.fields(obj):
            v = getattr(obj, f.name)
            if f.metadata == REST:
                out.update((k, dump(x)) for k, x in v.items())
            elif not (f.metadata == OMIT and v is None):
                out[f.name] = dump(v)
        return out
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (list, tuple)):
        return [dump(v) for v in obj]
    if isinstance(obj, dict):
        return {(k.value if isinstance(k, enum.Enum) else k): dump(v) for k, v in obj.items()}
    return obj
