"""The gate's decision logic, on hand-made measurements."""
from __future__ import annotations

import json
from types import SimpleNamespace

from pipeline.config import GateConfig
from pipeline.gate import judge


def ev(tmp_path, name, acc, preds):
    path = tmp_path / name
    path.mkdir()
    (path / "predictions.json").write_text(json.dumps(preds))
    return SimpleNamespace(path=path, meta={"metrics": {"sequence_accuracy": acc}})


def bench(speedup):
    return SimpleNamespace(meta={"batches": {"8": {
        "speedup_vs_fastest_float": {"median": speedup, "ci95": [speedup - 0.1, speedup + 0.1]},
        "fastest_float": "fp32", "aa_check": {"median": 1.0, "ci95": [0.99, 1.01]}}}})


def test_pass_and_each_failure(tmp_path):
    evals = {"fp16": ev(tmp_path, "a", 98.5, ["A", "B"]), "candidate": ev(tmp_path, "b", 98.3, ["A", "C"])}
    v = judge(evals, bench(1.9), GateConfig(), "sequence_accuracy")
    assert v["passed"] and v["agreement_with_fp16"] == 0.5
    v = judge(evals, bench(0.95), GateConfig(), "sequence_accuracy")
    assert not v["passed"] and "0.95x" in v["summary"]
    v = judge(evals, bench(2.0), GateConfig(max_accuracy_drop=0.1), "sequence_accuracy")
    assert not v["passed"] and "drop of 0.20" in v["summary"]


def test_fails_closed_on_missing_measurements(tmp_path):
    evals = {"fp16": ev(tmp_path, "a", 98.5, ["A"]), "candidate": ev(tmp_path, "b", float("nan"), ["A"])}
    assert not judge(evals, bench(2.0), GateConfig(), "sequence_accuracy")["passed"]
    good = {"fp16": evals["fp16"], "candidate": ev(tmp_path, "c", 98.5, ["A"])}
    broken_bench = SimpleNamespace(meta={"batches": {}})
    v = judge(good, broken_bench, GateConfig(), "sequence_accuracy")
    assert not v["passed"] and "fails closed" in v["summary"]
