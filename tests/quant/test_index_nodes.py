"""Float ops that compute integer positions are kept float by static INT8 (MPNet's relative
position buckets: quantized, the cast indices read garbage and the Gather failed the run)."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from pipeline.quant.index_nodes import index_nodes


def _model():
    """x [N, T, 4] -> x + table[bucket(t)] @ W, with bucket(t) = int(log(t + 1) * 2) computed
    in float, as exporters write it; ``Scale`` feeds both the index path and the output."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", "t", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", "t", 4])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, None)
    inits = [numpy_helper.from_array(np.ones((8, 4), np.float32), "table"),
             numpy_helper.from_array(np.eye(4, dtype=np.float32), "w"),
             numpy_helper.from_array(np.array(1, np.int64), "one"),
             numpy_helper.from_array(np.array(0, np.int64), "zero"),
             numpy_helper.from_array(np.array(1, np.int64), "axis"),
             numpy_helper.from_array(np.array(2.0, np.float32), "two")]
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"], name="Shape"),
        helper.make_node("Gather", ["shape", "axis"], ["t"], name="T"),
        helper.make_node("Range", ["zero", "t", "one"], ["pos"], name="Range"),
        helper.make_node("Cast", ["pos"], ["posf"], name="ToFloat", to=TensorProto.FLOAT),
        helper.make_node("Add", ["posf", "two"], ["p1"], name="Shift"),
        helper.make_node("Log", ["p1"], ["lg"], name="Log"),
        helper.make_node("Mul", ["lg", "two"], ["sc"], name="Scale"),
        helper.make_node("Cast", ["sc"], ["bucket"], name="ToIndex", to=TensorProto.INT64),
        helper.make_node("Gather", ["table", "bucket"], ["bias"], name="Bias"),
        helper.make_node("Add", ["x", "bias"], ["h"], name="AddBias"),
        helper.make_node("MatMul", ["h", "w"], ["y"], name="Proj"),
        helper.make_node("Mul", ["lg", "two"], ["z"], name="Exposed"),  # a graph output
    ]
    g = helper.make_graph(nodes, "g", [x], [y, z], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def test_only_the_float_part_of_an_index_computation_is_found():
    found = index_nodes(_model())
    # Log also feeds a graph output (Exposed): it is an activation, so neither it nor what feeds
    # it is excluded; Scale only feeds the cast to int64.
    assert found == ["Scale"]
    m = _model()
    del m.graph.output[1]
    del m.graph.node[-1]
    assert index_nodes(m) == ["Shape", "T", "Range", "ToFloat", "Shift", "Log", "Scale"]
    assert "Proj" not in index_nodes(m) and "AddBias" not in index_nodes(m)
