"""report.md's tables read as a person reads numbers: units in the cells, the candidate's speedup
with its interval, each gate check's value and limit in the unit of what it checks."""
from __future__ import annotations

from pipeline.report.run import markdown


def _report() -> dict:
    lat = {"p50": 3.3249, "p99": 13.79, "speedup_vs_fastest_float": 1.31}
    row = {"role": "candidate", "step": "quantize (int8, candidate)", "size_mb": 1.5512,
           "nodes": 1074, "sequence_accuracy": 99.5, "cosine_mean": 0.99984,
           "agreement_with_fp16": 0.9995,
           "latency": {"8": {**lat, "speedup_ci95": [1.495, 1.59]}}}
    fp32 = {**row, "role": "fp32", "step": "optimize (FP32 baseline)", "size_mb": 6.06,
            "agreement_with_fp16": 1.0, "latency": {"8": {**lat, "speedup_vs_fastest_float": 1.0}}}
    checks = [("accuracy_drop", 0.04999999999999716, 0.3), ("cosine_mean_drop", 0.00012, 0.01),
              ("output_agreement", 0.9995, 0.95), ("speedup_ci_low", 1.495, 1.0),
              ("aa_check", 0.025, 0.03), ("slo_p99_ms", 124.974, 200.0),
              ("a_check_added_later", 0.123456, 1)]
    return {"model": "ocr", "quant": "int8", "rows": [fp32, row],
            "metrics": [{"name": "sequence_accuracy", "unit": "%", "primary": True},
                        {"name": "cosine_mean", "unit": "", "primary": False}],
            "verdict": {"summary": "PASS", "checks": [
                {"check": c, "value": v, "limit": lim, "passed": True, "detail": "d"}
                for c, v, lim in checks]},
            "aa_check": {"8": {"median": 1.0251, "ci95": [1.01, 1.04]}},
            "stages": [{"label": "export", "reused": False, "seconds": 12.345, "digest": "ab" * 32}],
            "environment": {"cpu": {"model": "x", "logical_cores": 2, "flags": ["avx2"]},
                            "provider": "CPUExecutionProvider", "threads": 2, "tools": {"onnx": "1"}},
            "load": {"slo_p99_ms": 200, "models": {"candidate": {"dynamic": {
                "max_qps_within_slo": 325.68, "throughput_at_max": 320.1, "steps": [1, 2]}}}}}


def test_the_step_table_carries_units_and_the_candidates_interval():
    md = markdown(_report())
    assert ("| quantize (int8, candidate) | 1.55 MB | 1,074 | 99.50 | 0.9998 | 99.95 % "
            "| 3.32 / 13.79 ms | 1.31x (CI 1.50-1.59) |") in md
    assert "| optimize (FP32 baseline) | 6.06 MB | 1,074 | 99.50 | 0.9998 | 100.00 % " in md
    assert "(FP32 against a second copy of itself): 1.03x (CI 1.01-1.04)." in md


def test_each_gate_check_reads_in_the_unit_of_what_it_checks():
    md = markdown(_report())
    assert "| accuracy_drop | 0.05 points | 0.30 points | pass |" in md
    assert "| cosine_mean_drop | 0.0001 | 0.0100 | pass |" in md  # not a percentage: no points
    assert "| output_agreement | 99.95 % | 95.00 % |" in md
    assert "| speedup_ci_low | 1.50x | 1.00x |" in md
    assert "| aa_check | 2.50 % | 3.00 % |" in md
    assert "| slo_p99_ms | 125.0 ms | 200.0 ms |" in md
    assert "| a_check_added_later | 0.123 | 1 |" in md  # unknown: a plain number
    assert "| candidate | dynamic | 325.7/s | 320.1/s | 2 |" in md
    assert "| export | built | 12.35 s |" in md


def _runtimes(metric: str, value: float, drop: float) -> dict:
    cell = {metric: value, "latency_ms": {"1": {"p50": 14.09}}}
    return {"mode": "fixed", "targets": ["onnxruntime fp32"],
            "cells": {"candidate": {"onnxruntime fp32": cell}},
            "choice": {"1": {"target": "onnxruntime fp32", metric: value, "accuracy_drop": drop,
                             "p50": 14.09, "p99": 19.87, "passes_accuracy": True,
                             "considered": ["onnxruntime fp32"]}},
            "deployed": {"runtime": "onnxruntime", "precision": "fp32", "intra_op_threads": 2,
                         "performance_hint": "latency"}}


def test_the_runtimes_and_auto_tables_read_a_cosine_as_a_cosine_not_as_a_percentage():
    """A cosine of 0.9904 read "0.99 %" and its drop "0.01" in the runtimes table, and the
    quant=auto table was headed "seq acc %" whatever the metric."""
    from pipeline.report.auto import markdown as auto_markdown
    from pipeline.runtimes.render import markdown as runtimes_markdown

    md = "\n".join(runtimes_markdown(_runtimes("cosine_mean", 0.99037, 0.00963), "cosine_mean", ""))
    assert "| ★ 0.9904 · b1 14.09 ms |" in md
    assert "cosine mean 0.9904 (drop 0.0096 vs FP16)" in md
    assert " %" not in md.split("Each cell")[1]
    md = "\n".join(runtimes_markdown(_runtimes("sequence_accuracy", 87.5, 0.25),
                                     "sequence_accuracy", "%"))
    assert "| ★ 87.50 % · b1 14.09 ms |" in md and "(drop 0.25 points vs FP16)" in md
    row = {"candidate": "dynamic", "role": "dynamic", "target": "onnxruntime fp32",
           "label": "dynamic", "runtime": "onnxruntime", "precision": "fp32",
           "failed_detail": [], "cosine_mean": 0.99037, "accuracy_drop": 0.00963, "latency_ms": {"8": {"p50": 66.8}},
           "speedup_vs_fastest_float": {"median": 3.14, "ci95": [3.11, 3.17]}, "passed": True,
           "failed": []}
    auto = {"winner": row, "table": [row], "why": ["w"], "gate_batch": 8}
    md = "\n".join(auto_markdown(auto, "cosine_mean", ""))
    assert "| candidate | runtime | cosine mean | drop |" in md
    assert "| dynamic ★ | onnxruntime fp32 | 0.9904 | 0.0096 | 66.80 |" in md
