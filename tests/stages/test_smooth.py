"""channel_ranges and smooth: the ranges are each channel's largest magnitude over the calibration
samples, and smoothing moves an outlier channel into the weights without changing the function
the FP32 model computes."""
from __future__ import annotations

import numpy as np

from tests.stages.support import artifact, linear_graph, outputs, run, split


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
