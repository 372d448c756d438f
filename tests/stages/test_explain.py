"""explain: a per-node profile of the INT8 model against FP32 on one real batch, with what ONNX
Runtime makes of the QDQ graph. No timing verdict: only that each node the quantizer made INT8
is profiled under its own name, with the FP32 op it replaced and the INT8 kernel it runs as."""
from __future__ import annotations

import json

import numpy as np

from tests.stages.support import INT8, artifact, mlp_graph, run, split

def test_each_int8_node_is_profiled_beside_the_fp32_op_it_replaced(tmp_path):
    from pipeline.config import HardwareConfig
    from pipeline.stages.calibrate import Calibrate
    from pipeline.stages.explain import Explain
    from pipeline.stages.quantize import Quantize

    rng = np.random.default_rng(0)
    src = tmp_path / "fp32"
    model = mlp_graph(src, rng, 32, 32, 8)
    rows = rng.standard_normal((32, 32))
    cal = split(tmp_path, model, rows, "calibration")
    ranges = artifact(tmp_path / "cal", "calibrate",
                      **run(Calibrate(cal, "minmax", 8), artifact(src), tmp_path / "cal"))
    qmeta = run(Quantize(INT8, True, "minmax", ("MatMul",), ()), artifact(src),
                tmp_path / "int8", calibration=ranges)
    meta = run(Explain(split(tmp_path, model, rows), 4, 3, HardwareConfig().target()),
               artifact(tmp_path / "int8", "quantize", **qmeta), tmp_path / "explain",
               fp32=artifact(src))
    rows = {r["node"]: r for r in meta["nodes"]}
    for name in ("matmul0", "matmul2"):
        assert qmeta["precision"][name] == rows[name]["precision"] == "int8-static"
        assert (rows[name]["fp32_op"], rows[name]["int8_op"]) == ("MatMul", "QLinearMatMul")
    assert meta["int8_kernels"] == ["QLinearMatMul"]
    # only nodes the quantizer made INT8 can be handed back to float
    assert set(meta["slower_in_int8"]) <= {"matmul0", "matmul2"}
    assert json.loads((tmp_path / "explain" / "explain.json").read_text()) == meta
