"""Gates in each metric's own units, output agreement for continuous outputs, the refusals and
warnings for metrics that cannot see a damaged model, and the user's name for their model.

Unit level on hand-made evaluations and tiny ``onnx.helper`` graphs, plus one re-run of the
tiny pipeline from its cache under another model name (every stage reused, then published).
"""
from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from pipeline.config import GateConfig
from pipeline.core.errors import ConfigError
from pipeline import gate
from pipeline.metrics import SPECS
from pipeline.task.contract import MetricsSpec
from tests.conftest import run_cli

EMBED = MetricsSpec(tuple(SPECS[n] for n in ("cosine_mean", "cosine_p1", "max_abs_diff",
                                             "mean_abs_diff")), "cosine_mean")
OCR = MetricsSpec((SPECS["sequence_accuracy"], SPECS["cer"]), "sequence_accuracy")


def judge(evals, bench, g, metric, slo=None, environment=None, against_given=False):
    """The one gate on an encoder's measures, as the recipes' tail calls it."""
    return gate.judge(gate.measures(evals, bench, g, slo, against_given=against_given), g,
                      metric, slo, environment)


def evaluation(path, metrics: dict, predictions: list):
    path.mkdir(parents=True)
    (path / "predictions.json").write_text(json.dumps(predictions))
    return SimpleNamespace(path=path, meta={"metrics": metrics})


def vectors(n: int = 100, dim: int = 16, seed: int = 0) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=(n, dim))
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def rows(v: np.ndarray) -> list:
    return [{"decision": None, "output": r.tolist()} for r in v]


def fast_bench():
    return SimpleNamespace(meta={"batches": {"8": {
        "speedup_vs_fastest_float": {"median": 2.0, "ci95": [1.9, 2.1]}, "fastest_float": "fp32",
        "aa_check": {"median": 1.0, "tolerance": 0.03}, "latency_ms": {"candidate": {"p99": 1}}}}})


def failed(v) -> set:
    return set(v.failed)


def embed_evals(tmp_path, cand_metrics: dict, cand_rows: np.ndarray):
    ref = vectors()
    return {"fp16": evaluation(tmp_path / "fp16", {"cosine_mean": 1.0, "cosine_p1": 1.0,
                                                   "max_abs_diff": 0.0, "mean_abs_diff": 0.0},
                               rows(ref)),
            "candidate": evaluation(tmp_path / "cand", cand_metrics, rows(cand_rows))}


def test_a_cosine_is_gated_in_its_own_units_with_its_first_percentile(tmp_path):
    """The default gate let a candidate at mean cosine 0.82 through (0.18 <= 0.3 "points");
    now the mean cosine may lose 0.01 and its 1st percentile 0.03."""
    near = vectors() + 0.01 * vectors(seed=1)  # every row about 1 % off: cosine ~0.99995
    damaged = judge(embed_evals(tmp_path / "a", {"cosine_mean": 0.82, "cosine_p1": 0.6,
                                                 "max_abs_diff": 0.9, "mean_abs_diff": 0.2},
                                near), fast_bench(), GateConfig(), EMBED)
    assert {"accuracy_drop", "cosine_p1_drop"} <= failed(damaged)
    check = damaged.checks[0]
    assert check.limit == 0.01 and "cosine_mean 0.8200 vs FP16 1.0000: drop 0.1800 cosine" \
        in check.detail
    # a good mean hides a few ruined rows: the 1st percentile catches them
    tail = judge(embed_evals(tmp_path / "b", {"cosine_mean": 0.995, "cosine_p1": 0.95,
                                              "max_abs_diff": 0.3, "mean_abs_diff": 0.01},
                             near), fast_bench(), GateConfig(), EMBED)
    assert failed(tail) == {"cosine_p1_drop"}
    good = judge(embed_evals(tmp_path / "c", {"cosine_mean": 0.995, "cosine_p1": 0.98,
                                              "max_abs_diff": 0.1, "mean_abs_diff": 0.01},
                             near), fast_bench(), GateConfig(), EMBED)
    assert good.passed, good.summary
    # per-metric overrides, each in its own units; a scalar is still the primary's limit
    assert failed(judge(embed_evals(tmp_path / "d", {"cosine_mean": 0.995, "cosine_p1": 0.98,
                                                     "max_abs_diff": 0.1, "mean_abs_diff": 0.01},
                                    near), fast_bench(),
                        GateConfig(max_accuracy_drop={"cosine_p1": 0.01, "max_abs_diff": 0.05}),
                        EMBED)) == {"cosine_p1_drop", "max_abs_diff_drop"}


