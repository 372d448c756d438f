"""calibrate: activation ranges of the prepared model over the calibration set, streamed batch by
batch, written canonically. The ranges are the data's: each tensor's MinMax range is the
smallest and largest value it takes on the calibration samples.

Its digest covers what quantize reads (the ranges and the set they came from), not what
the stage observed of the machine (peak memory, how many batches it streamed): two calibrations
of the same data that write the same ``calibration.json`` have one digest, and quantize is reused.

On a tiny fixed-shape graph (y = x @ W) through the real runner: MinMax ranges over 16 samples
are the same in batches of 4 or of 8, while the batch count (and the RSS) differ.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tests.stages.support import INT8, artifact, linear_graph, run, split


@dataclass(frozen=True)
class Given:
    """A model file as a stage's output: the parent calibrate and quantize read."""
    source: str
    name = "given"
    version = 1
    hardware_dependent = False

    def run(self, parent, out_dir: Path) -> dict:
        shutil.copyfile(self.source, out_dir / "model.onnx")
        return {}


def _model(path: Path) -> Path:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_two_calibrations_of_the_same_data_share_a_digest_and_quantize_is_reused(tmp_path):
    from pipeline.config import HardwareConfig, ModelConfig
    from pipeline.config.data import DataConfig
    from pipeline.config.metrics import MetricConfig
    from pipeline.models import task
    from pipeline.models.sources import task_key
    from pipeline.engine.runner import Runner
    from pipeline.stages.calibrate import Calibrate
    from pipeline.stages.quantize import Quantize

    rng = np.random.default_rng(0)
    data = tmp_path / "x.jsonl"
    data.write_text("".join(json.dumps({"x": r}) + "\n"
                            for r in rng.standard_normal((24, 4)).round(4).tolist()))
    key = task_key(ModelConfig(name="onnx", path=str(_model(tmp_path / "m.onnx"))),
                   DataConfig(format="jsonl", path=str(data), input_column="x",
                              calibration_samples=16, evaluation_samples=8),
                   MetricConfig(name="agreement"), data_dir=str(tmp_path / "data"))
    split = task(key).split("calibration", 16, str(tmp_path / "data"))
    runner = Runner(tmp_path / "work", HardwareConfig(), log=lambda m: None)
    given = runner.run(Given(str(tmp_path / "m.onnx")))
    by4 = runner.run(Calibrate(split, "minmax", 4), given)
    by8 = runner.run(Calibrate(split, "minmax", 8), given)
    assert by4.key != by8.key  # two stages, two cache entries
    assert ((by4.path / "calibration.json").read_bytes()
            == (by8.path / "calibration.json").read_bytes())
    assert by4.digest == by8.digest
    assert by4.meta["observed"]["chunks"] == 4 and by8.meta["observed"]["chunks"] == 2
    assert by4.meta["observed"]["peak_rss_mb"] > 0  # still reported
    quantize = Quantize(INT8, False, "minmax", None, ())
    first = runner.run(quantize, given, calibration=by4)
    second = runner.run(quantize, given, calibration=by8)
    assert [r["reused"] for r in runner.record[-2:]] == [False, True]
    assert second.path == first.path


def test_minmax_ranges_are_each_tensors_extremes_over_the_calibration_samples(tmp_path):
    from onnxruntime.quantization.calibrate import load_tensors_data

    from pipeline.models import task
    from pipeline.stages.calibrate import Calibrate

    rng = np.random.default_rng(0)
    src = tmp_path / "prepared"
    src.mkdir()
    weights = {"W1": rng.standard_normal((4, 5)), "W2": rng.standard_normal((5, 2))}
    model = linear_graph(src / "model.onnx", weights, [("MatMul", "W1"), ("Relu", ""),
                                                      ("MatMul", "W2")], width=4)
    cal = split(tmp_path, model, rng.standard_normal((24, 4)), "calibration")
    meta = run(Calibrate(cal, "minmax", 5), artifact(src), tmp_path / "cal")
    assert meta["samples"] == 12 and meta["observed"]["chunks"] == 3  # batches of 5, 5 and 2

    x = np.asarray(task(cal.task).dataset(cal)["x"], dtype=np.float32)
    t0 = x @ weights["W1"].astype(np.float32)
    t1 = np.maximum(t0, 0)
    want = {"x": x, "t0": t0, "t1": t1, "y": t1 @ weights["W2"].astype(np.float32)}
    got = load_tensors_data(tmp_path / "cal" / "calibration.json")
    assert set(want) <= set(got.keys())
    for name, values in want.items():
        lo, hi = (float(np.asarray(v).ravel()[0]) for v in got[name].range_value)
        assert (lo, hi) == pytest.approx((values.min(), values.max()), rel=1e-5, abs=1e-6), name


def test_equal_ranges_give_equal_calibration_bytes(tmp_path):
    """Calibrators fill their dict in an order that differs between processes: equal ranges in
    another insertion order must still give the same calibration.json, hence the same digest."""
    import hashlib

    from onnxruntime.quantization.calibrate import (CalibrationMethod, TensorData, TensorsData,
                                                    load_tensors_data, save_tensors_data)

    from pipeline.stages.calibrate import write_ranges

    names = ["conv_out", "relu_out", "image", "lstm_out", "logits"]
    ranges = {n: TensorData(lowest=np.float32(-i - 0.5), highest=np.float32(i + 1.25))
              for i, n in enumerate(names)}
    a = TensorsData(CalibrationMethod.MinMax, dict(ranges))
    b = TensorsData(CalibrationMethod.MinMax, {n: ranges[n] for n in reversed(names)})
    save_tensors_data(a, tmp_path / "ort_a.json")
    save_tensors_data(b, tmp_path / "ort_b.json")
    assert (tmp_path / "ort_a.json").read_bytes() != (tmp_path / "ort_b.json").read_bytes()
    write_ranges(a, tmp_path / "a.json")
    write_ranges(b, tmp_path / "b.json")
    digest = [hashlib.sha256((tmp_path / f).read_bytes()).hexdigest() for f in ("a.json", "b.json")]
    assert digest[0] == digest[1]
    back = load_tensors_data(tmp_path / "b.json")  # still what quantize_static reads
    assert sorted(back.keys()) == sorted(names)
    assert float(back["lstm_out"].range_value[1]) == pytest.approx(4.25)
