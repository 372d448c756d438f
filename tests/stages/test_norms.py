"""norms: residual LayerNorms (a fused SkipLayerNormalization, or Add + LayerNormalization) become
Add + LayerNormalization on [rows, hidden], which computes the same and which ONNX Runtime does
not fuse back into SkipLayerNormalization when it loads the graph; the rewrite is applied only
when the timing says the flat form is faster, and a rewrite that changes outputs is dropped."""
from __future__ import annotations

import numpy as np
import pytest

from tests.stages.support import outputs, save, split

SEQ, HIDDEN = 5, 8


def _block(folder, rng):
    """x -> LayerNorm(x + x @ W1) -> SkipLayerNormalization(h, h @ W2, gamma, beta, bias) -> y,
    on [batch, 5, 8] with the sequence and hidden sizes static, as the runtime's fusion wants."""
    from onnx import TensorProto, helper, numpy_helper

    c = {"w1": rng.standard_normal((HIDDEN, HIDDEN)), "w2": rng.standard_normal((HIDDEN, HIDDEN)),
         "g1": rng.uniform(0.5, 2, HIDDEN), "b1": rng.standard_normal(HIDDEN),
         "g2": rng.uniform(0.5, 2, HIDDEN), "b2": rng.standard_normal(HIDDEN),
         "bias": rng.standard_normal(HIDDEN)}
    n = helper.make_node
    nodes = [n("MatMul", ["x", "w1"], ["r1"], name="mm1"), n("Add", ["r1", "x"], ["s1"], name="res1"),
             n("LayerNormalization", ["s1", "g1", "b1"], ["h"], axis=-1, epsilon=1e-5, name="ln1"),
             n("MatMul", ["h", "w2"], ["r2"], name="mm2"),
             n("SkipLayerNormalization", ["r2", "h", "g2", "b2", "bias"], ["y"],
               domain="com.microsoft", epsilon=1e-6, name="sln2")]
    io = [helper.make_tensor_value_info(k, TensorProto.FLOAT, ["batch", SEQ, HIDDEN]) for k in "xy"]
    inits = [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in c.items()]
    path = save(folder / "model.onnx", nodes, io[:1], io[1:], inits)
    import onnx

    m = onnx.load(str(path))
    m.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    onnx.save(m, str(path))
    return path


def _runtime_ops(model, tmp_path) -> dict:
    """The op counts of the graph ONNX Runtime runs after its own fusions."""
    import onnx
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = str(tmp_path / "runtime.onnx")
    ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])
    counts: dict = {}
    for node in onnx.load(so.optimized_model_filepath).graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def test_flat_norms_compute_the_same_and_stay_unfused_at_load(tmp_path):
    import onnx

    from pipeline.stages.norms import flatten

    rng = np.random.default_rng(0)
    model = _block(tmp_path, rng)
    assert _runtime_ops(model, tmp_path).get("SkipLayerNormalization") == 2  # both fused at load
    m = onnx.load(str(model))
    assert flatten(m) == 2
    onnx.checker.check_model(m)
    flat = tmp_path / "flat.onnx"
    onnx.save(m, str(flat))
    ops = _runtime_ops(flat, tmp_path)
    assert "SkipLayerNormalization" not in ops and ops["LayerNormalization"] == 2
    x = rng.standard_normal((3, SEQ, HIDDEN)).astype(np.float32)
    assert np.allclose(outputs(flat, {"x": x})[0], outputs(model, {"x": x})[0], atol=1e-4)


def _as_fast(hidden, hardware):
    return {"flat_over_skip": {"median": 1.02, "ci95": [0.98, 1.05]}}


def _much_faster(hidden, hardware):
    return {"flat_over_skip": {"median": 5.0, "ci95": [4.8, 5.2]}}


@pytest.mark.parametrize("speed, flattened", [(_as_fast, 0), (_much_faster, 2)])
def test_the_flat_form_only_where_the_timing_says_it_is_faster(tmp_path, speed, flattened):
    from pipeline.config import HardwareConfig
    from pipeline.core import isolate
    from pipeline.models import task
    from pipeline.stages.norms import flattened_if_faster

    rng = np.random.default_rng(1)
    model = _block(tmp_path, rng)
    data = split(tmp_path, model, rng.standard_normal((8, SEQ, HIDDEN)))
    t = task(data.task)
    target = tmp_path / "out.onnx"
    # in a child process: the parity check sets onnxruntime's process-wide thread pool
    record = isolate.call("norms", flattened_if_faster, model, target, t, t.dataset(data),
                          HardwareConfig().target(), speed)
    assert record["candidates"] == 2 and record["flattened"] == flattened
    if flattened:
        assert record["why_not"] is None and record["parity"]["max_abs_diff"] <= 1e-3
    else:
        assert "as fast" in record["why_not"] and target.read_bytes() == model.read_bytes()


