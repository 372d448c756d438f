"""The mixed-precision search at scale: group ranking, edited QDQ variants, cheap signals, the
time budget and its progress lines. (Editing a QDQ graph itself, the float_nodes stage:
tests/stages/test_float_nodes.py.)"""
from __future__ import annotations

import io
import math
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from pipeline.recipes.mixed import search
from pipeline.stages.float_nodes import edit
from tests.recipes.support import explain_meta
from tests.stages.support import qdq_scales, run_unoptimized, static_qdq


# -- the search on a model of known sensitivities: blocks, budget, progress ----------------------


class Blocks:
    """Accuracy = 99 - sum of harms of the nodes left INT8. ``blocks`` blocks of ``size`` nodes
    named ``blocks.<b>.<k>``, each saving 1 ms in INT8; ``harmful`` nodes cost 0.4 points each.
    Every variant and score is counted; ``clock`` is a fake that each score advances."""

    def __init__(self, blocks, size, harmful, budget=0.1, time_budget=1e9, tick=0.0):
        from pipeline.task.metric import MetricSpec

        self.names = [f"blocks.{b}.{k}" for b in range(blocks) for k in range(size)]
        self.harms = {n: (0.4 if n in harmful else 0.0) for n in self.names}
        self.metric = MetricSpec("sequence_accuracy", True)
        self.fp16_eval = SimpleNamespace(meta={"metrics": {self.metric.name: 99.0}})
        self.evaluation, self.subset, self.hw, self.fp32 = None, (), None, None
        self.job = SimpleNamespace(quant=SimpleNamespace(
            max_accuracy_drop=budget, search_budget_s=time_budget, search_groups="blocks"))
        self.lines: list[str] = []
        self.runner = SimpleNamespace(
            run=lambda *a, **k: SimpleNamespace(meta={"sqnr_db": {n: 20.0 for n in self.names}}),
            log=self.lines.append)
        self.now, self.tick = 0.0, tick
        self.edits = self.quantizations = self.scored = self.full = 0

    def clock(self) -> float:
        return self.now

    def _art(self, floated):
        return SimpleNamespace(floated=frozenset(floated), meta={
            "precision": {n: "int8-static" for n in self.names}, "excluded": sorted(floated),
            "exclusion_ignored": []})

    def quantize(self, method, exclude, label=""):
        self.quantizations += 1
        return self._art(exclude)

    def edit(self, art, nodes, label=""):
        self.edits += 1
        return self._art(nodes)

    def score(self, art, label, subset=True):
        self.now += self.tick
        self.scored += 1
        self.full += not subset
        return 99.0 - sum(h for n, h in self.harms.items() if n not in art.floated)

    def scores(self, art, label, subset=True):
        return {self.metric.name: self.score(art, label, subset)}

    def companions_within(self, scores) -> bool:
        return True

    def explain(self, art, label=""):
        return SimpleNamespace(meta=explain_meta({n: 1.0 for n in self.names}, 50.0,
                                                 modules={n: n for n in self.names}))


@pytest.mark.parametrize("size", [4, 32])
def test_ranking_trials_grow_with_blocks_not_nodes(size):
    """8 blocks of 4 or of 32 nodes: 8 ranking trials either way (one per block, by editing the
    INT8 graph, nothing re-quantized to rank); the harmful nodes end up float and the rest of
    their block goes back to INT8 where it costs nothing."""
    fq = Blocks(8, size, harmful={"blocks.2.1", "blocks.5.0"})
    art, table, trace = search(fq, "minmax", set(), fq.quantize("minmax", set()), clock=fq.clock,
                               stream=io.StringIO())
    v = trace.verdict
    assert v.units == 8 and v.trials.ranking_trials == 8
    assert v.met and {"blocks.2.1", "blocks.5.0"} <= set(v.chosen_float_nodes)
    assert len(v.chosen_float_nodes) < 2 * size  # not the two whole blocks
    assert v.full_evaluations == fq.full <= v.evaluation_limit
    hand_back = v.trials.hand_back_trials
    assert hand_back <= 1 + max(8, math.ceil(math.sqrt(8 * size)))
    assert fq.quantizations == v.full_evaluations + 1  # only what was evaluated in full
    assert set(trace.order[:2]) == {"blocks.2", "blocks.5"}


