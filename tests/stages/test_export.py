"""export: the network as ONNX, the same bytes wherever the checkout lies (torch's per-node stack
traces, which name this checkout's files, are not kept)."""
from __future__ import annotations

from pathlib import Path


def test_the_export_names_no_file_of_this_checkout(tmp_path):
    import onnx

    from pipeline.config import HardwareConfig
    from pipeline.engine.runner import Runner
    from pipeline.models import task
    from pipeline.stages.export import Export
    from pipeline.stages.load import Load, params_key

    tiny = {"widths": [8, 8, 16, 16, 16], "hidden": 16}  # conf/model/ocr_tiny.yaml's network
    t = task("ocr")
    runner = Runner(str(tmp_path / "work"), HardwareConfig().target())
    loaded = runner.run(Load(task="ocr", checkpoint=None, checkpoint_sha256=None,
                             params=params_key(tiny)))
    exported = runner.run(Export(task="ocr", opset=18,
                                 data=t.split("evaluation", 4, str(tmp_path / "data")),
                                 hardware=HardwareConfig().target()), loaded)
    model = onnx.load(str(exported.path / "model.onnx"))
    root = str(Path(__file__).resolve().parents[2])
    texts = [p.value for n in model.graph.node for p in n.metadata_props]
    assert model.graph.node and not [v for v in texts if root in v]
    assert exported.meta["parity_vs_torch"]  # still checked against torch
