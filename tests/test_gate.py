"""The gate's decision logic, on hand-made measurements."""
from __future__ import annotations

import json
from types import SimpleNamespace

from pipeline.config import GateConfig, SloConfig
from pipeline import gate
from pipeline.gate import table
from pipeline.task.metric import MetricSpec

SEQ = MetricSpec("sequence_accuracy", True)


def judge(evals, bench, g, metric, slo=None, environment=None, against_given=False):
    """The one gate on an encoder's measures, as the recipes' tail calls it."""
    return gate.judge(gate.measures(evals, bench, g, slo, against_given=against_given), g,
                      metric, slo, environment)


def ev(tmp_path, name, acc, preds):
    path = tmp_path / name
    path.mkdir(parents=True)
    (path / "predictions.json").write_text(json.dumps(preds))
    return SimpleNamespace(path=path, meta={"metrics": {"sequence_accuracy": acc}})


def bench(speedup, aa=1.0, p99=5.0, halfwidth=0.1, p99_b1=None):
    """Timings at batch 8 (the speed gate's) and batch 1 (one request: the SLO's by default)."""
    def at(p):
        return {"speedup_vs_fastest_float": {"median": speedup,
                                             "ci95": [speedup - halfwidth, speedup + halfwidth]},
                "fastest_float": "fp32", "aa_check": {"median": aa, "tolerance": 0.03},
                "latency_ms": {"candidate": {"p99": p}}}
    return SimpleNamespace(meta={"batches": {"8": at(p99), "1": at(p99 if p99_b1 is None else p99_b1)}})


def evals(tmp_path, fp16_acc=98.5, cand_acc=98.3, cand_preds=("A",) * 99 + ("C",)):
    return {"fp16": ev(tmp_path, "a", fp16_acc, ["A"] * 100),
            "candidate": ev(tmp_path, "b", cand_acc, list(cand_preds))}


def failed(v):
    return set(v.failed)


def test_pass_and_each_failure(tmp_path):
    e = evals(tmp_path)
    v = judge(e, bench(1.9), GateConfig(), SEQ, SloConfig())
    assert v.passed, v.summary
    assert "accuracy_drop" in table(v) and "pass" in table(v)
    assert failed(judge(e, bench(0.95), GateConfig(), SEQ)) == {"speedup_ci_low"}
    # A median above 1 whose interval reaches below it is not proof of a speedup.
    assert failed(judge(e, bench(1.05, halfwidth=0.1), GateConfig(), SEQ)) == {"speedup_ci_low"}
    v = judge(e, bench(2.0), GateConfig(max_accuracy_drop=0.1), SEQ)
    assert failed(v) == {"accuracy_drop"} and "drop 0.20" in v.summary
    # An A/A past its tolerance: the speedup is judged with its lower bound divided by it
    assert failed(judge(e, bench(1.1, aa=1.08), GateConfig(), SEQ)) == {"aa_check"}  # 1.0 / 1.08
    v = judge(e, bench(2.0, aa=1.08), GateConfig(), SEQ)  # 1.9 / 1.08 = 1.76: still a speedup
    assert v.passed, v.summary
    assert "1.76x against min_speedup 1.0" in next(c.detail for c in v.checks
                                                   if c.name == "aa_check")
    assert failed(judge(e, bench(2.0, aa=0.93), GateConfig(), SEQ)) == set()  # either direction
    # ... and past AA_BROKEN (10 %) the timing is not trusted at all
    assert failed(judge(e, bench(5.0, aa=1.11), GateConfig(), SEQ)) == {"aa_check"}
    untold = bench(5.0, aa=1.05)  # an A/A record without its tolerance fails closed
    del untold.meta["batches"]["8"]["aa_check"]["tolerance"]
    assert failed(judge(e, untold, GateConfig(), SEQ)) == {"aa_check"}
    assert failed(judge(e, bench(2.0, p99=500), GateConfig(), SEQ,
                        SloConfig(p99_ms=100))) == {"slo_p99_ms"}
    low_agreement = judge(evals(tmp_path / "x", cand_preds=["B"] * 10 + ["A"] * 90), bench(2.0),
                          GateConfig(), SEQ)
    assert failed(low_agreement) == {"output_agreement"}


