"""channel_ranges and smooth: the ranges are each channel's largest magnitude over the calibration
samples, and smoothing moves an outlier channel into the weights without changing the function
the FP32 model computes. On graphs like a transformer's token-wise MatMuls: which activations
are smoothable (one unshared 2-D weight per reader), that the migration gains dynamic INT8
accuracy (signal-to-quantization-noise ratio against the float graph), and that an even
activation is left alone."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from pipeline.stages.smooth import migrate, outlier_ratio, smoothable
from tests.stages.support import (artifact, dynamic_int8, linear_graph, outputs, run, split,
                                  sqnr_db, token_graph)


def test_smoothing_evens_the_channels_and_keeps_the_function(tmp_path):
    from pipeline.stages.smooth import ChannelRanges, Smooth, load_ranges

    rng = np.random.default_rng(0)
    src = tmp_path / "prepared"
    src.mkdir()
    model = linear_graph(src / "model.onnx", {"W": rng.standard_normal((8, 4))},
                         [("Relu", ""), ("MatMul", "W")], width=8)
    rows = np.abs(rng.standard_normal((16, 8)))
    rows[:, 3] *= 60.0  # one outlier channel, as a transformer's LayerNorm output has
    cal = split(tmp_path, model, rows, "calibration")

    ranges_meta = run(ChannelRanges(cal, 4), artifact(src), tmp_path / "ranges")
    ranges = load_ranges(tmp_path / "ranges")
    assert list(ranges) == ["t0"] and ranges_meta["samples"] == 8
    from pipeline.models import task

    seen = np.abs(np.asarray(task(cal.task).dataset(cal)["x"], dtype=np.float32))
    assert np.allclose(ranges["t0"], seen.max(axis=0), rtol=1e-4)  # the calibration rows' maxima

    meta = run(Smooth(0.5), artifact(src), tmp_path / "smoothed",
               ranges=artifact(tmp_path / "ranges", "channel_ranges"))
    record = meta["smoothed"]["t0"]
    assert record["outlier_ratio"] > 20 and record["outlier_ratio_after"] < record["outlier_ratio"] / 4
    x = rows.astype(np.float32)
    assert np.allclose(outputs(tmp_path / "smoothed" / "model.onnx", {"x": x})[0],
                       outputs(model, {"x": x})[0], rtol=1e-4, atol=1e-4)


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
    f = token_graph(tmp_path / "f.onnx", ws, nodes, hidden, hidden)
    assert smoothable(f) == {"h": ["wq", "wk", "wv"]}
    calib = rng.normal(size=(8, 12, hidden)).astype(np.float32)
    x = rng.normal(size=(8, 12, hidden)).astype(np.float32)
    absmax = np.abs(calib * ws["gain"].astype(np.float32)).reshape(-1, hidden).max(0)
    assert outlier_ratio(absmax) > 30
    record = migrate(f, {"h": absmax}, 0.5, tmp_path / "s.onnx")
    assert record["h"]["outlier_ratio_after"] < record["h"]["outlier_ratio"] / 4
    smoothed = onnx.load(str(tmp_path / "s.onnx"))
    assert [n.op_type for n in smoothed.graph.node].count("Mul") == 2  # the gain, one smoothing
    ref = outputs(f, {"x": x})[0]
    np.testing.assert_allclose(outputs(tmp_path / "s.onnx", {"x": x})[0], ref, rtol=1e-4, atol=1e-4)
    plain = sqnr_db(ref, outputs(dynamic_int8(f, tmp_path / "q"), {"x": x})[0])
    better = sqnr_db(ref, outputs(dynamic_int8(tmp_path / "s.onnx", tmp_path / "qs"), {"x": x})[0])
    assert better > plain + 6, (plain, better)


def test_shared_or_non_2d_weights_are_left_alone(tmp_path):
    rng = np.random.default_rng(2)
    w = rng.normal(size=(16, 16))
    nodes = [helper.make_node("MatMul", ["x", "w"], ["a"], "m1"),
             helper.make_node("MatMul", ["a", "w"], ["y"], "m2")]  # one weight, two users
    f = token_graph(tmp_path / "f.onnx", {"w": w}, nodes, 16, 16)
    assert smoothable(f) == {}


def test_an_even_activation_is_not_smoothed(tmp_path):
    """No channel stands out (outlier ratio ~2): smoothing it gains no bits and would cost a Mul
    on every call, so the graph is left as it was."""
    rng = np.random.default_rng(3)
    hidden = 32
    ws = {"w": rng.normal(scale=0.1, size=(hidden, hidden))}
    f = token_graph(tmp_path / "f.onnx", ws, [helper.make_node("MatMul", ["x", "w"], ["y"], "m")],
               hidden, hidden)
    absmax = np.abs(rng.normal(size=(64, hidden))).max(0).astype(np.float32)
    assert outlier_ratio(absmax) < 3
    assert migrate(f, {"x": absmax}, 0.5, tmp_path / "s.onnx") == {}
    assert [n.op_type for n in onnx.load(str(tmp_path / "s.onnx")).graph.node] == ["MatMul"]
