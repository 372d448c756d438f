"""optimize: constant folding and fusion saved as a portable ONNX model: a BatchNormalization is
folded into the Conv before it, and the model computes what the export did."""
from __future__ import annotations

import numpy as np

from tests.stages.support import artifact, outputs, run, save, split


def test_batchnorm_is_folded_into_the_conv_and_the_outputs_stay(tmp_path):
    from onnx import TensorProto, helper, numpy_helper

    from pipeline.config import HardwareConfig
    from pipeline.stages.optimize import Optimize

    rng = np.random.default_rng(0)
    c = {"W": rng.standard_normal((4, 2, 3, 3)), "B": rng.standard_normal(4),
         "scale": rng.uniform(0.5, 2, 4), "bias": rng.standard_normal(4),
         "mean": rng.standard_normal(4), "var": rng.uniform(0.5, 2, 4)}
    n = helper.make_node
    nodes = [n("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             n("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["bn"], name="bn"),
             n("Relu", ["bn"], ["y"], name="relu")]
    src = tmp_path / "export"
    src.mkdir()
    model = save(src / "model.onnx", nodes,
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2, 5, 5])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4, 5, 5])],
                 [numpy_helper.from_array(v.astype(np.float32), k) for k, v in c.items()])
    rows = rng.standard_normal((8, 2, 5, 5))
    meta = run(Optimize(split(tmp_path, model, rows), HardwareConfig().target()), artifact(src),
               tmp_path / "optimized")
    assert meta["nodes_before"] == {"BatchNormalization": 1, "Conv": 1, "Relu": 1}
    assert meta["nodes"] == {"Conv": 1, "Relu": 1}
    assert meta["parity_vs_export"]["max_abs_diff"] <= 1e-4
    x = rows.astype(np.float32)
    assert np.allclose(outputs(tmp_path / "optimized" / "model.onnx", {"x": x})[0],
                       outputs(model, {"x": x})[0], atol=1e-4)