def test_accuracies_keep_their_points_and_limits_resolve_per_metric():
    from pipeline.metrics.limits import limits

    assert limits(None, OCR) == {"sequence_accuracy": 0.3}  # the OCR gate as it always was
    assert limits(0.5, OCR) == {"sequence_accuracy": 0.5}   # a scalar: the primary's
    assert limits({"cer": 0.2}, OCR) == {"sequence_accuracy": 0.3, "cer": 0.2}
    assert limits(None, EMBED) == {"cosine_mean": 0.01, "cosine_p1": 0.03}
    assert limits(0.02, EMBED) == {"cosine_mean": 0.02, "cosine_p1": 0.03}
    assert limits(None, MetricsSpec((SPECS["spearman"],), "spearman")) == {"spearman": 0.01}
    with pytest.raises(ConfigError, match="a limit for cer, which this model does not report"):
        limits({"cer": 1}, EMBED)
    diff = MetricsSpec((SPECS["max_abs_diff"],), "max_abs_diff")
    with pytest.raises(ConfigError, match="max_abs_diff has no default limit"):
        limits(None, diff)
    assert limits(0.05, diff) == {"max_abs_diff": 0.05}


def test_limits_for_metrics_that_do_not_exist_are_refused_when_composing():
    from pipeline.engine.compose import compose

    with pytest.raises(ConfigError) as e:
        compose(["gate.max_accuracy_drop={cosin_mean: 0.01}"])
    assert "no metric is named 'cosin_mean'" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=r"gate.max_accuracy_drop.cer=-1: must be in \[0, 100\]"):
        compose(["gate.max_accuracy_drop={cer: -1}"])
    cfg = compose(["gate.max_accuracy_drop={cer: 0.5, top3: 1}"])
    assert cfg.gate.max_accuracy_drop == {"cer": 0.5, "top3": 1}
    assert compose([]).gate.max_accuracy_drop is None


def test_continuous_outputs_agree_within_a_tolerance(tmp_path):
    """Embeddings compared exactly read 0 % agreement whatever the candidate; within the
    relative tolerance a near copy agrees and a damaged row does not. One value per row: a
    cosine would see only its sign, the relative error sees the value."""
    from pipeline.metrics.outputs import Rule, agreement

    ref = vectors()
    near = ref + 0.01 * vectors(seed=1)
    damaged = near.copy()
    damaged[:10] = vectors(10, seed=2)  # ten rows replaced by unrelated vectors
    a = evaluation(tmp_path / "ref", {}, rows(ref))
    assert agreement(evaluation(tmp_path / "near", {}, rows(near)), a) == 1.0
    assert agreement(evaluation(tmp_path / "dmg", {}, rows(damaged)), a) == pytest.approx(0.9)
    one = evaluation(tmp_path / "one", {}, rows(np.array([[2.0], [2.0], [2.0], [0.0]])))
    other = evaluation(tmp_path / "two", {}, rows(np.array([[2.1], [3.0], [-2.0], [0.0]])))
    assert agreement(other, one) == pytest.approx(0.5)  # 2.1 and 0.0 agree; 3.0 and -2.0 not
    assert agreement(other, one, Rule(rtol=0.6)) == pytest.approx(0.75)
    v = judge(embed_evals(tmp_path / "g", {"cosine_mean": 0.9999, "cosine_p1": 0.999,
                                           "max_abs_diff": 0.01, "mean_abs_diff": 0.001},
                          near), fast_bench(), GateConfig(), EMBED)
    agree = next(c for c in v.checks if c.name == "output_agreement")
    assert agree.passed and agree.value == 1.0 and "within 0.25 relative" in agree.detail


def _onnx(path, out_shape, in_shape=("batch", 4), k=None):
    """y = x @ W: input [batch, ..., 4] float, output of ``out_shape``."""
    import onnx
    from onnx import TensorProto, helper

    k = k or int(out_shape[-1])
    w = helper.make_tensor("W", TensorProto.FLOAT, [in_shape[-1], k],
                           np.linspace(-1, 1, in_shape[-1] * k).tolist())
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(in_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(out_shape))], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def _task(tmp_path, model, data_rows, metric: str, **metric_kw):
    from pipeline.config import ModelConfig
    from pipeline.config.data import DataConfig
    from pipeline.config.metrics import MetricConfig
    from pipeline.models import task
    from pipeline.models.sources import task_key

    data = tmp_path / f"{model.stem}.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in data_rows))
    return task(task_key(ModelConfig(source="onnx", name="", path=str(model)),
                         DataConfig(format="jsonl", path=str(data), input_column="x",
                                    calibration_samples=4, evaluation_samples=8),
                         MetricConfig(name=metric, **metric_kw), str(tmp_path / "data")))