def test_the_full_evaluations_count_up_from_one_block_when_one_block_matters():
    """64 blocks, one of them harmful and ranked first by its trial: the full evaluations try
    the top 1 block float and it passes (bisection from the middle tried 32, 16, 8, 4, 2, 1)."""
    fq = Blocks(64, 2, harmful={"blocks.37.1"})
    _, _, trace = search(fq, "minmax", set(), fq.quantize("minmax", set()), clock=fq.clock,
                         stream=io.StringIO())
    v = trace.verdict
    tops = [r.step for r in trace.trace if r.step.startswith("top ")]
    assert trace.order[0] == "blocks.37" and tops == ["top 1 of 64 blocks float"]
    assert v.met and "blocks.37.1" in v.chosen_float_nodes
    assert v.full_evaluations == fq.full <= v.evaluation_limit


def test_the_time_budget_stops_the_search_with_its_best_model_so_far():
    """Each score takes 10 s of a fake clock; with a 100 s budget the ranking stops at half of it,
    the bisection when it is spent, and the best evaluated model comes back with the reason."""
    fq = Blocks(16, 2, harmful={"blocks.3.0"}, time_budget=100.0, tick=10.0)
    art, _, trace = search(fq, "minmax", set(), fq.quantize("minmax", set()), clock=fq.clock,
                           stream=io.StringIO())
    v = trace.verdict
    assert v.stopped_by_budget == "ranking"
    assert v.trials.ranking_trials < 16
    assert "stopped by quant.search_budget_s=100" in v.summary
    evaluated = [r for r in trace.trace]
    assert evaluated and v.drop == min(r.drop for r in evaluated if r.within_budget) \
        if v.met else v.drop == min(r.drop for r in evaluated)
    assert sorted(art.floated) == sorted(v.chosen_float_nodes)


def test_progress_lines_name_the_step_and_the_time_left():
    fq = Blocks(4, 2, harmful={"blocks.1.0"}, tick=2.0)
    out = io.StringIO()
    search(fq, "minmax", set(), fq.quantize("minmax", set()), clock=fq.clock, stream=out)
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()  # a log, not a terminal: plain lines
    assert lines[0].startswith("  mixed search: 8 INT8 nodes in 4 blocks: 4 to rank, 0 clean (SQNR >= "
                               "40 dB), 0 cheap (< 0.5 % of the INT8 profile each), time budget ")
    assert lines[1].startswith("  mixed search: ranking blocks 0/4 trials, elapsed 0m")
    assert "  mixed search: ranking blocks 2/4 trials, elapsed 0m04s, about 0m04s left: blocks.2" \
        in lines
    assert any(line.startswith("  mixed search: full evaluations") for line in lines)


def test_progress_on_a_terminal_redraws_one_bar_and_keeps_log_lines_above_it():
    from pipeline.core.progress import Progress

    class Tty(io.StringIO):
        def isatty(self):
            return True

    out, now = Tty(), [0.0]
    bar = Progress(4, "sweep", out, clock=lambda: now[0], unit="points")
    log = bar.around(lambda m: out.write(m + "\n"))
    for k in range(4):
        now[0] += 5
        bar.update(k + 1, f"point {k}")
        log(f"  built point {k}")
    text = out.getvalue()
    assert "\r\x1b[K  sweep [######------------------] 1/4 points, elapsed 0m05s, about 0m15s left" in text
    assert "  built point 0\n" in text and text.endswith("  built point 3\n")


# -- on the tiny OCR model: edits against real quantizations, Ctrl-C and resumption --------------

import json  # noqa: E402
import re  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

from tests.conftest import ROOT, tiny_args  # noqa: E402


def _stage(rep: dict, label: str):
    from pipeline.core.artifact import Artifact

    return Artifact.read(Path(next(s["path"] for s in rep["stages"] if s["label"] == label)))


