"""Triton export: the model repository layout, config.pbtxt from the ONNX signature and the
evidence, idempotence, version numbering, atomicity and the gate rule."""
from __future__ import annotations

import json
import re

import pytest

from pipeline.config import RegistryConfig
from pipeline.registry import publish
from tests.registry_support import candidate, evidence, make_model, registry_cli


@pytest.mark.slow
def test_export_layout_and_config(tmp_path):
    root, repo = tmp_path / "store", tmp_path / "model_repository"
    first = make_model(tmp_path / "a.onnx", seed=1)
    cfg = RegistryConfig(root=str(root))
    pa = publish(cfg, model_name="ocr", mode="int8", candidate=candidate(first),
                 manifest=evidence())
    r = f"registry.root={root}"
    proc = registry_cli("export-triton", f"ocr:{pa.version}", "--out", repo, r)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*")) == [
        "ocr", "ocr/1", "ocr/1/manifest.json", "ocr/1/model.onnx", "ocr/1/registry.json",
        "ocr/config.pbtxt"]
    assert (repo / "ocr/1/model.onnx").read_bytes() == first.read_bytes()
    assert json.loads((repo / "ocr/1/registry.json").read_text())["digest"] == pa.digest
    text = (repo / "ocr/config.pbtxt").read_text()
    assert 'name: "ocr"' in text and 'platform: "onnxruntime_onnx"' in text
    assert "max_batch_size: 8" in text  # the largest benchmarked batch
    assert re.search(r'name: "image"\s+data_type: TYPE_FP32\s+dims: \[ 1, 32, -1 \]', text)
    assert re.search(r'name: "logits"\s+data_type: TYPE_FP32\s+dims: \[ 1, 32, -1 \]', text)
    assert re.search(r"dynamic_batching \{\s+preferred_batch_size: \[ 8 \]", text)
    assert re.search(r"instance_group \[\s+\{\s+count: 1\s+kind: KIND_CPU", text)
    assert 'key: "intra_op_thread_count"' in text and 'string_value: "2"' in text
    assert text.count("{") == text.count("}") and text.count("[") == text.count("]")

    # the same digest again: nothing new; another version: the next integer folder
    assert registry_cli("export-triton", f"ocr:{pa.version}", "--out", repo, r).returncode == 0
    second = make_model(tmp_path / "b.onnx", seed=2)
    pb = publish(cfg, model_name="ocr", mode="int8", candidate=candidate(second),
                 manifest=evidence())
    assert registry_cli("promote", f"ocr:{pb.version}", "production", r).returncode == 0
    proc = registry_cli("export-triton", "ocr:production", "--out", repo, "--instances", "2",
                        "--max-batch-size", "4", r)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in (repo / "ocr").iterdir()) == ["1", "2", "config.pbtxt"]
    assert (repo / "ocr/2/model.onnx").read_bytes() == second.read_bytes()
    text = (repo / "ocr/config.pbtxt").read_text()
    assert "max_batch_size: 4" in text and "count: 2" in text
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left


def test_export_refuses_a_failed_gate_unless_forced(tmp_path):
    root, repo = tmp_path / "store", tmp_path / "model_repository"
    bad = publish(RegistryConfig(root=str(root)), model_name="ocr", mode="int8",
                  candidate=candidate(make_model(tmp_path / "a.onnx", seed=3)),
                  manifest=evidence(passed=False))
    r = f"registry.root={root}"
    proc = registry_cli("export-triton", f"ocr:{bad.version}", "--out", repo, r)
    assert proc.returncode == 1 and "gate did not pass" in proc.stderr and not repo.exists()
    proc = registry_cli("export-triton", f"ocr:{bad.version}", "--out", repo, "--force", r)
    assert proc.returncode == 0 and (repo / "ocr/1/model.onnx").exists()
