"""JSON records as frozen dataclasses and back, by field: the dataclass is the schema, so code
reads fields and one function knows the shape on disk (a stage's ``meta``, a report's body).

In: a dataclass and a JSON-shaped value (``from_json``), or a record to write (``to_json``). Out:
the record, its fields converted by their type hints (nested records, ``X | None``,
``tuple[X, ...]``, ``list[X]``, ``dict[K, X]``, enums; a dict's keys to ``K``: ``"4"`` -> ``4``,
``"fp32"`` -> ``Role.fp32``), or the plain value ``json.dumps`` writes. The field markers keep a
record's JSON byte for byte what its producer wrote while the code reads only what it needs:
- ``key("4")``: the field's JSON key, where it is not an identifier;
- ``omitted()``: the key is left out while the field is None (keys only some records carry);
- ``inline()``: a nested record whose keys sit in its parent's object (read as None when none
  of the keys only it writes is there);
- ``rest()``: every key no field names, kept and written back at the top level.
A class with ``to_json`` / ``as_dict`` (the gate's ``Verdict``) writes itself, one with
``from_json`` reads itself. Dict keys: enums by value; a typed dict's keys (``dict[int, X]``)
as strings, as JSON has them; an untyped payload (a ``dict`` or ``object`` field, ``rest()``)
keeps its producer's keys, so ``json.dumps(sort_keys=True)`` orders them as it always did.
Strict by default: a key no field names, in a record without ``rest()``, raises (a renamed key
is a bug, not missing data), and so does a field without a default whose key is absent.
``known_only=True`` reads a view: keys no field names are ignored and an absent key reads as
the field's default, else None (a record read from a stage's ``meta``, or an older run's body).
A union of records (``list[NodeSensitivity | NodeSqnr]``: rows of two shapes in one list) reads
each object as the record whose fields its keys fit (every required key there, no key it lacks).
Deliberately not handled: type checking or coercion of values (a value keeps its JSON type).
"""
from __future__ import annotations

import dataclasses
import enum
import types
import typing
from functools import cache

_KEY, _OMIT, _INLINE, _REST = "json_key", "json_omit_none", "json_inline", "json_rest"


def key(name: str, **kw) -> dataclasses.Field:
    """A field written under ``name`` in the JSON."""
    return dataclasses.field(metadata={_KEY: name}, **kw)


def omitted(default=None, name: str | None = None) -> dataclasses.Field:
    """A field whose key (``name``, else the field's) is absent from the JSON when it is None."""
    return dataclasses.field(default=default,
                             metadata={_OMIT: True, **({_KEY: name} if name else {})})


def inline() -> dataclasses.Field:
    """A nested record (or None) whose keys sit in its parent's JSON object."""
    return dataclasses.field(default=None, metadata={_INLINE: True})


def rest() -> dataclasses.Field:
    """A dict of every key no other field names, written back beside the fields."""
    return dataclasses.field(default_factory=dict, metadata={_REST: True})


# ---- writing


def to_json(value):
    """``value`` as plain JSON values: records by field, enums by value, tuples as lists."""
    return _write(value, keep_keys=False)


