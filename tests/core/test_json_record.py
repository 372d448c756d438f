"""pipeline.core.json_record: records written by field and read back, with the JSON a run has
always written: renamed keys, keys left out when None, nested records spread into their parent,
the keys no field names kept (``rest``), enums by value, typed dict keys as strings and an
untyped payload's keys as its producer made them; a key no field names, without ``rest`` to
hold it, is a bug and raises, unless the reader asks for a view (``known_only``); a union of
records reads each object as the record its keys fit."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import Enum

import pytest

from pipeline.core.json_record import from_json, inline, key, omitted, rest, to_json
from pipeline.measure.bench_record import BenchRecord, LoadRecord
from pipeline.measure.results import Role, Speedup


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
    back = from_json(Outer, json.loads(json.dumps(out)))  # strict: every key has its field
    assert back == rec and isinstance(back.colour, Colour)
    assert list(back.by_colour) == [Colour.blue] and back.by_bits == {4: 2, 8: 9}


def test_a_view_reads_absent_keys_as_defaults_and_an_absent_inline_record_as_none():
    rec = from_json(Outer, {"name": "x", "extra": 5, "unrelated": 1}, known_only=True)
    assert rec.four is None and rec.extra == 5 and rec.nested is None and rec.items == []
    assert to_json(rec)["extra"] == 5 and "a" not in to_json(rec)
    with pytest.raises(TypeError, match="four"):  # strict: a field without its key is a bug
        from_json(Outer, {"name": "x"})


BATCH = {"rounds": 40, "seconds": 0.31, "noisy": False, "block": 1, "warmup_runs": {"fp32": 3},
         "latency_ms": {"candidate": {"p50": 1.0, "p99": 2.0}},
         "per_size": {"candidate": [{"size": 32, "bucket": 0, "p50": 1.0}], "fp32": []},
         "shape_outliers": [{"model": "fp32", "size": 64, "p50": 9.0, "expected_p50": 2.0}],
         "aa_check": {"median": 1.01, "ci95": [0.99, 1.03], "tolerance": 0.5, "ok": True},
         "core_state": {"probe": "p", "available": False, "probes": 0, "probe_ns_range": None,
                        "states": [], "changed": False, "worst": None}}
META = {"batches": {"8": BATCH}, "affinity": [0, 1], "failures": {},
        "size_axis": {"input": "image", "axis": 3, "meaning": "width"},
        "cold_start_ms": {"candidate": {"error": "no probe"},
                          "fp32": {"import_ms": 1.0, "session_ms": 2.0,
                                   "first_inference_ms": 3.0, "total_ms": 6.0, "repeats": 1}},
        "input_contract": {"input": "image", "dtype": "float32",
                           "shape": [{"min": 1, "max": 8}], "inputs": [], "note": "n"}}


def test_a_benchmark_record_writes_back_what_the_stage_wrote():
    rec = from_json(BenchRecord, META)
    at = rec.batches["8"]
    assert at.aa_check.ci95 == (0.99, 1.03) and at.per_size[Role.candidate][0].size == 32
    assert rec.cold_start_ms["candidate"].error == "no probe"
    assert rec.cold_start_ms["fp32"].total_ms == 6.0 and rec.input_contract.shape[0].max == 8
    assert json.dumps(to_json(rec), sort_keys=True) == json.dumps(META, sort_keys=True)


def test_a_soak_without_a_slope_reads_as_none_and_writes_no_key():
    meta = {"slo_p99_ms": 50, "mode": "soak", "models": {"candidate": {"soak": {
        "qps": 10.0, "seconds": 5, "summary": {}, "memory": {"leak": False, "samples": 3}}}}}
    rec = from_json(LoadRecord, meta)
    soak = rec.models["candidate"].soak
    assert soak.memory.slope_mb_per_min is None and soak.memory.leak is False
    assert rec.models["candidate"].curves() == ()
    assert to_json(rec) == meta


@dataclass(frozen=True)
class _Strict:
    a: int
    b: str | None = omitted()


@dataclass(frozen=True)
class _Open:
    a: int
    others: dict = rest()


def test_a_key_no_field_names_raises_unless_the_record_keeps_the_rest():
    with pytest.raises(TypeError, match=r"_Strict: no field for \['renamed'\]"):
        from_json(_Strict, {"a": 1, "renamed": 2})
    assert from_json(_Strict, {"a": 1, "renamed": 2}, known_only=True) == _Strict(1)
    assert to_json(_Strict(1)) == {"a": 1} and to_json(_Strict(1, "x")) == {"a": 1, "b": "x"}
    assert to_json(from_json(_Open, {"a": 1, "z": [1]})) == {"a": 1, "z": [1]}


@dataclass(frozen=True)
class _Payloads:
    typed: dict[int, float]
    payload: dict                     # a producer's own dict, carried without a schema
    others: dict = rest()


def test_typed_keys_are_written_as_strings_and_a_payload_keeps_its_producers_keys():
    rec = _Payloads({1: 0.5, 16: 2.0, 8: 1.0}, {1: "a", 16: "b", 8: "c"}, {"z": {2: 1, 10: 3}})
    out = to_json(rec)
    assert list(out["typed"]) == ["1", "16", "8"] and list(out["payload"]) == [1, 16, 8]
    # sorted as numbers, as report.json (sort_keys) has always ordered a payload's int keys
    assert json.dumps(out["payload"], sort_keys=True) == '{"1": "a", "8": "c", "16": "b"}'
    assert out["z"] == {2: 1, 10: 3}
    assert to_json({4: 1, Role.fp32: 2}) == {"4": 1, "fp32": 2}  # a bare dict: JSON's keys


@dataclass
class _Counted:
    seen: list

    def as_dict(self) -> dict:  # as the gate's Verdict writes itself
        return {"count": len(self.seen)}


@dataclass(frozen=True)
class _WithHooks:
    speedup: Speedup | None           # Speedup: to_json / from_json of its own
    counted: _Counted | None = None


def test_a_class_that_converts_itself_is_written_and_read_its_own_way():
    out = to_json(_WithHooks(Speedup(1.5, 1.2, 1.8), _Counted([1, 2])))
    assert out == {"speedup": {"median": 1.5, "ci95": [1.2, 1.8]}, "counted": {"count": 2}}
    back = from_json(_WithHooks, {"speedup": out["speedup"]})
    assert back.speedup == Speedup(1.5, 1.2, 1.8) and back.counted is None


@dataclass(frozen=True)
class _Small:
    node: str
    value: float | None


@dataclass(frozen=True)
class _Wide:
    node: str
    value: float | None
    extra: int


@dataclass(frozen=True)
class _Rows:
    """Rows of two shapes in one list (as the quantization record's per-node sensitivity)."""
    rows: tuple[_Wide | _Small, ...]
    speedup: Speedup | None
    by_batch: dict[str, Speedup]
    old_name: str = key("name", default="")
    maybe: _Small | None = omitted()


def test_a_union_of_records_reads_each_object_as_the_record_its_keys_fit():
    d = {"rows": [{"node": "a", "value": 1, "extra": 2}, {"node": "b", "value": None}],
         "speedup": {"median": 1.5, "ci95": [1.25, 1.75]},
         "by_batch": {"8": {"median": 0.5, "ci95": [0.25, 0.75]}}, "name": "x"}
    r = from_json(_Rows, d)
    assert [type(x) for x in r.rows] == [_Wide, _Small]
    assert r.rows[0].value == 1 and isinstance(r.rows[0].value, int)  # never coerced
    assert r.speedup == Speedup(1.5, 1.25, 1.75) and r.by_batch["8"].high == 0.75
    assert r.old_name == "x" and r.maybe is None
    assert to_json(r) == d  # "maybe" left out again, "name" under its key, tuples as lists
    assert to_json(_Rows((), None, {}, maybe=_Small("c", 2.0)))["maybe"] == \
        {"node": "c", "value": 2.0}


def test_an_object_no_record_of_a_union_fits_is_refused_with_its_keys():
    with pytest.raises(TypeError, match=r"no record of \['_Wide', '_Small'\] has the keys \['node'\]"):
        from_json(_Rows, {"rows": [{"node": "a"}], "speedup": None, "by_batch": {}})
    with pytest.raises(TypeError, match=r"no record of .* has the keys \['node', 'values'\]"):
        from_json(_Rows, {"rows": [{"node": "a", "values": 1}], "speedup": None, "by_batch": {}})
