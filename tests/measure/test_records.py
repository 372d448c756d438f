"""The typed-record converter (``pipeline.measure.records``): JSON read into dataclasses by their
fields and written back to the same JSON, whatever the record's shape."""
from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from pipeline.measure.records import OMIT_NONE, from_json, json_key, to_json
from pipeline.measure.results import Speedup


@dataclass(frozen=True)
class Small:
    node: str
    value: float | None


@dataclass(frozen=True)
class Wide:
    node: str
    value: float | None
    extra: int


@dataclass(frozen=True)
class Record:
    rows: tuple[Wide | Small, ...]
    speedup: Speedup | None
    by_batch: dict[str, Speedup]
    old_name: str = field(default="", metadata=json_key("name"))
    maybe: Small | None = field(default=None, metadata=OMIT_NONE)


def test_a_record_round_trips_to_the_same_json():
    d = {"rows": [{"node": "a", "value": 1, "extra": 2}, {"node": "b", "value": None}],
         "speedup": {"median": 1.5, "ci95": [1.25, 1.75]},
         "by_batch": {"8": {"median": 0.5, "ci95": [0.25, 0.75]}}, "name": "x"}
    r = from_json(Record, d)
    assert [type(x) for x in r.rows] == [Wide, Small]  # the record whose fields the keys fit
    assert r.rows[0].value == 1 and isinstance(r.rows[0].value, int)  # never coerced
    assert r.speedup == Speedup(1.5, 1.25, 1.75) and r.by_batch["8"].high == 0.75
    assert r.old_name == "x" and r.maybe is None
    assert to_json(r) == d  # "maybe" left out again, "name" under its key, tuples as lists
    assert to_json(Record((), None, {}, maybe=Small("c", 2.0)))["maybe"] == {"node": "c", "value": 2.0}


def test_keys_a_record_lacks_are_refused_by_name():
    with pytest.raises(ValueError, match="'values'"):
        from_json(Small, {"node": "a", "values": 1})
    with pytest.raises(ValueError, match="no record of"):
        from_json(Record, {"rows": [{"node": "a"}], "speedup": None, "by_batch": {}})
