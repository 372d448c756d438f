"""report.md's tables read as a person reads numbers: units in the cells, the candidate's speedup
with its interval, each gate check's value and limit in the unit of what it checks; the typed
body (``pipeline.report.body``) renders its sections in order and writes the keys every run
wrote."""
from __future__ import annotations

import dataclasses
import json

from pipeline.core.json_record import from_json, to_json
from pipeline.gate.verdict import Check, Verdict
from pipeline.measure.bench_record import LoadRecord, Ratio
from pipeline.measure.results import Role
from pipeline.report.body import (Environment, InterruptedReport, Interruption, LatencyCell,
                                  MetricSpec, NotJudged, Publication, Row, RunEnd, RunReport,
                                  StageRow, TimingReport, as_json)
from pipeline.report.run import markdown

ENV = {"cpu": {"model": "x", "logical_cores": 2, "flags": ["avx2"], "machine": "x86_64"},
       "provider": "CPUExecutionProvider", "threads": {"intra_op": 2}, "tools": {"onnx": "1"},
       "affinity": [0, 1]}


def _report(**changes) -> RunReport:
    lat = LatencyCell(3.3249, 13.79, None, None, 1.31, (1.495, 1.59))
    metrics = {"sequence_accuracy": 99.5, "cosine_mean": 0.99984}
    row = Row(Role.candidate, "quantize (int8, candidate)", "cd" * 32, 1.5512, 1074, 0.9995,
              "ef" * 32, {"8": lat}, metrics)
    fp32 = Row(Role.fp32, "optimize (FP32 baseline)", "ab" * 32, 6.06, 1074, 1.0, "ef" * 32,
               {"8": LatencyCell(3.3249, 13.79, None, None, 1.0)}, metrics)
    checks = [("accuracy_drop", 0.04999999999999716, 0.3), ("cosine_mean_drop", 0.00012, 0.01),
              ("output_agreement", 0.9995, 0.95), ("speedup_ci_low", 1.495, 1.0),
              ("aa_check", 0.025, 0.03), ("slo_p99_ms", 124.974, 200.0),
              ("a_check_added_later", 0.123456, 1)]
    load_test = {"slo_p99_ms": 200, "mode": "load", "models": {"candidate": {"dynamic": {
        "max_qps_within_slo": 325.68, "throughput_at_max": 320.1,
        "steps": [{"achieved_qps": 1.0, "p99_ms": 2.0}, {"achieved_qps": 2.0, "p99_ms": 3.0}]}}}}
    report = RunReport(
        model="ocr", quant="int8", config={}, environment=from_json(Environment, ENV),
        metrics=(MetricSpec("sequence_accuracy", "%", True, True, "labels"),
                 MetricSpec("cosine_mean", "", True, False, "labels")),
        verdict=Verdict([Check(c, v, lim, True, "d") for c, v, lim in checks]),
        rows=(fp32, row), aa_check={"8": Ratio(1.0251, (1.01, 1.04), {"ok": True})},
        timing=TimingReport({}, {}, None), bill={}, runtimes=None,
        stages=(StageRow("export", False, 12.345, "ab" * 32, {"stage": "export"}),),
        lineage={}, load=from_json(LoadRecord, load_test))
    return dataclasses.replace(report, **changes)


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


def _runtimes(metric: str, value: float, drop: float):
    from pipeline.runtimes.record import Cell, Choice, Deployed, RuntimePlan, TargetRow

    row = TargetRow(target="onnxruntime fp32", runtime="onnxruntime", precision="fp32",
                    label="candidate", accuracy_drop=drop, agreement_with_fp16=100.0, p50=14.09,
                    p99=19.87, passes_accuracy=True, metrics={metric: value})
    return RuntimePlan(mode="fixed", targets=("onnxruntime fp32",),
                       cells={"candidate": {"onnxruntime fp32": Cell(
                           latency_ms={"1": {"p50": 14.09}}, metrics={metric: value})}},
                       choice={"1": Choice.of(row, [row])},
                       deployed=Deployed("onnxruntime", "fp32", performance_hint="latency",
                                         intra_op_threads=2))


