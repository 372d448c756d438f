"""INT8 that earns its speed: hardware defaults, streamed calibration, the explanation, the
per-op-type plan, and the mixed-precision search's logic."""
from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from pipeline.config import QuantConfig
from pipeline.models import task
from pipeline.recipes.mixed import search
from pipeline.quant.defaults import Int8Settings, resolve
from tests.conftest import run_cli, session_run, tiny_args


def test_hardware_defaults_follow_vnni():
    q = QuantConfig()
    assert resolve(q, ["avx2", "avx512f", "avx512_vnni"]).reduce_range is False
    assert resolve(q, ["avx2", "fma"]).reduce_range is True
    assert resolve(q, ["avx2", "amx_int8"]).vnni is True
    forced = resolve(QuantConfig(reduce_range=True), ["avx512_vnni"])
    assert forced.reduce_range is True and "set by config" in forced.reason


@pytest.mark.parametrize("caps, kept", [
    ({}, {"avx2", "avx512f", "avx512_vnni", "amx_int8", "avx512_bf16"}),
    ({"ONEDNN_MAX_CPU_ISA": "AVX2"}, {"avx2"}),
    ({"ONEDNN_MAX_CPU_ISA": "avx512_core_vnni"}, {"avx2", "avx512f", "avx512_vnni"}),
    ({"ATEN_CPU_CAPABILITY": "avx2"}, {"avx2"}),
    ({"ONEDNN_MAX_CPU_ISA": "ALL"}, {"avx2", "avx512f", "avx512_vnni", "amx_int8", "avx512_bf16"}),
])
def test_an_instruction_set_cap_drops_the_flags_it_forbids(caps, kept):
    """Capped at AVX2, an AMX machine runs AVX2 kernels: its INT8 weights must be 7-bit."""
    from pipeline.core.env import capped

    amx = ["sse4_2", "avx2", "avx512f", "avx512_vnni", "amx_int8", "avx512_bf16"]
    flags = capped(amx, caps)
    assert set(flags) - {"sse4_2"} == kept and "sse4_2" in flags
    assert resolve(QuantConfig(), flags).reduce_range is (not kept & {"avx512_vnni", "amx_int8"})


def report(workdir: Path) -> dict:
    return json.loads((workdir / "runs" / "latest" / "report.json").read_text())


def stage_meta(rep: dict, label: str) -> dict:
    from pipeline.core.artifact import Artifact

    return Artifact.read(Path(next(s["path"] for s in rep["stages"] if s["label"] == label))).meta


def test_int8_plan_explanation_and_names(tiny_run):
    rep = json.loads((session_run(tiny_run) / "report.json").read_text())
    labels = [s["label"] for s in rep["stages"]]
    assert {"prepare", "calibrate[minmax]", "quantize", "explain", "sqnr"} <= set(labels)
    q = rep["quantization"]
    assert q["settings"]["activation_type"] == "uint8" and "reason" in q["settings"]
    precision = stage_meta(rep, "quantize")["precision"]
    # Module names from the export, the LSTM dynamic, the convolutions static.
    assert precision["rnn"] == "int8-dynamic"
    assert precision["cnn.0"] == precision["cnn.4"] == "int8-static"
    ex = q["explain"]
    assert {"unfused_quantize", "unfused_dequantize", "float_compute", "int8_kernels"} <= set(ex)
    convs = {r["node"]: r for r in ex["nodes"] if r["fp32_op"] == "Conv"}
    assert "cnn.0" in convs and convs["cnn.0"]["fp32_ms"] > 0 and convs["cnn.0"]["int8_ms"] > 0
    sqnr = {r["node"]: r["sqnr_db"] for r in q["sensitivity"]}
    from pipeline.core.artifact import Artifact

    final = Artifact.read(Path(rep["lineage"]["candidate"]["path"])).meta["precision"]
    assert set(sqnr) == {n for n, p in final.items() if p.startswith("int8")}
    assert all(v is None or v > 0 for v in sqnr.values())
    # What was profiled slower in INT8 and kept float is float in the candidate; what the
    # quantizer could not hand back is named, never reported as float.
    assert all(final[n] == "float" for n in q["latency_exclusions"])
    trial = q.get("latency_trial") or {"float_nodes": [], "stayed_int8": []}
    assert not set(trial["float_nodes"]) & set(trial["stayed_int8"])
    assert "## Quantization" in (session_run(tiny_run) / "report.md").read_text()