def test_static_int8_keeps_the_flat_residual_stream_float(tmp_path):
    """Inside SkipLayerNormalization the residual sum was never quantized; made flat, its Add and
    LayerNormalization would be (static QDQ takes every op type it supports), and one per-tensor
    scale on a pretrained encoder's residual stream loses it (all-mpnet-base-v2's static INT8
    read a cosine of 0.15). They stay float; the MatMuls are still INT8."""
    import onnx

    from pipeline.stages.calibrate import Calibrate
    from pipeline.stages.norms import flatten
    from pipeline.stages.quantize import Quantize
    from tests.stages.support import INT8, artifact, run

    rng = np.random.default_rng(2)
    src = tmp_path / "flat"
    src.mkdir()
    m = onnx.load(str(_block(tmp_path, rng)))
    flatten(m)
    onnx.save(m, str(src / "model.onnx"))
    cal = split(tmp_path, src / "model.onnx", rng.standard_normal((16, SEQ, HIDDEN)), "calibration")
    cmeta = run(Calibrate(cal, "minmax", 4), artifact(src), tmp_path / "cal")
    meta = run(Quantize(INT8, True, "minmax", None, ()), artifact(src), tmp_path / "int8",
               calibration=artifact(tmp_path / "cal", "calibrate", **cmeta))
    precision = meta["precision"]
    assert precision["mm1"] == precision["mm2"] == "int8-static"
    flat = [n.name for n in m.graph.node if n.op_type in ("Add", "LayerNormalization")]
    assert len(flat) == 5 and set(meta["residual_nodes"]) >= set(flat)
    assert all(precision.get(n, "float") == "float" for n in flat), precision


def test_a_broadcast_sum_is_left_alone_and_the_others_still_flatten(tmp_path):
    """ALBERT's embedding LayerNorm reads word embeddings [batch, 5, 8] plus position embeddings
    [1, 5, 8]: as rows of [-1, 8] the two no longer line up, and the runtime refused the whole
    rewrite, every residual norm with it. The broadcast sum stays as it is, the residual one
    after it is flattened, and the outputs are the same at a batch above 1."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from pipeline.stages.norms import flatten

    rng = np.random.default_rng(0)
    c = {"pos": rng.standard_normal((1, SEQ, HIDDEN)), "w": rng.standard_normal((HIDDEN, HIDDEN)),
         "g0": rng.uniform(0.5, 2, HIDDEN), "b0": rng.standard_normal(HIDDEN),
         "g1": rng.uniform(0.5, 2, HIDDEN), "b1": rng.standard_normal(HIDDEN)}
    n = helper.make_node
    nodes = [n("Identity", ["pos"], ["p"], name="positions"),  # not an initializer read directly
             n("Add", ["x", "p"], ["e"], name="embed"),
             n("LayerNormalization", ["e", "g0", "b0"], ["h"], axis=-1, name="ln0"),
             n("MatMul", ["h", "w"], ["r"], name="mm"), n("Add", ["r", "h"], ["s"], name="res"),
             n("LayerNormalization", ["s", "g1", "b1"], ["y"], axis=-1, name="ln1")]
    io = [helper.make_tensor_value_info(k, TensorProto.FLOAT, ["batch", SEQ, HIDDEN]) for k in "xy"]
    inits = [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in c.items()]
    path = save(tmp_path / "model.onnx", nodes, io[:1], io[1:], inits)
    model = onnx.load(str(path))
    assert flatten(model) == 1
    flat = tmp_path / "flat.onnx"
    onnx.save(model, str(flat))
    x = rng.standard_normal((3, SEQ, HIDDEN)).astype(np.float32)
    assert np.allclose(outputs(flat, {"x": x})[0], outputs(path, {"x": x})[0], atol=1e-5)