def test_metrics_that_cannot_see_a_damaged_model_are_refused_or_warned(tmp_path):
    from pipeline.metrics.limits import limits

    data = [{"x": [float(i), 1.0, -1.0, 0.5], "label": i % 2} for i in range(12)]
    one = _onnx(tmp_path / "score.onnx", ("batch", 1))
    # one class: the argmax never changes, so top-1 and agreement pass anything
    with pytest.raises(ConfigError, match=r"has one class \(\[batch, 1\]\)") as e:
        _task(tmp_path, one, data, "classification")
    assert "\n" not in str(e.value)
    # label-free, one value per sample: judged by its difference, whose limit is the user's
    t = _task(tmp_path, one, data, "agreement")
    assert t.metrics.primary == "max_abs_diff" and "cosine_mean" not in t.metrics.names
    assert len(t.warnings) == 1 and "only checks its sign" in t.warnings[0]
    with pytest.raises(ConfigError, match="max_abs_diff has no default limit"):
        limits(None, t.metrics)
    assert limits(0.05, t.metrics) == {"max_abs_diff": 0.05}
    wide = _task(tmp_path, _onnx(tmp_path / "emb.onnx", ("batch", 8)), data, "agreement")
    assert wide.metrics.primary == "argmax_agreement" and wide.warnings == []
    # CTC: labels the character set cannot spell are named, not accepted silently
    charset = tmp_path / "chars.txt"
    charset.write_text("AB\n")
    ctc_rows = [{"x": [[0.1, 0.2, 0.3, 0.4]] * 5, "label": t} for t in
                ["AB", "BA", "ABZ", "A", "B", "AAB", "Bé", "AB", "BB", "A", "AB", "B"]]
    ctc = _task(tmp_path, _onnx(tmp_path / "ctc.onnx", ("batch", "time", 3),
                                in_shape=("batch", "time", 4)), ctc_rows, "ctc",
                charset=str(charset))
    assert len(ctc.warnings) == 1, ctc.warnings
    assert "2 of 12 labels" in ctc.warnings[0] and "'Zé'" in ctc.warnings[0]
    clean = [dict(r, label="AB") for r in ctc_rows]
    assert _task(tmp_path, _onnx(tmp_path / "ctc2.onnx", ("batch", "time", 3),
                                           in_shape=("batch", "time", 4)),
                 clean, "ctc", charset=str(charset)).warnings == []


def test_a_one_value_output_needs_a_limit_in_its_own_units_before_any_stage(tmp_path):
    """The command line: one line, exit 2, nothing written; it says what is judged and why."""
    from tests.conftest import one_line

    model = _onnx(tmp_path / "score.onnx", ("batch", 1))
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"x": [float(i), 1.0, 2.0, 3.0]}) + "\n"
                                              for i in range(12)))
    work = tmp_path / "w"
    proc = run_cli("model=onnx", f"model.path={model}", "data=jsonl",
                   f"data.path={tmp_path / 'd.jsonl'}", "data.input_column=x",
                   "data.calibration_samples=4", "data.evaluation_samples=8", "metric=agreement",
                   f"workdir={work}", f"data_dir={work / 'data'}")
    one_line(proc, 2, "max_abs_diff has no default limit", "only checks its sign")
    assert not (work / "cache").exists() and not (work / "runs").exists()


# -- the user's name for their model ------------------------------------------------------------

