"""weight_only: the MatMuls a plan names get their weights in 4 or 8 bits (onnxruntime's
MatMulNBits), each with its planned width; a MatMul the plan does not name stays float."""
from __future__ import annotations

import numpy as np

from tests.stages.support import artifact, linear_graph, outputs, run


def test_planned_matmuls_become_matmulnbits_and_the_others_stay_float(tmp_path):
    import onnx
    from onnx import TensorProto

    from pipeline.stages.weight_only import WeightOnly

    rng = np.random.default_rng(0)
    src = tmp_path / "fp32"
    src.mkdir()
    weights = {f"W{k}": rng.standard_normal((64, 64)) * 0.1 for k in range(3)}
    model = linear_graph(src / "model.onnx", weights, [("MatMul", "W0"), ("MatMul", "W1"),
                                                      ("MatMul", "W2")], width=64)
    meta = run(WeightOnly((("matmul0", 4), ("matmul2", 8)), 32, True, "rtn", 0),
               artifact(src), tmp_path / "wo")
    assert meta["matmul_bits"] == {"4": 1, "8": 1} and meta["matmul_float"] == 1

    g = onnx.load(str(tmp_path / "wo" / "model.onnx")).graph  # weights in model.onnx.data
    bits = {n.name: next((a.i for a in n.attribute if a.name == "bits"), None)
            for n in g.node if n.op_type == "MatMulNBits"}
    assert bits == {"matmul0_Q4": 4, "matmul2_Q8": 8}  # onnxruntime names them by their width
    assert [n.name for n in g.node if n.op_type == "MatMul"] == ["matmul1"]
    w1 = next(i for i in g.initializer if i.name == "W1")
    assert w1.data_type == TensorProto.FLOAT
    x = rng.standard_normal((2, 64)).astype(np.float32)
    want = outputs(model, {"x": x})[0]
    got = outputs(tmp_path / "wo" / "model.onnx", {"x": x})[0]
    assert np.abs(got - want).max() < 0.1 * np.abs(want).max()  # 4 bits: close, not equal
