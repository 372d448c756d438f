"""One benchmark seen from one label's seat: that label's own numbers, read in place, nothing
copied or renamed in the benchmark's record."""
from __future__ import annotations

import copy
import json
from types import SimpleNamespace as NS

from pipeline.gate.outcome import Outcome
from pipeline.measure.results import BenchResult, Speedup
from pipeline.measure.seat import Seats, seen_from


def _sp(m):
    return {"median": m, "ci95": [m - 0.25, m + 0.25]}


def _bench(tmp_path):
    at = {"latency_ms": {"candidate": {"p50": 2.0, "p99": 3.0},
                         "dynamic @ openvino bf16": {"p50": 1.0, "p99": 1.5},
                         "fp32": {"p50": 4.0, "p99": 5.0}},
          "fastest_float": "fp32", "noisy": False,
          "speedup": {"fp32": _sp(2.0)},
          "speedup_vs_fastest_float": _sp(2.0),
          "speedup_vs_fastest_float_by_label": {"candidate": _sp(2.0),
                                                "dynamic @ openvino bf16": _sp(4.0)},
          "core_state": {"changed": False, "worst": None},
          "core_state_by_label": {"dynamic @ openvino bf16": {
              "changed": True, "worst": {"round_trip_ns": 90.0,
                                         "speedup_vs_fastest_float": _sp(3.0)}}},
          "aa_check": {"median": 1.01, "ci95": [0.99, 1.02], "tolerance": 0.03}}
    only_int8 = copy.deepcopy(at)  # batch 1: the contender was not timed there
    del only_int8["latency_ms"]["dynamic @ openvino bf16"]
    (tmp_path / "times.json").write_text(json.dumps({
        "8": {"candidate": [2.0, 2.0, 2.0], "dynamic @ openvino bf16": [1.0, 1.0, 1.0],
              "fp32": [4.0, 4.0, 4.0]}, "1": {}}))
    return NS(path=tmp_path, meta={"batches": {"8": at, "1": only_int8},
                                   "environment": {"cpu": "x"},
                                   "targets": {"dynamic @ openvino bf16": {
                                       "role": "dynamic", "runtime": "openvino",
                                       "precision": "bf16"}},
                                   "failures": {"mixed @ openvino fp16": "no kernel"}})


def test_a_contender_is_judged_on_its_own_numbers_in_the_core_state_it_fared_worst_in(tmp_path):
    bench = _bench(tmp_path)
    before = json.dumps(bench.meta, sort_keys=True)
    seat = seen_from(bench, "dynamic @ openvino bf16")
    assert list(seat.batches) == [8]  # not timed at batch 1: absent, so the gate fails it closed
    t = seat.at(8)
    assert t.label == "dynamic @ openvino bf16" and (t.p50_ms, t.p99_ms) == (1.0, 1.5)
    assert t.overall == Speedup(4.0, 3.75, 4.25) and t.speedup == Speedup(3.0, 2.75, 3.25)
    assert t.noisy and t.worst_state_ns == 90.0 and t.aa_median == 1.01
    assert t.over["fp32"].median == 4.0 and t.over["candidate"].median == 2.0  # from its rounds
    assert json.dumps(bench.meta, sort_keys=True) == before  # the record is untouched


def test_the_benchmarks_own_candidate_reads_as_the_stage_recorded_it(tmp_path):
    bench = _bench(tmp_path)
    seat, plain = seen_from(bench, "candidate").at(8), BenchResult.of(bench).at(8)
    for field in ("speedup", "overall", "p50_ms", "p99_ms", "noisy", "aa_median", "over",
                  "problems", "fastest_float"):
        assert getattr(seat, field) == getattr(plain, field), field


def test_an_outcome_names_the_seat_its_candidate_was_timed_in(tmp_path):
    bench = _bench(tmp_path)
    out = Outcome(None, {}, {}, bench, None, None)
    assert out.label_at(8) == "candidate" and out.timings().at(8).p50_ms == 2.0
    out = Outcome(None, {}, {}, bench, None, None, seat={"8": "dynamic @ openvino bf16"})
    assert out.label_at(8) == "dynamic @ openvino bf16" and out.timings().at(8).p50_ms == 1.0
    seats = Seats.of(bench)
    assert seats.timed["dynamic @ openvino bf16"].runtime == "openvino"
    assert seats.failures == {"mixed @ openvino fp16": "no kernel"}