def test_model_outputs_are_not_rounded_to_8_bits(tiny_run):
    """The head's bias Add has no weights to gain from INT8 and would round the logits: it stays
    float, so no DequantizeLinear makes the candidate's output. Latency-aware off, so the rule
    alone decides (on the random tiny network profiling floats the Add anyway)."""
    import onnx

    workdir, _ = tiny_run
    proc = run_cli(*tiny_args(workdir, "quant.latency_aware=false"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rep = report(workdir)
    assert rep["quantization"]["float_outputs"] == ["head/Add"]
    first = stage_meta(rep, "quantize")["precision"]
    assert first["head/Add"] == "int8-static"  # what the quantizer alone would have shipped
    cand = Path(rep["lineage"]["candidate"]["path"]) / "model.onnx"
    graph = onnx.load(str(cand)).graph
    makers = {o: n.op_type for n in graph.node for o in n.output}
    assert [makers[o.name] for o in graph.output] == ["Add"]
    assert "model outputs kept float: head/Add" in (workdir / "runs" / "latest" / "report.md").read_text()


def test_streamed_calibration_equals_onnxruntimes_own(tiny_run, tmp_path):
    """The ranges our chunked calibration caches are the ones quantize_static computes itself."""
    from onnxruntime.quantization import CalibrationDataReader, quantize_static
    from onnxruntime.quantization.calibrate import load_tensors_data

    from pipeline.models.ocr import crnn as ocr

    rep = report(tiny_run[0])
    cal = next(s for s in rep["stages"] if s["label"] == "calibrate[minmax]")
    prepared = next(s for s in rep["stages"] if s["label"] == "prepare")
    ours = load_tensors_data(Path(cal["path"]) / "calibration.json")
    ds, _ = ocr.dataset("calibration", 32, tiny_run[0] / "data")

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{"image": x} for _, x, _ in ocr.batches(ds, 32, sort_by_width=False)])

        def get_next(self):
            return next(self.it, None)

    cache = tmp_path / "theirs.json"  # float ranges only: the INT8 model it writes is unused
    quantize_static(str(Path(prepared["path"]) / "model.onnx"), str(tmp_path / "q.onnx"), Reader(),
                    calibration_cache_path=str(cache))
    theirs = load_tensors_data(cache)
    assert set(ours.keys()) == set(theirs.keys())
    for k in theirs.keys():
        np.testing.assert_allclose(np.asarray(ours[k].range_value, dtype=np.float64),
                                   np.asarray(theirs[k].range_value, dtype=np.float64), rtol=1e-6)
    assert stage_meta(rep, "calibrate[minmax]")["observed"]["chunks"] >= 1


