"""Dynamic INT8 of token-wise MatMuls: weights per output channel, and outlier channels of the
activations migrated into the weights (``pipeline.stages.smooth``) before quantizing.

Each test builds a one- or two-MatMul ONNX graph with ``onnx.helper`` and runs the real
``Quantize`` stage (onnxruntime's ``quantize_dynamic``) on it, as the INT8 recipe does; the
signal-to-quantization-noise ratio of the output against the float graph is the measure. The
injected defects are what pretrained encoders carry: one weight column far larger than the rest,
and one activation channel (a LayerNorm gain) tens of times the others.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from pipeline.config import QuantConfig
from pipeline.core.env import effective_flags
from pipeline.quant.calibration import DYNAMIC
from pipeline.quant.defaults import resolve
from pipeline.stages.quantize import Quantize
from pipeline.stages.smooth import migrate, outlier_ratio, smoothable


def _graph(path, weights: dict, nodes, hidden: int, out_dim: int):
    g = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "t", hidden])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, ["b", "t", out_dim])
         for o in [nodes[-1].output[0]]],
        [numpy_helper.from_array(w.astype(np.float32), k) for k, w in weights.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(onnx.shape_inference.infer_shapes(m), str(path))
    return path


def _run(path, x):
    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return s.run(None, {"x": x})[0]


def _sqnr(ref, y):
    return float(10 * np.log10((ref ** 2).sum() / max(((ref - y) ** 2).sum(), 1e-30)))


def _dynamic(src, out_dir, per_channel=True):
    """The recipe's Quantize stage, dynamic MatMul only, with this CPU's settings."""
    out_dir.mkdir()
    settings = resolve(QuantConfig(), effective_flags())
    Quantize(settings, per_channel, DYNAMIC, (), ("MatMul", "Gemm")).run(
        SimpleNamespace(model=src), out_dir)
    return out_dir / "model.onnx"


def test_dynamic_weights_are_quantized_per_output_channel(tmp_path):
    rng = np.random.default_rng(0)
    w = rng.normal(size=(32, 16))
    w[:, 0] *= 100  # one output column a hundred times the others: a per-tensor scale crushes them
    f = _graph(tmp_path / "f.onnx", {"w": w}, [helper.make_node("MatMul", ["x", "w"], ["y"], "mm")],
               32, 16)
    x = rng.normal(size=(4, 10, 32)).astype(np.float32)
    ref = _run(f, x)
    q = _dynamic(f, tmp_path / "q")
    y = _run(q, x)
    # the small columns keep their precision: per-tensor weights give them under 3 bits (~14 dB)
    assert _sqnr(ref[..., 1:], y[..., 1:]) > 30
    counts = {n.op_type for n in onnx.load(str(q)).graph.node}
    assert counts & {"DynamicQuantizeLinear", "DynamicQuantizeMatMul", "MatMulInteger"}


def test_outlier_channels_are_migrated_into_the_weights(tmp_path):
    """Q, K, V-like: three MatMuls read one activation whose channel 5 is 60x the others (a
    LayerNorm gain, as in pretrained encoders). Migrated, FP32 is unchanged and dynamic INT8
    gains accuracy; the three weights share one Mul."""
    rng = np.random.default_rng(1)
    hidden = 64
    ws = {k: rng.normal(scale=0.1, size=(hidden, hidden)) for k in ("wq", "wk", "wv")}
    ws["gain"] = np.ones(hidden)
    ws["gain"][5] = 60.0
    nodes = [helper.make_node("Mul", ["x", "gain"], ["h"], "ln_gain")]
    nodes += [helper.make_node("MatMul", ["h", k], [k + "_y"], k) for k in ("wq", "wk", "wv")]
    nodes += [helper.make_node("Add", ["wq_y", "wk_y"], ["qk"], "add1"),
              helper.make_node("Add", ["qk", "wv_y"], ["y"], "add2")]
    f = _graph(tmp_path / "f.onnx", ws, nodes, hidden, hidden)
    assert smoothable(f) == {"h": ["wq", "wk", "wv"]}
    calib = rng.normal(size=(8, 12, hidden)).astype(np.float32)
    x = rng.normal(size=(8, 12, hidden)).astype(np.float32)
    absmax = np.abs(calib * ws["gain"].astype(np.float32)).reshape(-1, hidden).max(0)
    assert outlier_ratio(absmax) > 30
    record = migrate(f, {"h": absmax}, 0.5, tmp_path / "s.onnx")
    assert record["h"]["outlier_ratio_after"] < record["h"]["outlier_ratio"] / 4
    smoothed = onnx.load(str(tmp_path / "s.onnx"))
    assert [n.op_type for n in smoothed.graph.node].count("Mul") == 2  # the gain, one smoothing
    ref = _run(f, x)
    np.testing.assert_allclose(_run(tmp_path / "s.onnx", x), ref, rtol=1e-4, atol=1e-4)
    plain = _sqnr(ref, _run(_dynamic(f, tmp_path / "q"), x))
    better = _sqnr(ref, _run(_dynamic(tmp_path / "s.onnx", tmp_path / "qs"), x))
    assert better > plain + 6, (plain, better)


def test_shared_or_non_2d_weights_are_left_alone(tmp_path):
    rng = np.random.default_rng(2)
    w = rng.normal(size=(16, 16))
    nodes = [helper.make_node("MatMul", ["x", "w"], ["a"], "m1"),
             helper.make_node("MatMul", ["a", "w"], ["y"], "m2")]  # one weight, two users
    f = _graph(tmp_path / "f.onnx", {"w": w}, nodes, 16, 16)
    assert smoothable(f) == {}


def test_an_even_activation_is_not_smoothed(tmp_path):
    """No channel stands out (outlier ratio ~2): smoothing it gains no bits and would cost a Mul
    on every call, so the graph is left as it was."""
    rng = np.random.default_rng(3)
    hidden = 32
    ws = {"w": rng.normal(scale=0.1, size=(hidden, hidden))}
    f = _graph(tmp_path / "f.onnx", ws, [helper.make_node("MatMul", ["x", "w"], ["y"], "m")],
               hidden, hidden)
    absmax = np.abs(rng.normal(size=(64, hidden))).max(0).astype(np.float32)
    assert outlier_ratio(absmax) < 3
    assert migrate(f, {"x": absmax}, 0.5, tmp_path / "s.onnx") == {}
    assert [n.op_type for n in onnx.load(str(tmp_path / "s.onnx")).graph.node] == ["MatMul"]