@pytest.mark.slow  # seconds: out of make test-fast's edit loop
def test_model_name_defaults_to_the_file_and_the_loader_is_model_source(tmp_path):
    from pipeline.engine.compose import compose
    from pipeline.models.sources import Source, task_key

    model = _onnx(tmp_path / "My Net_v2.onnx", ("batch", 3))
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"x": [1.0, 2.0, 3.0, 4.0]}) + "\n"
                                              for _ in range(6)))
    user = ["model=onnx", f"model.path={model}", "data=jsonl", f"data.path={tmp_path / 'd.jsonl'}",
            "data.input_column=x", "metric=agreement"]
    cfg = compose(user)
    assert (cfg.model.source, cfg.model.name) == ("onnx", "my-net_v2")
    mine = compose([*user, "model.name=mine"])
    assert (mine.model.source, mine.model.name) == ("onnx", "mine")
    key = task_key(mine.model, mine.data, mine.metric, str(tmp_path / "data"))
    assert isinstance(key, Source) and key == task_key(cfg.model, cfg.data, cfg.metric,
                                                       str(tmp_path / "data"))
    # built-in models keep their options and names; a name no longer picks the loader
    assert [(c.model.source, c.model.name) for c in (compose(["model=ocr"]),
                                                     compose(["model=ocr_tiny"]))] == \
        [("ocr", "ocr"), ("ocr", "ocr")]
    renamed = compose(["model=ocr", "model.name=mine"]).model
    assert task_key(renamed) == "ocr" and renamed.name == "mine"
    folder = tmp_path / "All-MiniLM-L6"
    folder.mkdir()
    assert compose(["model=hf", f"model.path={folder}/", "data=jsonl",
                    f"data.path={tmp_path / 'd.jsonl'}", "metric=agreement"]).model.name == \
        "all-minilm-l6"
    with pytest.raises(ConfigError, match="model.name 'Mine/x': path separators"):
        compose(["model=ocr", "model.name=Mine/x"])


def test_a_renamed_model_reuses_every_stage_and_publishes_under_its_name(tiny_run, tmp_path):
    from tests.faults import copy_of_tiny_run

    proc = run_cli(*copy_of_tiny_run(tiny_run, tmp_path / "w"), "model.name=mine")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rep = json.loads((tmp_path / "w" / "runs" / "latest" / "report.json").read_text())
    assert all(s["reused"] for s in rep["stages"])  # a name is no part of any stage key
    assert rep["model"] == "mine" and rep["published"].startswith("mine:int8-")


def test_the_fp32_fallback_is_published_as_fp32():
    """When INT8 cannot pay and the FP32 model is the candidate, its version says so."""
    from pipeline.report.manifest import version_mode
    from pipeline.runtimes.record import Deployed, RuntimePlan

    cfg = SimpleNamespace(quant=SimpleNamespace(mode=SimpleNamespace(value="int8")))

    def out(candidate):
        return SimpleNamespace(auto=None, quant=SimpleNamespace(versus_fp32={
            "candidate": candidate, "slower_at_batch": ["8"] if candidate == "fp32" else []}),
            runtimes=RuntimePlan("fixed", Deployed("onnxruntime", "fp32")))

    assert version_mode(cfg, out("fp32")) == "fp32"
    assert version_mode(cfg, out("int8")) == "int8"
    plain = SimpleNamespace(auto=None, quant=None,
                            runtimes=RuntimePlan("fixed", Deployed("openvino", "bf16")))
    assert version_mode(cfg, plain) == "int8.openvino-bf16"


def test_static_int8_that_misses_accuracy_names_what_can_hold_it():
    """A static INT8 verdict failing an accuracy check says how to get there: dynamic INT8 where
    the model's dynamic op types include the matrix products, else the mixed search; never
    for a speed failure, nor for other quant modes."""
    from pipeline.config import QuantMode
    from pipeline.recipes.auto import accuracy_hint

    from pipeline.gate.verdict import Check, Verdict

    def verdict(*failed):
        return Verdict([Check(c, None, None, c not in failed, c) for c in
                        ("accuracy_drop", "cosine_p1_drop", "speedup_ci_low")])

    v = verdict("cosine_p1_drop")
    accuracy_hint(v, QuantMode.int8, ("MatMul", "Gemm", "Attention"))
    # the user's own command with quant=auto, not a command naming another model (model.source
    # is no model= option: ocr_tiny's is ocr, a factory's is torch without its model.factory)
    assert "quant=dynamic" in v.as_dict()["hint"] and "same command with `quant=auto`" in \
        v.summary and "model=" not in v.summary
    v = verdict("accuracy_drop")
    accuracy_hint(v, QuantMode.int8, ("LSTM", "GRU"))
    assert "quant=mixed" in v.as_dict()["hint"] and "quant=dynamic" not in v.as_dict()["hint"]
    for v, mode in ((verdict("speedup_ci_low"), QuantMode.int8),
                    (verdict("accuracy_drop"), QuantMode.dynamic)):
        accuracy_hint(v, mode, ("MatMul",))
        assert not v.hints and v.summary.startswith("FAIL: ") and "hint" not in v.summary


