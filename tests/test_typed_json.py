"""pipeline.core.typed_json: a JSON record read into a frozen dataclass by field name writes back
the same JSON, keys it does not name included; a key no field names, without a REST field to
hold it, is a bug and raises."""
from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from pipeline.core.typed_json import dump, load, omitted, rest
from pipeline.measure.bench_record import BenchRecord, LoadRecord
from pipeline.measure.results import Role

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
    rec = load(BenchRecord, META)
    at = rec.batches["8"]
    assert at.aa_check.ci95 == (0.99, 1.03) and at.per_size[Role.candidate][0].size == 32
    assert rec.cold_start_ms["candidate"].error == "no probe"
    assert rec.cold_start_ms["fp32"].total_ms == 6.0 and rec.input_contract.shape[0].max == 8
    assert json.dumps(dump(rec), sort_keys=True) == json.dumps(META, sort_keys=True)


def test_a_soak_without_a_slope_reads_as_none_and_writes_no_key():
    meta = {"slo_p99_ms": 50, "mode": "soak", "models": {"candidate": {"soak": {
        "qps": 10.0, "seconds": 5, "summary": {}, "memory": {"leak": False, "samples": 3}}}}}
    rec = load(LoadRecord, meta)
    soak = rec.models["candidate"].soak
    assert soak.memory.slope_mb_per_min is None and soak.memory.leak is False
    assert rec.models["candidate"].curves() == ()
    assert dump(rec) == meta


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
        load(_Strict, {"a": 1, "renamed": 2})
    assert load(_Strict, {"a": 1, "renamed": 2}, known_only=True) == _Strict(1)
    assert dump(_Strict(1)) == {"a": 1} and dump(_Strict(1, "x")) == {"a": 1, "b": "x"}
    assert dump(load(_Open, {"a": 1, "z": [1]})) == {"a": 1, "z": [1]}