def test_slo_judges_one_request_not_the_speed_gates_batch(tmp_path):
    """slo.p99_ms is a request's latency: judged at slo.batch_size (1), where a large encoder
    answers in 60 ms, although its batch of 8 (the speed gate's) takes 1.3 s."""
    e = evals(tmp_path)
    slow_batch = bench(2.0, p99=1300.0, p99_b1=60.0)
    v = judge(e, slow_batch, GateConfig(), SEQ, SloConfig())
    assert v.passed, v.summary
    slo = next(c for c in v.checks if c.name == "slo_p99_ms")
    assert slo.value == 60.0 and "at batch 1" in slo.detail
    # A service that answers requests in batches of 8 says so, and is judged there.
    assert failed(judge(e, slow_batch, GateConfig(), SEQ, SloConfig(batch_size=8))) == {"slo_p99_ms"}
    assert failed(judge(e, bench(2.0, p99=5.0, p99_b1=300.0), GateConfig(), SEQ,
                        SloConfig())) == {"slo_p99_ms"}
    # The SLO's batch was not timed: fails closed, naming the knob.
    only8 = bench(2.0, p99=5.0)
    del only8.meta["batches"]["1"]
    v = judge(e, only8, GateConfig(), SEQ, SloConfig())
    assert failed(v) == {"slo_p99_ms"} and "bench.batch_sizes" in v.summary


def test_fails_closed_on_missing_measurements(tmp_path):
    e = evals(tmp_path, cand_acc=float("nan"))
    assert "accuracy_drop" in failed(judge(e, bench(2.0), GateConfig(), SEQ))
    broken_bench = SimpleNamespace(meta={"batches": {}})
    v = judge(evals(tmp_path / "y"), broken_bench, GateConfig(), SEQ)
    assert {"speedup_ci_low", "aa_check"} <= failed(v) and "fails closed" in v.summary


def test_shape_outliers_flag_only_the_jump():
    from pipeline.measure.latency import shape_outliers

    rows = [{"size": w, "p50": 1.0 + 0.01 * w} for w in (100, 150, 200, 250, 300)]
    assert shape_outliers({"m": rows}) == []
    rows[2]["p50"] = 10.0  # a slow kernel at width 200
    flagged = shape_outliers({"m": rows})
    assert [f["size"] for f in flagged] == [200]


def test_timings_from_another_environment_are_refused(tmp_path):
    from pipeline.config import HardwareConfig
    from pipeline.core.env import environment

    here = environment(HardwareConfig().target())
    b = bench(2.0)
    b.meta["environment"] = here
    assert "same_environment" not in failed(judge(evals(tmp_path), b, GateConfig(),
                                                  SEQ, environment=here))
    elsewhere = {**here, "cpu": {**here["cpu"], "model": "Some Other CPU"}}
    b.meta["environment"] = elsewhere
    v = judge(evals(tmp_path / "z"), b, GateConfig(), SEQ, environment=here)
    assert failed(v) == {"same_environment"} and "Some Other CPU" in v.summary


def test_speed_is_judged_in_the_core_state_the_candidate_fared_worst_in(tmp_path):
    b = bench(2.5, halfwidth=0.05)
    b.meta["batches"]["8"]["core_state"] = {"changed": True, "worst": {
        "round_trip_ns": 510.0, "speedup_vs_fastest_float": {"median": 0.98, "ci95": [0.96, 1.0]}}}
    v = judge(evals(tmp_path), b, GateConfig(), SEQ)
    check = next(c for c in v.checks if c.name == "speedup_ci_low")
    assert not check.passed and "510 ns" in check.detail


