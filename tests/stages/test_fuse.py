"""fuse: onnxruntime.transformers fuses a transformer's subgraphs into its contrib ops, counts each
fusion, and the fused graph computes what the export did (within the stage's tolerance)."""
from __future__ import annotations

import numpy as np

from tests.stages.support import artifact, outputs, run, save, split

SEQ, HIDDEN = 4, 8


def _layernorm_then_linear(folder, rng):
    """x [batch, 4, 8] -> LayerNorm written out op by op, as exporters write it -> MatMul."""
    from onnx import TensorProto, helper, numpy_helper

    c = {"two": np.float32(2.0), "eps": np.float32(1e-5),
         "gamma": rng.uniform(0.5, 1.5, HIDDEN).astype(np.float32),
         "beta": rng.standard_normal(HIDDEN).astype(np.float32),
         "W": rng.standard_normal((HIDDEN, HIDDEN)).astype(np.float32)}
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in c.items()]
    n = helper.make_node
    nodes = [n("ReduceMean", ["x"], ["mean"], axes=[-1], name="mean"),
             n("Sub", ["x", "mean"], ["centred"], name="sub"),
             n("Pow", ["centred", "two"], ["sq"], name="pow"),
             n("ReduceMean", ["sq"], ["var"], axes=[-1], name="var"),
             n("Add", ["var", "eps"], ["var_eps"], name="add_eps"),
             n("Sqrt", ["var_eps"], ["std"], name="sqrt"),
             n("Div", ["centred", "std"], ["normed"], name="div"),
             n("Mul", ["normed", "gamma"], ["scaled"], name="mul_gamma"),
             n("Add", ["scaled", "beta"], ["ln"], name="add_beta"),
             n("MatMul", ["ln", "W"], ["y"], name="linear")]
    io = [helper.make_tensor_value_info(k, TensorProto.FLOAT, ["batch", SEQ, HIDDEN]) for k in "xy"]
    return save(folder / "model.onnx", nodes, io[:1], io[1:], inits)


def test_the_fused_graph_is_smaller_and_computes_the_same(tmp_path):
    from pipeline.config import HardwareConfig
    from pipeline.stages.fuse import Fuse

    rng = np.random.default_rng(0)
    src = tmp_path / "export"
    src.mkdir()
    model = _layernorm_then_linear(src, rng)
    rows = rng.standard_normal((8, SEQ, HIDDEN))
    meta = run(Fuse(split(tmp_path, model, rows), "bert", 2, HIDDEN, HardwareConfig()),
               artifact(src), tmp_path / "fused")
    assert meta["fusions"] == {"LayerNormalization": 1}
    assert sum(meta["nodes_before"].values()) == 10 and meta["nodes"] == {"LayerNormalization": 1,
                                                                            "MatMul": 1}
    assert meta["parity_vs_export"]["max_abs_diff"] <= 1e-3
    x = rows.astype(np.float32)
    assert np.allclose(outputs(tmp_path / "fused" / "model.onnx", {"x": x})[0],
                       outputs(model, {"x": x})[0], atol=1e-4)