def test_a_candidate_with_nan_or_inf_outputs_fails_a_check_that_names_them(tmp_path):
    """A kernel that overflowed answers NaN, whose argmax is class 0 and whose cosine with
    anything is 0: the accuracy checks fail or, on a few rows, pass, and neither says why.
    The evaluation counts the samples and the gate names them; none counted, no such check
    (nor for an evaluation recorded before they were counted)."""
    ref, good = vectors(), {"cosine_mean": 0.999, "cosine_p1": 0.99, "max_abs_diff": 0.01,
                            "mean_abs_diff": 0.001}
    evals = embed_evals(tmp_path / "a", good, ref)
    evals["candidate"].meta.update(samples=100, non_finite=3)
    evals["fp16"].meta.update(samples=100, non_finite=0)
    v = judge(evals, fast_bench(), GateConfig(), EMBED)
    assert failed(v) == {"finite_outputs"}
    check = next(c for c in v.checks if c.name == "finite_outputs")
    assert check.value == 3 and "3 of 100 evaluation samples gave NaN or inf outputs (FP16: 0)" \
        in check.detail
    evals["candidate"].meta.update(non_finite=0)
    assert judge(evals, fast_bench(), GateConfig(), EMBED).passed
    del evals["candidate"].meta["non_finite"]
    assert judge(evals, fast_bench(), GateConfig(), EMBED).passed


def test_non_finite_samples_are_counted_on_the_batch_axis():
    from pipeline.metrics.outputs import non_finite_samples

    out = np.zeros((4, 7, 5), dtype=np.float32)
    out[1, 3, 2], out[3, 0, 0] = np.nan, np.inf
    assert non_finite_samples(out, 4) == 2
    assert non_finite_samples(out.transpose(1, 0, 2), 4) == 2  # time-major: batch second
    assert non_finite_samples(np.zeros((4, 5)), 4) == 0
    assert non_finite_samples(np.full((4,), 3, dtype=np.int64), 4) == 0  # class ids
    assert non_finite_samples(np.array([np.nan]), 4) == 4  # no axis of the batch: all of it