def test_a_benchmark_with_impossible_numbers_fails_closed(tmp_path):
    """A CI whose bounds are out of order (the forged "150.00-0.97"), a median outside its CI,
    NaN, negative or out-of-order latencies: a corrupt entry, whatever the limits say."""
    e = evals(tmp_path)
    cases = {"bounds out of order": lambda at: at.update(speedup_vs_fastest_float={
                 "median": 150.0, "ci95": [150.0, 0.97]}),
             "outside its CI": lambda at: at.update(speedup_vs_fastest_float={
                 "median": 150.0, "ci95": [1.0, 1.1]}),
             "not two positive": lambda at: at["aa_check"].update(ci95=[float("nan"), 1.0]),
             "is not a positive": lambda at: at["latency_ms"]["candidate"].update(p99=-5.0),
             "out of order (p50": lambda at: at["latency_ms"]["candidate"].update(p50=9.0)}
    for said, edit in cases.items():
        b = bench(2.0)
        edit(b.meta["batches"]["8"])
        v = judge(e, b, GateConfig(min_speedup=100), SEQ, SloConfig(p99_ms=1000))
        assert not v.passed and {"benchmark_sane", "speedup_ci_low"} <= failed(v), said
        detail = next(c.detail for c in v.checks if c.name == "benchmark_sane")
        assert detail.startswith("benchmark entry is corrupt: ") and said in detail, detail
        assert "\n" not in detail
    assert "benchmark_sane" not in {c.name for c in judge(e, bench(2.0), GateConfig(), SEQ).checks}


def given(median, halfwidth=0.02, aa=1.0, tolerance=0.03):
    """quant=none's timing: the candidate (the optimized FP32 model) against the export."""
    b = bench(1.0, aa=aa, halfwidth=0.05)  # the candidate IS the fastest float: a coin flip at 1
    for at in b.meta["batches"].values():
        at["speedup"] = {"export": {"median": median, "ci95": [median - halfwidth, median + halfwidth]},
                         "fp32": {"median": 1.0, "ci95": [0.95, 1.05]}}
        at["aa_check"]["tolerance"] = tolerance
    return b


def test_quant_none_is_judged_against_the_file_as_given_not_against_itself(tmp_path):
    """The optimized FP32 model would be timed against itself by speedup_ci_low (its lower bound
    below 1 about every time); quant=none asks that it be no slower than the export instead."""
    e = evals(tmp_path)
    assert failed(judge(e, given(1.0), GateConfig(), SEQ)) == {"speedup_ci_low"}  # today's rule
    for median in (1.0, 0.98, 1.4):  # as fast, within the A/A tolerance, or faster: ships
        v = judge(e, given(median), GateConfig(), SEQ, against_given=True)
        assert v.passed, v.summary
        check = next(c for c in v.checks if c.name == "no_slower_than_given")
        assert "no slower than the file as given" in check.detail and check.limit == 0.97
        assert "speedup_ci_low" not in {c.name for c in v.checks}
    assert failed(judge(e, given(0.9), GateConfig(), SEQ, against_given=True)) == {
        "no_slower_than_given"}  # whole interval below 1 - tolerance: the optimizer made it slower
    assert failed(judge(e, given(1.0), GateConfig(min_speedup=2.0), SEQ,
                        against_given=True)) == set()  # min_speedup does not apply
    # an A/A past its tolerance moves the bound against the candidate, as for a speedup
    assert failed(judge(e, given(0.99, aa=1.05), GateConfig(), SEQ, against_given=True)) == {
        "aa_check"}  # 1.01 / 1.05 = 0.96 < 0.97
    assert failed(judge(e, given(1.2, aa=1.05), GateConfig(), SEQ, against_given=True)) == set()
    missing = given(1.0)
    del missing.meta["batches"]["8"]["speedup"]["export"]  # the export was not timed: fails closed
    v = judge(e, missing, GateConfig(), SEQ, against_given=True)
    assert failed(v) == {"no_slower_than_given"} and "fails closed" in v.summary