def test_edits_equal_quantizations_on_the_tiny_ocr_model(tiny_run, tmp_path):
    """Each module block of the tiny OCR model (convolutions, pools, the head; the LSTM stays
    dynamic INT8 in both), floated by editing the all-INT8 model, equals the quantize stage with
    that block excluded: same nodes, same scales, same precisions, same outputs."""
    from pipeline.engine.compose import compose
    from pipeline.quant.groups import units
    from pipeline.engine.runner import Runner
    from pipeline.stages.float_nodes import FloatNodes
    from pipeline.quant.defaults import Int8Settings
    from pipeline.stages.quantize import Quantize

    workdir = tiny_run[0]
    # the session run's own report: other tests of the group write later runs (runs/latest moves)
    rep = json.loads(Path(tiny_run[1].stdout.split("report: ")[-1].split()[0])
                     .with_name("report.json").read_text())
    base, prepared, cal = _stage(rep, "quantize"), _stage(rep, "prepare"), _stage(rep, "calibrate[minmax]")
    static = [n for n, p in base.meta["precision"].items() if p == "int8-static"]
    blocks = units(static, {})
    assert len(blocks) >= 2
    cfg = compose(tiny_args(workdir))
    runner = Runner(tmp_path, cfg.hardware.target(), log=lambda *_: None)
    for b in blocks:
        # the settings the run resolved for this CPU (its weight range), not fixed ones: both
        # sides quantize alike and compare with each other, on every CPU class
        want = runner.run(Quantize(Int8Settings(**base.meta["settings"]),
                                   cfg.quant.per_channel, "minmax", None,
                                   tuple(base.config["dynamic_op_types"]), tuple(sorted(b["nodes"]))),
                          prepared, calibration=cal)
        got = runner.run(FloatNodes(tuple(sorted(b["nodes"])), None), base, prepared=prepared)
        assert got.meta["precision"] == want.meta["precision"], b
        assert got.meta["exclusion_ignored"] == want.meta["exclusion_ignored"], b
        g, w = onnx.load(str(got.model)), onnx.load(str(want.model))
        assert sorted((n.name, n.op_type) for n in g.graph.node) == \
            sorted((n.name, n.op_type) for n in w.graph.node), b
        assert qdq_scales(g) == qdq_scales(w), b
        x = np.random.default_rng(3).uniform(-1, 1, (2, 1, 32, 64)).astype(np.float32)
        name = g.graph.input[0].name
        outs = [_session(m).run(None, {name: x})[0] for m in (g, w)]
        np.testing.assert_allclose(outs[0], outs[1], atol=1e-6, rtol=0)


def _session(model):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def test_ctrl_c_stops_the_search_and_the_next_run_resumes_it(tiny_run, tmp_path):
    """quant=mixed node by node on the tiny model (sharing the session run's cache): progress
    lines name each trial with k of n and the time left; Ctrl-C during the ranking ends the run
    (exit 130: a shell's view of SIGINT), and the next run reuses the trials already done."""
    fixture = tiny_run[0]
    workdir = tmp_path / "w"
    workdir.mkdir()
    (workdir / "cache").symlink_to(fixture / "cache")
    args = [a for a in tiny_args(fixture) if not a.startswith(("workdir=", "registry.root="))] + [
        f"workdir={workdir}", f"registry.root={workdir / 'registry'}", "quant=mixed",
        "quant.search_groups=nodes", f"bench.nonce=ctrl-c-{tmp_path.name}"]
    cmd = [sys.executable, "-m", "pipeline", *args]
    env = {**__import__("os").environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))
        if " ranking nodes 2/" in line:
            proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=300) == 130, "\n".join(lines)
    assert not any("Traceback" in ln for ln in lines), "\n".join(lines)
    assert sum(ln.startswith("interrupted ") and "rerun to resume" in ln for ln in lines) == 1, \
        "\n".join(lines)
    ranking = [ln for ln in lines if "mixed search: ranking nodes" in ln]
    assert ranking[0].startswith("  mixed search: ranking nodes 0/") and "left: " in ranking[0]
    done = trials(lines, "built ")
    assert done and not any(p.name.startswith(".tmp") for p in (fixture / "cache").glob("*/*"))
    again = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    second = again.stdout.splitlines()
    reused, built = trials(second, "reused"), trials(second, "built ")
    # resumed: what the first run built is reused, the rest is built now, none twice, and the
    # ranking ends. A trial takes a tenth of a second here: on a busy machine the signal (sent
    # when this test reads "2/") can land after the last one, and then nothing is left to build.
    total = re.search(r"ranking nodes \d+/(\d+)", ranking[0]).group(1)
    assert reused == done and not built & done, (done, second)
    assert any(f"ranking nodes {total}/{total} " in ln for ln in second), second


def trials(lines: list[str], verb: str) -> set[str]:
    """The ranking trials a run's lines say it ``verb`` (built or reused): "float cnn.11"."""
    return {m.group(1) for ln in lines if (m := re.match(rf"  {verb} rank\[(float [^\]]+)\]", ln))}


def test_blocks_follow_module_paths_and_unnamed_nodes_are_cut_into_runs():
    from pipeline.quant.groups import block, units

    assert [block(p) for p in ("blocks.3.dw.0", "encoder.layer.2.attention.self", "rnn",
                               "/cnn/cnn.4/Conv", "node_Conv_3")] == \
        ["blocks.3", "encoder.layer.2", "rnn", "cnn.cnn.4", None]
    named = units([f"blocks.{b}.{k}" for b in range(5) for k in range(3)], {})
    assert [u["name"] for u in named] == [f"blocks.{b}" for b in range(5)]
    unnamed = units([f"Conv_{i}" for i in range(100)], {})  # an imported graph: no module paths
    assert len(unnamed) == 10 and all(len(u["nodes"]) == 10 for u in unnamed)
    assert len(units([f"Conv_{i}" for i in range(100)], {}, by="nodes")) == 100