def _write(value, keep_keys: bool):
    if not isinstance(value, type):
        if hasattr(value, "to_json"):
            return value.to_json()
        if hasattr(value, "as_dict"):
            return value.as_dict()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _write_record(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [_write(v, keep_keys) for v in value]
    if isinstance(value, dict):
        return {_write_key(k, keep_keys): _write(v, keep_keys) for k, v in value.items()}
    return value


def _write_key(k, keep: bool):
    if isinstance(k, enum.Enum):
        return k.value
    return k if keep else str(k)


def _write_record(rec) -> dict:
    hints, out = _hints(type(rec)), {}
    for f in dataclasses.fields(rec):
        v = getattr(rec, f.name)
        if f.metadata.get(_REST):
            out.update((k, _write(x, keep_keys=True)) for k, x in v.items())
        elif f.metadata.get(_INLINE):
            out.update(_write(v, keep_keys=False) if v is not None else {})
        elif not (v is None and f.metadata.get(_OMIT)):
            out[f.metadata.get(_KEY, f.name)] = _write(v, keep_keys=_untyped(hints[f.name]))
    return out


def _untyped(hint) -> bool:
    """A payload the record carries without a schema (``dict``, ``object``, ``list``)."""
    inner = [a for a in typing.get_args(hint) if a is not types.NoneType] \
        if typing.get_origin(hint) in (typing.Union, types.UnionType) else [hint]
    return any(a in (dict, list, tuple, object, typing.Any) for a in inner)


# ---- reading


def from_json(cls, data: dict, known_only: bool = False):
    """The record of class ``cls`` read from ``data`` (its JSON object). ``known_only``: a view,
    nested records too: keys no field names are ignored, an absent key reads as its field's
    default, else None."""
    if not isinstance(data, dict):
        raise TypeError(f"{cls.__name__}: expected a JSON object, got {type(data).__name__}")
    hints, values, used, spill = _hints(cls), {}, set(), None
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        if f.metadata.get(_REST):
            spill = f.name
        elif f.metadata.get(_INLINE):
            nested = _inner(hints[f.name])
            own = _names(nested) - _names(cls)  # there when a key only it writes is there
            used |= _names(nested)
            values[f.name] = from_json(nested, data, known_only=True) if own & set(data) \
                else None
        elif (name := f.metadata.get(_KEY, f.name)) in data:
            used.add(name)
            values[f.name] = _read(hints[f.name], data[name], known_only)
        elif known_only and _required(f):
            values[f.name] = None  # a key this view lacks: an older run, or a partial body
    others = {k: v for k, v in data.items() if k not in used}
    if others and not known_only:
        if spill is None:
            raise TypeError(f"{cls.__name__}: no field for {sorted(others)}")
        values[spill] = others
    return cls(**values)


def _read(hint, v, known_only: bool):
    if v is None:
        return None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not types.NoneType]
        if len(inner) == 1:
            return _read(inner[0], v, known_only)
        return _read_union(inner, v, known_only)
    if hasattr(hint, "from_json"):
        return hint.from_json(v)
    if dataclasses.is_dataclass(hint) and isinstance(v, dict):
        return from_json(hint, v, known_only)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return hint(v)
    if origin is tuple and isinstance(v, list):
        if args[-1:] == (Ellipsis,) or len(args) == 1:
            return tuple(_read(args[0], x, known_only) for x in v)
        return tuple(_read(a, x, known_only) for a, x in zip(args, v))
    if origin is list and isinstance(v, list):
        return [_read(args[0], x, known_only) for x in v]
    if origin is dict and isinstance(v, dict):
        return {_read_key(args[0], k): _read(args[1], x, known_only) for k, x in v.items()}
    return v


def _read_union(options: list, v, known_only: bool):
    """``v`` as the first record of ``options`` whose fields its keys fit; a value that is no
    JSON object, or a union of no records, is kept as it is."""
    records = [a for a in options if dataclasses.is_dataclass(a)]
    if not records or not isinstance(v, dict):
        return v
    for cls in records:
        fields = [f for f in dataclasses.fields(cls) if f.init]
        names = {f.metadata.get(_KEY, f.name) for f in fields}
        required = {f.metadata.get(_KEY, f.name) for f in fields if _required(f)}
        if required <= v.keys() <= names:
            return from_json(cls, v, known_only)
    raise TypeError(f"no record of {[a.__name__ for a in records]} has the keys {sorted(v)}")


def _read_key(hint, k):
    """A dict key as its type: JSON writes every key as a string."""
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return hint(k)
    if hint in (int, float) and isinstance(k, str):
        return hint(k)
    return k


@cache
def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def _names(cls) -> frozenset[str]:
    """The JSON keys a record's own fields write."""
    return frozenset(f.metadata.get(_KEY, f.name) for f in dataclasses.fields(cls)
                     if not f.metadata.get(_REST) and not f.metadata.get(_INLINE))


def _required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def _inner(hint):
    """The record class of an optional field (``X | None`` -> ``X``)."""
    return next((a for a in typing.get_args(hint) if a is not types.NoneType), hint)
