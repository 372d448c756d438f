"""fp16: weights and arithmetic in FP16, the interface unchanged: inputs and outputs stay FP32 (a
caller sees no difference) and the op types named to stay FP32 do."""
from __future__ import annotations

import numpy as np

from tests.stages.support import artifact, linear_graph, outputs, run, split


def test_weights_turn_fp16_while_the_interface_and_the_named_ops_stay_fp32(tmp_path):
    import onnx
    from onnx import TensorProto

    from pipeline.config import HardwareConfig
    from pipeline.stages.fp16 import ToFp16

    rng = np.random.default_rng(0)
    src = tmp_path / "fp32"
    src.mkdir()
    weights = {"W1": rng.standard_normal((6, 5)), "W2": rng.standard_normal((5, 3))}
    model = linear_graph(src / "model.onnx", weights, [("MatMul", "W1"), ("Relu", ""),
                                                      ("MatMul", "W2")], width=6)
    rows = rng.standard_normal((8, 6))
    out = tmp_path / "out"
    meta = run(ToFp16(("Relu",), split(tmp_path, model, rows), HardwareConfig()), artifact(src), out)

    converted = onnx.load(str(out / "model.onnx"))
    g = converted.graph
    assert {t.data_type for t in g.initializer} == {TensorProto.FLOAT16}
    assert [v.type.tensor_type.elem_type for v in (*g.input, *g.output)] == [TensorProto.FLOAT] * 2
    assert meta["kept_float32"] == {"Relu": "configured"}
    # the Relu computes in FP32: Casts around it, and its input is cast up to FP32
    casts = [n for n in g.node if n.op_type == "Cast"]
    relu = next(n for n in g.node if n.op_type == "Relu")
    assert any(c.output[0] == relu.input[0] for c in casts)
    assert not list(out.glob("probe*"))  # the per-op probes leave nothing behind
    x = rows[:4].astype(np.float32)
    assert np.allclose(outputs(out / "model.onnx", {"x": x})[0], outputs(model, {"x": x})[0],
                       rtol=1e-2, atol=1e-2)
