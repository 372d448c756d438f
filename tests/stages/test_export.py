"""export: the torch network as ONNX with the dynamic axes the task declares, named by their
meaning, so the model runs at batch sizes the export's example never had; and the same bytes
wherever the checkout lies (torch's per-node stack traces, which name this checkout's files, are
not kept). One export of a tiny torch factory, shared by the tests."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.stages.support import artifact, mlp, outputs, run, torch_key


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(the export's folder, its stage record, the rows of the data set)."""
    from pipeline.config import HardwareConfig
    from pipeline.models import task
    from pipeline.stages.export import Export
    from pipeline.stages.load import Load

    tmp = tmp_path_factory.mktemp("export")
    rows = np.random.default_rng(0).standard_normal((8, 6))
    key = torch_key(tmp, rows)
    (tmp / "load").mkdir()
    Load(key, None, None).run(None, tmp / "load")
    meta = run(Export(key, 18, task(key).split("evaluation", 4, str(tmp / "data")),
                      HardwareConfig().target()), artifact(tmp / "load", "load"), tmp / "export")
    return tmp / "export", meta, rows


@pytest.mark.slow  # seconds: out of make test-fast's edit loop
def test_the_declared_batch_axis_is_named_and_dynamic(exported):
    import onnx
    import torch

    folder, meta, rows = exported
    assert meta["opset"] == 18 and meta["parity_vs_torch"]["max_abs_diff"] <= 1e-3
    graph = onnx.load(str(folder / "model.onnx")).graph
    dims = [[d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in (*graph.input, *graph.output)]
    assert dims == [["batch", 6], ["batch", 3]]
    x = rows[:5].astype(np.float32)  # the export's example had 2 rows
    with torch.inference_mode():
        want = mlp()(torch.from_numpy(x)).numpy()
    assert np.allclose(outputs(folder / "model.onnx", {"x": x})[0], want, atol=1e-5)


def test_the_export_names_no_file_of_this_checkout(exported):
    import onnx

    folder, meta, _ = exported
    model = onnx.load(str(folder / "model.onnx"))
    root = str(Path(__file__).resolve().parents[2])  # the factory lies in tests/stages/support.py
    texts = [p.value for n in model.graph.node for p in n.metadata_props]
    assert model.graph.node and not [v for v in texts if root in v]
    assert meta["parity_vs_torch"]  # still checked against torch
