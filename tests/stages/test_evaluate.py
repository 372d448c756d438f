"""evaluate: the task's metric of a model on the held-out set, its predictions in data-set order
and the hash over them. A model whose outputs are its inputs (x @ I) is scored by hand: top-1 is
the share of rows whose largest value sits at the label."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tests.stages.support import artifact, rows_file, run, save


def test_top1_of_a_known_model_is_the_hand_counted_share(tmp_path):
    from onnx import TensorProto, helper, numpy_helper

    from pipeline.config import HardwareConfig, ModelConfig
    from pipeline.config.data import DataConfig
    from pipeline.config.metrics import MetricConfig
    from pipeline.metrics.outputs import output_hash
    from pipeline.models import task
    from pipeline.models.sources import task_key
    from pipeline.stages.evaluate import Evaluate

    rng = np.random.default_rng(0)
    src = tmp_path / "fp32"
    src.mkdir()
    model = save(src / "model.onnx", [helper.make_node("MatMul", ["x", "I"], ["y"], name="mm")],
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
                 [numpy_helper.from_array(np.eye(3, dtype=np.float32), "I")])
    rows = rng.standard_normal((40, 3))
    labels = np.where(rng.random(40) < 0.6, rows.argmax(1), (rows.argmax(1) + 1) % 3)
    key = task_key(ModelConfig(name="onnx", path=str(model)),
                   DataConfig(format="jsonl", path=str(rows_file(tmp_path, rows, labels=labels)),
                              input_column="x", calibration_samples=10, evaluation_samples=30),
                   MetricConfig(name="classification"), data_dir=str(tmp_path / "data"))
    t = task(key)
    ev = t.split("evaluation", 30, str(tmp_path / "data"))
    meta = run(Evaluate(ev, 8, HardwareConfig().target()), artifact(src), tmp_path / "eval")

    ds = t.dataset(ev)
    x, y = np.asarray(ds["x"], dtype=np.float32), np.asarray(ds["label"])
    assert meta["samples"] == 30 and 20 < meta["metrics"]["top1"] < 90  # neither all nor none
    assert meta["metrics"]["top1"] == pytest.approx(100.0 * np.mean(x.argmax(1) == y))
    assert "top5" not in meta["metrics"]  # more than the 3 classes: not scored
    predictions = json.loads((tmp_path / "eval" / "predictions.json").read_text())
    assert meta["output_sha256"] == output_hash(predictions)