def test_an_exclusion_onnxruntime_ignores_is_reported(tiny_run, tmp_path):
    """A MaxPool between INT8 convolutions keeps its Q/DQ pair whatever nodes_to_exclude says;
    the stage names it instead of letting the recipe call it float."""
    from pipeline.core.artifact import Artifact
    from pipeline.engine.compose import compose
    from pipeline.engine.runner import Runner
    from pipeline.stages.quantize import Quantize

    workdir = tiny_run[0]
    rep = report(workdir)
    base = stage_meta(rep, "quantize")
    static = sorted(n for n, p in base["precision"].items() if p == "int8-static")
    prepared = Artifact.read(Path(next(s["path"] for s in rep["stages"] if s["label"] == "prepare")))
    cal = Artifact.read(Path(next(s["path"] for s in rep["stages"]
                                  if s["label"] == "calibrate[minmax]")))
    maxpools = [n for n in static if _op_type(prepared.model, n) == "MaxPool"]
    convs = [n for n in static if _op_type(prepared.model, n) == "Conv"]
    assert maxpools and convs
    cfg = compose(tiny_args(workdir))
    hw = cfg.hardware.target()
    # the settings the run resolved for this CPU (7-bit weights without VNNI); only structure
    # and records are asserted, which hold on every CPU class
    stage = Quantize(Int8Settings(**base["settings"]), cfg.quant.per_channel, "minmax",
                     None, task("ocr").dynamic_op_types, (convs[-1], maxpools[0]))
    art = Runner(tmp_path, hw, log=lambda *_: None).run(stage, prepared, calibration=cal)
    assert art.meta["precision"][convs[-1]] == "float"
    assert art.meta["exclusion_ignored"] == [maxpools[0]]
    # With float nodes the model carries its own ONNX Runtime setting, honoured by our sessions
    # (described in a child process: a session here would fix this process's thread pool).
    from pipeline.core import isolate
    from pipeline.runtimes.onnxruntime import disabled_optimizers

    assert disabled_optimizers(art.model) == art.meta["onnxruntime_disabled_optimizers"] \
        == ["QDQPropagationTransformer"]
    assert disabled_optimizers(Path(next(s["path"] for s in rep["stages"]
                                         if s["label"] == "quantize")) / "model.onnx") == []
    assert isolate.call("describe", _describe, art.model, hw)["settings"]["disabled_optimizers"] \
        == ["QDQPropagationTransformer"]


def test_an_exclusion_that_floats_nothing_keeps_qdq_propagation_on(tiny_run, tmp_path):
    """Only a node really kept float needs propagation off; a MaxPool that stays INT8 must not
    cost the all-INT8 model its fast pools."""
    from pipeline.core.artifact import Artifact
    from pipeline.engine.compose import compose
    from pipeline.engine.runner import Runner
    from pipeline.stages.quantize import Quantize

    workdir = tiny_run[0]
    rep = report(workdir)
    base = stage_meta(rep, "quantize")
    prepared = Artifact.read(Path(next(s["path"] for s in rep["stages"] if s["label"] == "prepare")))
    cal = Artifact.read(Path(next(s["path"] for s in rep["stages"]
                                  if s["label"] == "calibrate[minmax]")))
    maxpool = next(n for n, p in sorted(base["precision"].items())
                   if p == "int8-static" and _op_type(prepared.model, n) == "MaxPool")
    cfg = compose(tiny_args(workdir))
    stage = Quantize(Int8Settings(**base["settings"]), cfg.quant.per_channel, "minmax",  # resolved
                     None, task("ocr").dynamic_op_types, (maxpool,))
    art = Runner(tmp_path, cfg.hardware.target(), log=lambda *_: None).run(
        stage, prepared, calibration=cal)
    assert art.meta["exclusion_ignored"] == [maxpool]
    assert art.meta["onnxruntime_disabled_optimizers"] == []


