"""import: a user's ONNX file taken in as the export would have made it. A file below opset 13 is
upgraded (per-channel QDQ needs 13) by onnx's version converter, and the upgraded model computes
what the file as given does."""
from __future__ import annotations

import numpy as np

from tests.stages.support import outputs, run, save, split


def test_an_opset_12_file_is_upgraded_to_13_and_keeps_its_outputs(tmp_path):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from pipeline.config import HardwareConfig
    from pipeline.models.files import onnx_digest
    from pipeline.stages.import_onnx import ImportOnnx

    rng = np.random.default_rng(0)
    n = helper.make_node
    # Unsqueeze and Squeeze read their axes from an attribute up to opset 12, from an input after
    nodes = [n("Unsqueeze", ["x"], ["x3"], axes=[1], name="unsqueeze"),
             n("MatMul", ["x3", "W"], ["y3"], name="mm"),
             n("Squeeze", ["y3"], ["y"], axes=[1], name="squeeze")]
    given = save(tmp_path / "given.onnx", nodes,
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
                 [numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "W")],
                 opset=12)
    rows = rng.standard_normal((16, 4))
    ev = split(tmp_path, given, rows)
    meta = run(ImportOnnx(ev.task, str(given), onnx_digest(given), ev, HardwareConfig().target()),
               None, tmp_path / "import")
    assert (meta["opset_given"], meta["opset"]) == (12, 13)
    assert meta["parity_vs_file"]["max_abs_diff"] <= 1e-5 and meta["parity_vs_file"]["samples"] == 8

    taken = onnx.load(str(tmp_path / "import" / "model.onnx"))
    assert [len(nd.input) for nd in taken.graph.node if nd.op_type in ("Unsqueeze", "Squeeze")] == [2, 2]
    x = rows.astype(np.float32)
    assert np.allclose(outputs(tmp_path / "import" / "model.onnx", {"x": x})[0],
                       outputs(given, {"x": x})[0], atol=1e-6)