def test_int8_that_answers_inf_where_fp32_answers_numbers_fails_the_gate(tmp_path):
    """A user's network whose first channel is a millionth of the others': after the ReLU, per
    tensor INT8 rounds it to zero, and the Reciprocal after the mean answers inf where FP32
    answers 1e5 to 1e6. The argmax is the same (inf is still the largest), so accuracy and
    agreement pass: before the outputs were counted, this model was published."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from PIL import Image

    rng = np.random.default_rng(0)
    w = (rng.normal(size=(4, 3, 3, 3)) * 0.3).astype(np.float32)
    w[0] = np.abs(w[0]) * 1e-6
    b = np.array([1e-6, 1.0, 1.0, 1.0], dtype=np.float32)
    nodes = [helper.make_node("Conv", ["image", "W", "B"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("ReduceMean", ["r"], ["m"], axes=[2, 3], keepdims=0),
             helper.make_node("Reciprocal", ["m"], ["scores"])]
    graph = helper.make_graph(
        nodes, "reciprocal", [helper.make_tensor_value_info("image", TensorProto.FLOAT,
                                                            ["N", 3, 32, 32])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", 4])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "reciprocal.onnx"))
    for i in range(24):
        folder = tmp_path / "images" / "any"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    work = tmp_path / "w"
    proc = run_cli("model=onnx", f"model.path={tmp_path / 'reciprocal.onnx'}", "data=imagefolder",
                   f"data.path={tmp_path / 'images'}", "data.calibration_samples=8",
                   "data.evaluation_samples=16", "metric=agreement", "quant.latency_aware=false",
                   f"workdir={work}", f"data_dir={work / 'data'}", f"registry.root={work / 'r'}",
                   "gate.min_speedup=0", "gate.check_slo_p99=false", "bench.min_rounds=20",
                   "bench.min_seconds=0", "bench.max_seconds=0.3", "bench.size_buckets=1",
                   "bench.cold_start_repeats=0", "bench.aa_tolerance=0.5")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads((work / "runs" / "latest" / "report.json").read_text())
    checks = {c["check"]: c for c in report["verdict"]["checks"]}
    assert checks["accuracy_drop"]["passed"] and checks["output_agreement"]["passed"]
    assert not checks["finite_outputs"]["passed"]
    assert "16 of 16 evaluation samples gave NaN or inf outputs (FP16: 0)" in \
        checks["finite_outputs"]["detail"]
    assert "published:" not in proc.stdout


def test_output_agreement_asks_no_more_than_fp32_itself_keeps(tmp_path):
    """A dense detector's decision (every class it finds on a sample) differs between FP32 and
    FP16 on some samples by one detection at the threshold: there the limit is FP32's own
    agreement (a candidate as close as the float model passes, one further fails), said in the
    detail; where FP32 agrees past gate.min_output_agreement, that limit holds."""
    perfect = {"cosine_mean": 1.0, "cosine_p1": 1.0, "max_abs_diff": 0.0, "mean_abs_diff": 0.0}

    def decided(name, same):  # 100 samples, the first ``same`` decided as FP16 decided them
        return evaluation(tmp_path / name, perfect,
                          [{"decision": str(k) if k < same else "other", "output": [1.0]}
                           for k in range(100)])

    fp16 = decided("fp16", 100)
    for fp32, cand, passed, limit in ((92, 93, True, 0.92), (92, 90, False, 0.92),
                                      (99, 93, False, 0.95), (99, 96, True, 0.95)):
        evals = {"fp16": fp16, "fp32": decided(f"fp32-{fp32}-{cand}", fp32),
                 "candidate": decided(f"cand-{fp32}-{cand}", cand)}
        check = next(c for c in judge(evals, fast_bench(), GateConfig(), EMBED).checks
                     if c.name == "output_agreement")
        assert (check.passed, check.limit) == (passed, pytest.approx(limit)), check
        assert ("the limit is FP32's own agreement with FP16 (92.00%)" in check.detail) == \
            (fp32 == 92), check.detail
    # the one rule every check of agreement asks (the gate, the runtime choice, quant=auto)
    from pipeline.metrics.outputs import agreement_limit, own_agreement

    assert agreement_limit(0.95, 0.92) == 0.92 and agreement_limit(0.95, 0.99) == 0.95
    assert agreement_limit(0.95, None) == agreement_limit(0.95, float("nan")) == 0.95
    assert own_agreement(decided("fp32-92", 92), fp16) == pytest.approx(0.92)
    assert own_agreement(None, fp16) is None
    # FP32 judged (quant=auto's float rows): the cap comes only from an FP32 evaluation given
    # as such (auto gives its baselines'), never from the row itself
    alone = gate.measures({"fp16": fp16, "fp32": decided("fp32-alone", 80)}, fast_bench(),
                          GateConfig(), role=gate.Role.fp32)
    assert alone.float_agreement is None and alone.agreement == pytest.approx(0.8)


def test_a_detectors_agreement_counts_samples_whose_detections_match(tmp_path):
    """Detections compared on each sample within the F1 budget, and the detail says so."""
    from pipeline.metrics import detection

    perfect = {"cosine_mean": 1.0, "cosine_p1": 1.0, "max_abs_diff": 0.0, "mean_abs_diff": 0.0,
               "detection_f1": 100.0, "detections_found": 600}

    def pages(name, lost):  # 4 pages of 150 detections; ``lost`` of them miss their last two
        rows = []
        for k in range(4):
            found = [{"class": 0, "score": 0.9, "box": [5.0 * j, 0.0, 5.0 * j + 4, 4.0]}
                     for j in range(150 - (2 if k < lost else 0))]
            rows.append({"decision": detection.decision(found), "detections": found,
                         "output": [0.0]})
        return evaluation(tmp_path / name, perfect, rows)

    evals = {"fp16": pages("fp16", 0), "fp32": pages("fp32", 0), "candidate": pages("cand", 1)}
    check = next(c for c in judge(evals, fast_bench(), GateConfig(), EMBED).checks
                 if c.name == "output_agreement")
    # two of 150 lost: F1 99.33 on that page, within the budget, so all four pages agree
    assert check.passed and check.value == 1.0
    assert "100.00% of samples with FP16's detections (detection F1 99 or more on each)" in \
        check.detail, check.detail
    detector = MetricsSpec(tuple(detection.SPECS.values()), "detection_f1")
    # the user's own detection budget sets the bar on each sample too: a tighter one (0.5 point)
    # asks F1 99.5, which the page that lost two of 150 misses; a looser number is the primary
    # metric's limit, which for a detector is its F1's
    for drop, value in (({"detection_f1": 0.5}, 0.75), (3, 1.0), (0, 0.75)):
        check = next(c for c in judge(evals, fast_bench(), GateConfig(max_accuracy_drop=drop),
                                      detector).checks if c.name == "output_agreement")
        assert check.value == value, (drop, check)
        assert f"(detection F1 {100 - (drop if isinstance(drop, int) else 0.5):g} or more" in \
            check.detail, check.detail