def test_the_runtimes_record_is_written_with_each_metric_under_its_name_and_reads_back():
    """report.json's ``runtimes``: a row's and a cell's metrics sit under their own names beside
    the record's fields (as reports always had them), the manifest's pick carries no list of
    the others, and the JSON reads back into equal records."""
    import json

    from pipeline.core.json_record import to_json
    from pipeline.runtimes.record import RuntimePlan

    plan = _runtimes("cosine_mean", 0.99, 0.01)
    data = json.loads(json.dumps(to_json(plan)))
    pick = data["choice"]["1"]
    assert pick["cosine_mean"] == 0.99 and "metrics" not in pick
    assert [c["target"] for c in pick["considered"]] == ["onnxruntime fp32"]
    assert data["cells"]["candidate"]["onnxruntime fp32"] == {
        "cosine_mean": 0.99, "latency_ms": {"1": {"p50": 14.09}}}  # no null keys
    back = RuntimePlan.of(data)
    assert back == plan and back.choice["1"].accuracy("cosine_mean") == 0.99
    assert "considered" not in to_json(back.choice["1"].picked())


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
           "failed_detail": [], "cosine_mean": 0.99037, "accuracy_drop": 0.00963,
           "agreement_with_fp16": 0.9762, "latency_ms": {"8": {"p50": 66.8}},
           "speedup_vs_fastest_float": {"median": 3.14, "ci95": [3.11, 3.17]}, "passed": True,
           "failed": []}
    auto = {"winner": row, "table": [row], "why": ["w"], "gate_batch": 8}
    md = "\n".join(auto_markdown(auto, "cosine_mean", ""))
    assert "| candidate | runtime | cosine mean | drop | agree fp16 |" in md
    # output agreement, which the gate judges beside the metric, as a percentage
    assert "| dynamic ★ | onnxruntime fp32 | 0.9904 | 0.0096 | 97.62 % | 66.80 |" in md


def test_the_report_reads_top_to_bottom_in_its_sections_order():
    """The title, the gate's line, the step table, then each section in reading order."""
    md = markdown(_report(), RunEnd(figures={"latency_cdf.png": "ok", "x.png": "failed: E"}))
    lines = md.splitlines()
    assert lines[:3] == ["# ocr — quant=int8", "", "**Gate: PASS**"]
    assert lines[4].startswith("| step | size | nodes | sequence_accuracy % | cosine_mean | "
                               "agree fp16 | p50 / p99 b8 | speedup b8 |")
    heads = [ln for ln in lines if ln.startswith("## ")]
    assert heads == ["## Gate", "## Timing", "## Load test (open-loop Poisson, p99 target 200 "
                     "ms)", "## Stages", "## Environment"]
    assert md.index("![latency_cdf.png](latency_cdf.png)") < md.index("x.png: failed: E") \
        < md.index("## Stages")
    assert "- Provider: CPUExecutionProvider, threads {'intra_op': 2}" in md
    assert "Published" not in md and "Publishing" not in md


def test_publishing_shows_in_the_report_as_it_goes():
    pending = RunEnd(publish=Publication("pending", backend="local"))
    assert "Publishing to the local registry (this report is updated" in markdown(_report(), pending)
    failed = RunEnd(publish=Publication("failed", backend="local", error="disk full"))
    assert "**Publishing failed** (the gate passed; nothing was published): disk full" in \
        markdown(_report(), failed)
    done = RunEnd(published="ocr:int8-x@sha256:y", publish=Publication("published", "local"))
    assert markdown(_report(), done).endswith("Published to `ocr:int8-x@sha256:y`.\n")
    stopped = RunEnd("interrupted", publish=Publication("interrupted", "local"),
                     interrupted=Interruption("SIGTERM", "while publishing", 143))
    assert "**Interrupted while publishing (SIGTERM): nothing was published. The gate's" in \
        markdown(_report(), stopped)


def test_report_json_keeps_the_keys_every_run_wrote():
    """One converter writes the body: the fields are the keys, a row's metrics sit beside its
    fields, the candidate's interval only where there is one, the verdict as the gate writes it,
    and what the environment and stages held beyond the fields the report reads."""
    data = json.loads(json.dumps(as_json(_report(), RunEnd()), sort_keys=True))
    fp32, cand = data["rows"]
    assert cand["sequence_accuracy"] == 99.5 and cand["role"] == "candidate"
    assert cand["latency"]["8"]["speedup_ci95"] == [1.495, 1.59]
    assert "speedup_ci95" not in fp32["latency"]["8"] and fp32["latency"]["8"]["p999"] is None
    assert data["environment"] == ENV
    assert data["stages"] == [{"label": "export", "reused": False, "seconds": 12.345,
                               "digest": "ab" * 32, "stage": "export"}]
    assert data["aa_check"] == {"8": {"median": 1.0251, "ci95": [1.01, 1.04], "ok": True}}
    assert data["verdict"]["summary"] == "PASS" and data["verdict"]["reference"] == "FP16"
    assert data["status"] == "complete" and data["figures"] == {}
    assert not {"publish", "published", "interrupted", "fusion", "auto", "serving"} & set(data)
    assert data["load"]["mode"] == "load" and len(data["load"]["models"]["candidate"][
        "dynamic"]["steps"]) == 2


def test_a_run_stopped_in_a_stage_says_how_far_it_got():
    stopped = InterruptedReport("ocr", "int8", {}, (StageRow("export", True, 1.0, "ab" * 32),),
                                NotJudged("not judged: interrupted after stage export (SIGINT)"))
    md = markdown(stopped)
    assert md.startswith("# ocr — quant=int8\n\n**Gate: not judged: interrupted after stage "
                         "export (SIGINT)**\n")
    assert "the same command resumes from there" in md and "| export | reused |" in md
    assert to_json(stopped.verdict) == {"passed": False, "checks": [],
                                     "summary": "not judged: interrupted after stage export "
                                                "(SIGINT)"}
