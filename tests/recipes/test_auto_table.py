"""quant=auto's table: typed rows, the choice, and the JSON the report renders."""
from __future__ import annotations

from pipeline.measure.results import Role, Speedup
from pipeline.recipes.auto_table import BatchLatency, Row, choose


def _row(name, role, p50, failed=(), sp=1.5, drop=0.1):
    return Row(name, role, "onnxruntime fp32", f"{name}", "onnxruntime", "fp32", not failed,
               list(failed), [], {"8": BatchLatency(p50, p50 * 2)},
               Speedup(sp, sp - .1, sp + .1),
               "fp32", "sequence_accuracy", 99.0, drop, 0.99, "ab", p50)


def test_the_fastest_passing_row_wins_else_the_fastest_accurate_else_the_most_accurate():
    fast_fail = _row("int8", Role.candidate, 1.0, ["speedup_ci_low"])
    slow_pass = _row("fp32", Role.fp32, 3.0)
    assert choose([fast_fail, slow_pass]) is slow_pass
    inaccurate = _row("mixed", Role.mixed, 0.5, ["accuracy_drop"], drop=2.0)
    assert choose([inaccurate, fast_fail]) is fast_fail  # fails speed only: accurate
    worse = _row("dynamic", Role.dynamic, 0.4, ["accuracy_drop"], drop=3.0)
    assert choose([inaccurate, worse]) is inaccurate  # none accurate: the smallest drop
    untimed = Row("int8", Role.candidate, "openvino fp32", "x", "openvino", "fp32", False,
                  ["accuracy_drop"], ["not timed"], timed=False)
    assert choose([untimed, slow_pass]) is slow_pass


def test_rows_keep_the_json_shape_the_report_renders():
    from pipeline.report.auto import markdown

    win = _row("fp32", Role.fp32, 3.0)
    rows = [win.to_json(), _row("int8", Role.candidate, 1.0, ["speedup_ci_low"]).to_json()]
    assert rows[0]["role"] == "fp32" and rows[0]["sequence_accuracy"] == 99.0
    assert rows[0]["speedup_vs_fastest_float"] == {"median": 1.5, "ci95": [1.4, 1.6]}
    assert "timed" not in rows[0]
    auto = {"winner": rows[0], "table": rows, "why": ["because"], "gate_batch": 8}
    md = "\n".join(markdown(auto, "sequence_accuracy"))
    assert "**Winner: fp32 on onnxruntime fp32.**" in md and "fail: speedup_ci_low" in md


def test_a_row_reads_the_benchmark_from_its_own_seat():
    from pipeline.config import GateConfig
    from pipeline.gate.verdict import Check, Verdict
    from pipeline.measure.results import BenchResult, Timing
    from pipeline.recipes.auto import _row as row_of
    from pipeline.runtimes import Target
    from pipeline.task.metric import MetricSpec

    seat = BenchResult({8: Timing(Speedup(2.0, 1.8, 2.2), "fp32", p50_ms=2.0, p99_ms=3.0,
                                  label="int8", overall=Speedup(2.0, 1.8, 2.2)),
                        1: Timing(None, "fp32", p50_ms=9.0, p99_ms=9.5, label="other")}, None)
    verdict = Verdict([Check("speedup_ci_low", 1.8, 1.0, True, "ok")])
    r = row_of("int8", Role.candidate, Target("onnxruntime", "fp32"), "int8", None, None, seat,
               verdict, MetricSpec("sequence_accuracy", True), GateConfig(speedup_batch_size=8))
    assert r.latency_ms == {"8": BatchLatency(2.0, 3.0)} and r.p50 == 2.0  # batch 1: not its
    assert r.speedup_vs_fastest_float == Speedup(2.0, 1.8, 2.2) and r.passed
    assert r.to_json()["latency_ms"] == {"8": {"p50": 2.0, "p99": 3.0}}
