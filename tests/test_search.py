"""The mixed-precision search at scale: group ranking, edited QDQ variants, cheap signals, the
time budget and its progress lines."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from pipeline.stages.float_nodes import edit


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


class _Reader:
    def __init__(self, seed=1):
        self.batches = iter([{"x": np.random.default_rng(seed + k).normal(size=(2, 3, 8, 8)).astype(np.float32)}
                             for k in range(4)])

    def get_next(self):
        return next(self.batches, None)


def _quantize(src, dst, exclude):
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    quantize_static(str(src), str(dst), _Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    weight_type=QuantType.QInt8, activation_type=QuantType.QUInt8,
                    nodes_to_exclude=sorted(exclude),
                    extra_options={"WeightSymmetric": True, "ActivationSymmetric": False})
    return onnx.load(str(dst))


def _scales(model) -> dict:
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    return {n.name: inits[n.input[1]].tolist() for n in model.graph.node
            if n.op_type in ("QuantizeLinear", "DequantizeLinear") and n.input[1] in inits}


def _run(model, x):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


@pytest.mark.parametrize("group", [{"conv1", "relu1", "pool"}, {"conv2", "relu2"}, {"conv3", "add"}, {"conv4"},
                                   {"conv1", "relu1", "pool", "conv2"}])
def test_an_edited_int8_model_equals_the_requantized_one(tmp_path, group):
    """Floating a group by editing the all-INT8 QDQ graph gives what quantize_static with that
    group excluded gives: the same nodes, the same scales, the same outputs."""
    src = tmp_path / "float.onnx"
    onnx.save(_net(), str(src))
    all_int8 = _quantize(src, tmp_path / "int8.onnx", set())
    want = _quantize(src, tmp_path / "want.onnx", group)
    got = edit(all_int8, onnx.load(str(src)), set(group), set())
    assert sorted((n.name, n.op_type) for n in got.graph.node) == \
        sorted((n.name, n.op_type) for n in want.graph.node)
    assert _scales(got) == _scales(want)
    onnx.checker.check_model(got)
    x = np.random.default_rng(7).normal(size=(3, 3, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(_run(got, x), _run(want, x), atol=1e-6, rtol=0)

