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


def test_a_quantized_models_own_optimizer_settings_are_honoured(tmp_path):
    """A QDQ model whose metadata tells ONNX Runtime to leave QDQ propagation off (the pipeline's
    own INT8 models with float regions, read back as a user's file) keeps its Q/DQ where they
    are: the propagation that would hoist the Q above the MaxPool (a slow uint8 pool) is not
    baked into the optimized file. The same model without that metadata does get it, which is
    what ONNX Runtime would do at load anyway."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from pipeline.config import HardwareConfig
    from pipeline.runtimes.onnxruntime import DISABLED_OPTIMIZERS
    from pipeline.stages.optimize import Optimize
    from tests.stages.support import static_qdq

    rng = np.random.default_rng(0)
    n = helper.make_node
    nodes = [n("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="first"),
             n("Relu", ["c1"], ["r"], name="relu"),
             n("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
             n("Conv", ["p", "w2"], ["y"], pads=[1, 1, 1, 1], name="second")]
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), k)
             for k, s in (("w1", (4, 3, 3, 3)), ("w2", (4, 4, 3, 3)))]
    float_model = save(tmp_path / "float.onnx", nodes,
                       [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 8, 8])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4, 4, 4])],
                       inits)
    rows = rng.standard_normal((8, 3, 8, 8))
    counts = {}
    for keep in (True, False):
        src = tmp_path / f"given-{keep}"
        src.mkdir()
        m = static_qdq(float_model, src / "model.onnx", exclude={"first"})
        if keep:
            helper.set_model_props(m, {DISABLED_OPTIMIZERS: "QDQPropagationTransformer"})
        onnx.save(m, str(src / "model.onnx"))
        meta = run(Optimize(split(tmp_path, src / "model.onnx", rows),
                            HardwareConfig().target()), artifact(src), tmp_path / f"opt-{keep}")
        counts[keep] = (meta["nodes_before"]["QuantizeLinear"], meta["nodes"]["QuantizeLinear"])
        assert meta["parity_vs_export"]["max_abs_diff"] <= 1e-3
    assert counts[True][1] == counts[True][0], counts  # left where the file put them
    assert counts[False][1] > counts[False][0], counts  # propagated: what the setting prevents