# -- nodes with no reported precision: a LayerNorm's Q/DQ ---------------------------------------

def _norm_net(seed: int = 0):
    """x -> conv -> add(x) -> avgpool -> flatten -> layernorm -> matmul -> y. The report gives
    no precision to the LayerNormalization, yet the quantizer rounds its input and output."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, (3, 3, 3, 3)).astype(np.float32), "conv.weight"),
             numpy_helper.from_array(np.ones(12, np.float32), "norm.weight"),
             numpy_helper.from_array(rng.normal(0, 0.1, 12).astype(np.float32), "norm.bias"),
             numpy_helper.from_array(rng.normal(0, 0.3, (12, 4)).astype(np.float32), "head.weight")]
    nodes = [helper.make_node("Conv", ["x", "conv.weight"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "x"], ["a"], name="add"),
             helper.make_node("AveragePool", ["a"], ["p"], name="pool", kernel_shape=[4, 4], strides=[4, 4]),
             helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
             helper.make_node("LayerNormalization", ["f", "norm.weight", "norm.bias"], ["n"], name="norm",
                              axis=-1),
             helper.make_node("MatMul", ["n", "head.weight"], ["y"], name="head")]
    graph = helper.make_graph(nodes, "net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 4])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_layernorm_with_no_reported_precision_can_be_handed_back_to_float(tmp_path):
    """The LayerNormalization is a hand-back candidate (it had none before: only nodes with a
    reported INT8 precision were), floated together with the pool and Flatten that feed it alone (floated
    alone it would still read the Flatten's rounded output); the edited model equals
    quantize_static with that group excluded, and its input reaches it unrounded."""
    from pipeline.stages.float_nodes import handback_candidates
    from pipeline.stages.quantize import precisions

    src = tmp_path / "float.onnx"
    onnx.save(_norm_net(), str(src))
    all_int8 = static_qdq(src, tmp_path / "int8.onnx", set())
    precision = precisions(tmp_path / "int8.onnx")
    assert "norm" not in precision
    order, closure = handback_candidates(all_int8.graph, precision)
    assert "norm" in order and order.index("norm") > order.index("pool")
    assert set(closure["norm"]) == {"norm", "flatten", "pool"}  # the data movement feeding it
    assert "flatten" not in order  # data movement: floated with what it feeds, not alone
    group = set(closure["norm"])
    want = static_qdq(src, tmp_path / "want.onnx", group)
    got = edit(all_int8, onnx.load(str(src)), group, set())
    assert sorted((n.name, n.op_type) for n in got.graph.node) == \
        sorted((n.name, n.op_type) for n in want.graph.node)
    assert qdq_scales(got) == qdq_scales(want)
    x = np.random.default_rng(7).normal(size=(3, 3, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(run_unoptimized(got, x), run_unoptimized(want, x), atol=1e-6, rtol=0)
    producer = {o: n for n in got.graph.node for o in n.output}
    norm = next(n for n in got.graph.node if n.name == "norm")
    assert producer[norm.input[0]].op_type == "Flatten"


@pytest.mark.parametrize("by", ["blocks", "nodes"])
def test_the_search_floats_a_layernorm_it_was_blind_to(tmp_path, by):
    """On the all-INT8 model of ``_norm_net``, where only the LayerNormalization's rounding costs
    accuracy (0.4 points against a budget of 0.1), the search meets the budget by floating it
    with the ops that feed it: before, only the nodes with a reported precision were candidates,
    and floating every one of them left the drop where it was."""
    from pipeline.stages.quantize import precisions

    src = tmp_path / "float.onnx"
    onnx.save(_norm_net(), str(src))
    static_qdq(src, tmp_path / "int8.onnx", set())
    reported = [n for n, p in precisions(tmp_path / "int8.onnx").items() if p.startswith("int8")]
    assert "norm" not in reported

    class Norm(Blocks):
        def __init__(self):
            super().__init__(1, 1, harmful=set())
            self.job.quant.search_groups = by
            self.names = reported
            self.harms = {"norm": 0.4}

        def _art(self, floated):
            art = super()._art(floated)
            art.model, art.meta["excluded"] = tmp_path / "int8.onnx", sorted(floated)
            return art

    fq = Norm()
    art, table, trace = search(fq, "minmax", set(), fq.quantize("minmax", set()), clock=fq.clock,
                               stream=io.StringIO())
    v = trace.verdict
    assert v.met, v.summary
    assert {"norm", "flatten"} <= set(v.chosen_float_nodes) == set(art.floated)
    assert any(r.node == "norm" and r.op == "LayerNormalization" for r in table)
