"""model=hf on a tiny random MPNet (relative position bias in the attention scores): the
pipeline's own attention fusion is built for the export too, timed against the attention left as
exported, and kept, in the FP32 baseline and in the INT8 candidate, exactly when it was faster."""
from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from tests.conftest import run_cli, skip_without
from tests.test_hf import DATA, FAST

skip_without("transformers")
LAYERS = 2


def _ops(path: Path) -> set:
    return {n.op_type for n in onnx.load(str(path / "model.onnx"), load_external_data=False).graph.node}


@pytest.mark.cli
def test_attention_fusion_is_kept_only_where_it_was_timed_faster(tmp_path):
    from pipeline.stages.fuse import UNFUSED_BY_CHOICE
    from tests import hf_tiny

    folder = hf_tiny.mpnet(tmp_path / "mpnet", layers=LAYERS)
    data = hf_tiny.text_data(tmp_path / "text.jsonl", 80)
    proc = run_cli("model=hf", f"model.path={folder}", *DATA, f"data.path={data}",
                   "metric=agreement", "quant=dynamic", "gate.max_accuracy_drop=1",
                   f"workdir={tmp_path / 'run'}", f"data_dir={tmp_path / 'run' / 'data'}", *FAST)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    rep = json.loads((tmp_path / "run" / "runs" / "latest" / "report.json").read_text())
    stages = {s["label"]: s for s in rep["stages"]}
    assert "attention[export]" in stages and "compare[attention]" in stages, list(stages)
    assert "MultiHeadAttention" in _ops(Path(stages["attention[export]"]["path"]))
    meta = json.loads((Path(stages["compare[attention]"]["path"]) / "artifact.json").read_text())
    pays = meta["meta"]["a_over_b_speedup"]["ci95"][0] > 1.0
    fp32 = Path(rep["lineage"]["fp32"]["path"])
    attention = json.loads((fp32 / "artifact.json").read_text())["meta"]["attention"]
    if pays:
        assert attention["fused"] == LAYERS and "fuse[attention off]" not in stages
    else:
        assert attention == {"fused": 0, "why_not": UNFUSED_BY_CHOICE, "parity": None}
        assert stages["fuse[attention off]"]["path"] == str(fp32)
    for role in ("fp32", "candidate"):
        assert ("MultiHeadAttention" in _ops(Path(rep["lineage"][role]["path"]))) == pays, role