def test_unknown_exclude_name_is_a_config_error_naming_the_valid_ones(tiny_run, tmp_path):
    from tests.conftest import run_cli
    from tests.faults import copy_of_tiny_run

    args = copy_of_tiny_run(tiny_run, tmp_path, **{"quant.exclude": "[cnn.0,cnn.99]"})
    before = sorted((tmp_path / "cache").glob("quantize/*"))
    proc = run_cli(*args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "'cnn.99' is not a node" in lines[0], proc.stderr
    assert "valid names: cnn.0," in lines[0] and "rnn" in lines[0]
    assert sorted((tmp_path / "cache").glob("quantize/*")) == before, "nothing quantized"


def _describe(model: Path, hw) -> dict:
    from pipeline.runtimes import load

    return load(model, hw).describe()


def _op_type(model_path: Path, node: str) -> str:
    import onnx

    graph = onnx.load(str(model_path), load_external_data=False).graph
    return next(n.op_type for n in graph.node if n.name == node)


def test_dynamic_mode_needs_no_calibration(tiny_run):
    workdir, _ = tiny_run
    proc = run_cli(*tiny_args(workdir, "quant=dynamic"))
    assert proc.returncode == 0, proc.stderr
    rep = report(workdir)
    labels = {s["label"] for s in rep["stages"]}
    assert not any(label.startswith("calibrate") for label in labels)
    precision = stage_meta(rep, "quantize")["precision"]
    assert precision["rnn"] == precision["head"] == "int8-dynamic"
    assert precision["cnn.0"] == "float"


# -- the search, on a model of known sensitivities ---------------------------------------------

class FakeQuantizer:
    """Accuracy = 99 - sum of harms of the nodes left INT8; each node saves `gain` ms in INT8."""

    def __init__(self, harms: dict, gains: dict, budget: float, floor: float = 0.0):
        self.harms, self.gains, self.floor = harms, gains, floor
        from pipeline.task.metric import MetricSpec

        self.metric = MetricSpec("sequence_accuracy", True)
        self.fp16_eval = SimpleNamespace(meta={"metrics": {self.metric.name: 99.0}})
        self.evaluation = None  # the DataSplit; the fake runner never reads it
        self.job = SimpleNamespace(quant=SimpleNamespace(max_accuracy_drop=budget, search_groups="nodes"),
                                   model=SimpleNamespace(name="ocr", eval_samples=100), data_dir="d")
        self.subset, self.hw, self.fp32 = (), None, None
        self.runner = SimpleNamespace(run=lambda *a, **k: SimpleNamespace(
            meta={"sqnr_db": {n: 30.0 for n in harms}}))
        self.full = 0

    stuck = frozenset()  # nodes the quantizer cannot make float (a MaxPool between INT8 nodes)

    def quantize(self, method, exclude, label=""):
        return SimpleNamespace(floated=frozenset(exclude) - self.stuck,
                               meta={"precision": {n: "int8-static" for n in self.harms},
                                     "excluded": sorted(exclude),
                                     "exclusion_ignored": sorted(self.stuck & set(exclude))})

    def score(self, art, label, subset=True):
        self.full += not subset
        return 99.0 - self.floor - sum(h for n, h in self.harms.items() if n not in art.floated)

    def scores(self, art, label, subset=True):
        return {self.metric.name: self.score(art, label, subset), "floated": art.floated}

    needs_float = frozenset()  # nodes a metric judged beside the primary needs float

    def companions_within(self, scores) -> bool:
        return self.needs_float <= scores["floated"]

    def explain(self, art, label=""):
        from tests.recipes.support import explain_meta

        return SimpleNamespace(meta=explain_meta(self.gains, 10.0))


def test_search_finds_the_few_harmful_nodes_in_log_evaluations():
    names = [f"n{i}" for i in range(16)]
    harms = {n: (0.4 if n in ("n3", "n11") else 0.001) for n in names}
    gains = {n: 1.0 for n in names}
    fq = FakeQuantizer(harms, gains, budget=0.1)
    art, table, trace = search(fq, "minmax", set(), fq.quantize("minmax", set()))
    v = trace.verdict
    assert v.met and set(v.chosen_float_nodes) >= {"n3", "n11"}
    assert v.drop <= 0.1 and art.floated == frozenset(v.chosen_float_nodes)
    assert v.full_evaluations == fq.full <= 2 * math.log2(16) + 3
    assert table[0].node in ("n3", "n11") and table[1].node in ("n3", "n11")


def test_search_keeps_the_best_and_says_so_when_the_budget_cannot_be_met():
    names = [f"n{i}" for i in range(8)]
    fq = FakeQuantizer({n: 0.2 for n in names}, {n: 1.0 for n in names}, budget=0.05, floor=0.5)
    art, _, trace = search(fq, "minmax", set(), fq.quantize("minmax", set()))
    v = trace.verdict
    assert not v.met and "not met" in v.summary
    assert v.drop == pytest.approx(min(r.drop for r in trace.trace))


def test_search_leaves_out_nodes_that_cannot_be_made_float():
    names = [f"n{i}" for i in range(8)]
    fq = FakeQuantizer({n: (0.4 if n == "n5" else 0.001) for n in names},
                       {n: 1.0 for n in names}, budget=0.1)
    fq.stuck = frozenset({"n2", "n6"})
    _, table, trace = search(fq, "minmax", set(), fq.quantize("minmax", set()))
    assert not {"n2", "n6"} & set(trace.order) and trace.order[0] == "n5"
    assert {r.node for r in table if not r.can_float} == {"n2", "n6"}
    assert trace.verdict.met and trace.verdict.quantizable_nodes == 6


@pytest.mark.parametrize("medians, min_speedup, expect", [
    ({1: 1.3, 8: 1.6}, 1.0, "int8"),      # INT8 pays at every batch size: kept
    ({1: 1.1, 8: 0.72}, 1.0, "fp32"),     # slower at batch 8: the FP32 model is the candidate
    ({1: 0.98, 8: 1.02}, 1.0, "int8"),    # not shown slower (the interval spans 1): kept
    ({1: 0.5, 8: 0.5}, 0.0, "int8"),      # the gate asks for no speed: INT8 kept for its size
])
def test_int8_that_cannot_pay_falls_back_to_the_fp32_model(medians, min_speedup, expect):
    """The last INT8 step times the final model against FP32 at every benchmarked batch size
    (a stubbed runner stands in for the compare stage's timings)."""
    from pipeline.quant.int8_info import QuantInfo
    from pipeline.recipes.int8 import not_slower_than_fp32
    from tests.recipes.support import compare_meta

    calls = []

    def run(stage, art, label, other):
        calls.append((stage.batch_size, label, other))
        m = medians[stage.batch_size]
        return SimpleNamespace(meta=compare_meta(m, m - 0.02, m + 0.02))

    cfg = SimpleNamespace(quant=SimpleNamespace(latency_aware=True),
                          gate=SimpleNamespace(min_speedup=min_speedup),
                          bench=SimpleNamespace(batch_sizes=[1, 8], min_rounds=20, max_seconds=1.0))
    qz = SimpleNamespace(job=cfg, runner=SimpleNamespace(run=run), evaluation=None, hw=None,
                         fp32="fp32-artifact")
    info = QuantInfo(settings={}, calibration="minmax")
    chosen = not_slower_than_fp32(qz, "int8-artifact", info)
    assert chosen == {"int8": "int8-artifact", "fp32": "fp32-artifact"}[expect]
    if min_speedup == 0:
        assert calls == [] and info.versus is None
    else:
        assert [c[0] for c in calls] == [1, 8] and all(c[2] == "fp32-artifact" for c in calls)
        assert info.versus.candidate == expect
        assert info.versus.slower_at_batch == (("8",) if expect == "fp32" else ())


def test_the_search_keeps_only_models_whose_gated_companions_pass():
    """The primary is within budget with every node INT8, but a metric the gate judges beside it
    (a detector's cosine_parts) fails until n5 is float: the search does not return the all-INT8
    model the gate would then refuse."""
    names = [f"n{i}" for i in range(8)]
    fq = FakeQuantizer({n: 0.001 for n in names}, {n: 1.0 for n in names}, budget=0.1)
    fq.needs_float = frozenset({"n5"})
    art, _, trace = search(fq, "minmax", set(), fq.quantize("minmax", set()))
    assert trace.trace[0].step == "all INT8" and not trace.trace[0].within_budget
    assert trace.verdict.met and "n5" in art.floated
