"""quant=auto's result and the float-region record: typed records whose JSON is the one every
earlier run wrote (report.json's ``auto`` section, ``quantization.regions``), read back the same."""
from __future__ import annotations

import json

from pipeline.core.json_record import to_json
from pipeline.measure.results import Role, Speedup
from pipeline.recipes.auto_result import AutoResult, Int8Trials, LatencyTrial, Notes
from pipeline.recipes.auto_table import BatchLatency, Row
from pipeline.recipes.regions_record import FloatRegions, RegionGain, RegionsTimed, Trial

SP = {"median": 1.25, "ci95": [1.125, 1.5]}

# a timed record as recipes/regions.py wrote it before it was typed, key for key
TIMED = {"regions": [{"name": "stem.0", "nodes": 3, "profile_gain_ms": -0.25}],
         "trials": [{"name": "stem.0", "regions": ["stem.0"], "float_nodes": ["a", "b"],
                     "p50_ms": 1.5, "speedup_over_all_int8": SP,
                     "speedup_over_fp32": {"median": 0.75, "ci95": [0.5, 0.875]},
                     "ms_saved_vs_all_int8": 0.125}],
         "kept": "stem.0", "limit": 2, "node_trial": None, "batch_size": 8, "rounds": 40,
         "all_int8_over_fp32": SP, "p50_ms": {"all-int8": 1.625, "fp32": 2.0},
         "faster_than_fp32": [], "summary": "kept stem.0 float"}
# no region could be made float: no timing keys at all
UNTIMED = {"regions": [{"name": "stem.0", "nodes": 3, "profile_gain_ms": -0.25}],
           "trials": [], "kept": None, "limit": 2, "node_trial": None,
           "summary": "no region could be made float"}


def test_the_region_record_writes_the_json_earlier_runs_wrote_and_reads_it_back():
    for data in (TIMED, UNTIMED):
        rec = FloatRegions.of(data)
        assert isinstance(rec, FloatRegions) and all(isinstance(r, RegionGain) for r in rec.regions)
        assert json.dumps(to_json(rec)) == json.dumps(data)  # same keys, same order, same values
        assert FloatRegions.of(to_json(rec)) == rec
    rec = FloatRegions.of(TIMED)
    assert isinstance(rec.trials[0], Trial) and rec.trials[0].speedup_over_all_int8 == \
        Speedup(1.25, 1.125, 1.5)
    assert FloatRegions.of(None) is None


def test_the_regions_stage_meta_is_read_once_into_fields():
    meta = {"batch_size": 8, "rounds": 40, "warmup_runs": {"fp32": 3},
            "p50_ms": {"all-int8": 1.625, "fp32": 2.0, "t": 1.5}, "all_int8_over_fp32": SP,
            "trials": {"t": {"p50_ms": 1.5, "speedup_over_all_int8": SP,
                             "speedup_over_fp32": SP, "ms_saved_vs_all_int8": 0.125}}}
    timed = RegionsTimed.of(meta)
    assert timed.trials["t"].speedup_over_fp32.low == 1.125 and timed.rounds == 40


def _row(name, role, p50, metric="sequence_accuracy", **kw) -> Row:
    return Row(name, role, "onnxruntime fp32", name, "onnxruntime", "fp32", not kw.get("failed"),
               kw.get("failed", []), [], {"8": BatchLatency(p50, 2 * p50)},
               Speedup(2.0, 1.5, 2.5), "fp32", metric, 99.5, 0.25, 0.875, "ab", p50,
               kw.get("timed", True))


def _auto() -> AutoResult:
    win = _row("dynamic", Role.dynamic, 1.0)
    table = [win, _row("int8", Role.candidate, 0.5, failed=["accuracy_drop"]),
             Row("mixed", Role.mixed, "openvino fp32", "mixed @ openvino fp32", "openvino",
                 "fp32", False, ["accuracy_drop"], ["not timed"], metric="sequence_accuracy",
                 accuracy=90.0, accuracy_drop=9.5, agreement_with_fp16=0.5, timed=False)]
    return AutoResult(win, table, ["because"], Notes(mixed="not built"),
                      ["onnxruntime fp32", "openvino fp32"], {"openvino fp16": "no kernels"},
                      {}, 8, Int8Trials(LatencyTrial(["a"], [], Speedup(1.25, 1.125, 1.5)),
                                        FloatRegions.of(TIMED), ["a", "b"], []), None)


def test_the_auto_result_keeps_the_report_json_and_renders_the_same_from_either_form():
    from pipeline.report.auto import markdown

    auto = _auto()
    data = to_json(auto)
    assert list(data) == ["winner", "table", "why", "notes", "targets", "unavailable",
                          "failures", "gate_batch", "int8", "dynamic_source"]
    assert data["notes"] == {"mixed": "not built"}  # only what was not built
    assert data["table"][0]["sequence_accuracy"] == 99.5 and "metric" not in data["table"][0]
    assert data["table"][2]["timed"] is False and "timed" not in data["table"][0]
    assert data["int8"]["latency_trial"] == {"float_nodes": ["a"], "stayed_int8": [],
                                             "speedup_over_all_int8": SP}
    assert data["int8"]["regions"] == TIMED
    back = AutoResult.of(json.loads(json.dumps(data)))  # as report.json holds it
    assert back == auto
    md = markdown(auto, "sequence_accuracy")
    assert md == markdown(json.loads(json.dumps(data)), "sequence_accuracy")
    text = "\n".join(md)
    assert "**Winner: dynamic on onnxruntime fp32.**" in text and "- mixed: not built" in text
    assert ("| dynamic ★ | onnxruntime fp32 | 99.50 % | 0.25 points | 87.50 % | 1.00 | "
            "2.00x (CI 1.50-2.50) | pass |") in text
    assert "| mixed | openvino fp32 | 90.00 % | 9.50 points | 50.00 % | – |" in text
    assert "### Float regions" in text and "| stem.0 ★ | stem.0 | 2 |" in text
