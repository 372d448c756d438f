"""pipeline.core.json_record: records written by field and read back, with the JSON a run has
always written (renamed keys, keys left out when None, nested records spread into their parent,
enums by value, numeric dict keys as strings)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import Enum

from pipeline.core.json_record import from_json, inline, key, omitted, to_json


class Colour(str, Enum):
    red = "red"
    blue = "blue"


@dataclass(frozen=True)
class Inner:
    a: int | None = None
    b: str | None = None


@dataclass(frozen=True)
class Outer:
    name: str
    four: int = key("4")
    extra: int | None = omitted()
    nested: Inner | None = inline()
    colour: Colour | None = None
    by_bits: dict[int, int] = field(default_factory=dict)
    items: list[Inner] = field(default_factory=list)
    by_colour: dict[Colour, Inner] = field(default_factory=dict)


def test_a_record_round_trips_through_the_json_it_writes():
    rec = Outer("x", 3, None, Inner(1, None), Colour.red, {4: 2, 8: 9}, [Inner(2, "y")],
                {Colour.blue: Inner(b="z")})
    out = to_json(rec)
    assert out == {"name": "x", "4": 3, "a": 1, "b": None, "colour": "red",
                   "by_bits": {"4": 2, "8": 9}, "items": [{"a": 2, "b": "y"}],
                   "by_colour": {"blue": {"a": None, "b": "z"}}}
    assert "extra" not in out  # None and omitted: absent, not null
    assert json.loads(json.dumps(out)) == out
    back = from_json(Outer, json.loads(json.dumps(out)))
    assert back == rec and isinstance(back.colour, Colour)
    assert list(back.by_colour) == [Colour.blue] and back.by_bits == {4: 2, 8: 9}


def test_keys_a_body_lacks_read_as_defaults_and_an_absent_inline_record_as_none():
    rec = from_json(Outer, {"name": "x", "extra": 5})
    assert rec.four is None and rec.extra == 5 and rec.nested is None and rec.items == []
    assert to_json(rec)["extra"] == 5 and "a" not in to_json(rec)
