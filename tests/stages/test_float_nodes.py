"""float_nodes: an INT8 model with some nodes handed back to float by editing its QDQ graph, as
quantize_static with those nodes excluded would have made it (the same nodes, scales and
outputs), reported as a quantize stage reports its model; ops that read only a shape are no
hand-back candidates."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from pipeline.stages.float_nodes import edit
from tests.stages.support import (INT8, artifact, mlp_graph, outputs, qdq_scales, run,
                                  run_unoptimized, split, static_qdq)

def _net(seed: int = 0):
    """x -> conv1 -> relu1 -> maxpool -> conv2 -> relu2 -> conv3 -> add(relu2) -> conv4 -> y."""
    rng = np.random.default_rng(seed)
    inits, nodes = [], []

    def conv(name, x, cin, cout, out):
        inits.append(numpy_helper.from_array(rng.normal(0, 0.3, (cout, cin, 3, 3)).astype(np.float32), f"{name}.weight"))
        inits.append(numpy_helper.from_array(rng.normal(0, 0.1, cout).astype(np.float32), f"{name}.bias"))
        nodes.append(helper.make_node("Conv", [x, f"{name}.weight", f"{name}.bias"], [out], name=name,
                                      pads=[1, 1, 1, 1]))

    conv("conv1", "x", 3, 8, "c1")
    nodes.append(helper.make_node("Relu", ["c1"], ["r1"], name="relu1"))
    nodes.append(helper.make_node("MaxPool", ["r1"], ["p1"], name="pool", kernel_shape=[2, 2], strides=[2, 2]))
    conv("conv2", "p1", 8, 8, "c2")
    nodes.append(helper.make_node("Relu", ["c2"], ["r2"], name="relu2"))
    conv("conv3", "r2", 8, 8, "c3")
    nodes.append(helper.make_node("Add", ["c3", "r2"], ["a3"], name="add"))
    conv("conv4", "a3", 8, 4, "y")
    graph = helper.make_graph(nodes, "net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 4, 4, 4])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])



@pytest.mark.parametrize("group", [{"conv1", "relu1", "pool"}, {"conv2", "relu2"}, {"conv3", "add"}, {"conv4"},
                                   {"conv1", "relu1", "pool", "conv2"}])
def test_an_edited_int8_model_equals_the_requantized_one(tmp_path, group):
    """Floating a group by editing the all-INT8 QDQ graph gives what quantize_static with that
    group excluded gives: the same nodes, the same scales, the same outputs."""
    src = tmp_path / "float.onnx"
    onnx.save(_net(), str(src))
    all_int8 = static_qdq(src, tmp_path / "int8.onnx", set())
    want = static_qdq(src, tmp_path / "want.onnx", group)
    got = edit(all_int8, onnx.load(str(src)), set(group), set())
    assert sorted((n.name, n.op_type) for n in got.graph.node) == \
        sorted((n.name, n.op_type) for n in want.graph.node)
    assert qdq_scales(got) == qdq_scales(want)
    onnx.checker.check_model(got)
    x = np.random.default_rng(7).normal(size=(3, 3, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(run_unoptimized(got, x), run_unoptimized(want, x), atol=1e-6, rtol=0)


def test_the_stage_reports_a_handed_back_node_as_quantize_reports_an_excluded_one(tmp_path):
    """The stage's model and record equal those of a quantize stage that excluded the node."""
    from pipeline.stages.calibrate import Calibrate
    from pipeline.stages.float_nodes import FloatNodes
    from pipeline.stages.quantize import Quantize

    rng = np.random.default_rng(0)
    src = tmp_path / "prepared"
    model = mlp_graph(src, rng, 6, 5, 3)
    cal = split(tmp_path, model, rng.standard_normal((16, 6)), "calibration")
    ranges = artifact(tmp_path / "cal", "calibrate",
                      **run(Calibrate(cal, "minmax", 4), artifact(src), tmp_path / "cal"))
    int8 = {}
    for name, exclude in (("all", ()), ("excluded", ("matmul2",))):
        meta = run(Quantize(INT8, True, "minmax", ("MatMul",), (), exclude), artifact(src),
                   tmp_path / name, calibration=ranges)
        int8[name] = artifact(tmp_path / name, "quantize", **meta)
    assert int8["all"].meta["precision"]["matmul2"] == "int8-static"

    meta = run(FloatNodes(("matmul2",), ("MatMul",)), int8["all"], tmp_path / "edited",
               prepared=artifact(src))
    want = int8["excluded"].meta
    for k in ("precision", "excluded", "onnxruntime_disabled_optimizers", "nodes", "qdq_pairs"):
        assert meta[k] == want[k], k
    assert meta["precision"]["matmul2"] == "float"
    x = rng.standard_normal((4, 6)).astype(np.float32)
    assert np.allclose(outputs(tmp_path / "edited" / "model.onnx", {"x": x})[0],
                       outputs(tmp_path / "excluded" / "model.onnx", {"x": x})[0], atol=1e-6)


def test_an_op_that_reads_only_a_shape_is_no_hand_back_candidate():
    """A Shape of a dequantized tensor reads no values: floating it changes nothing, so it is no
    candidate (on the OCR model it was a block of its own)."""
    from pipeline.stages.float_nodes import handback_candidates

    inits = [numpy_helper.from_array(np.array(0.1, np.float32), "s"),
             numpy_helper.from_array(np.array(128, np.uint8), "z")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="q"),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"], name="dq"),
             helper.make_node("Shape", ["xd"], ["shape"], name="shape"),
             helper.make_node("Softmax", ["xd"], ["y"], name="softmax")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("shape", TensorProto.INT64, [2]),
                               helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], inits)
    order, closure = handback_candidates(graph, {})
    assert order == ["softmax"] and closure == {"softmax": ("softmax",)}
