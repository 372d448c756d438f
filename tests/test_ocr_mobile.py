"""The mobile OCR task (MobileNetV3-style network) and the quantization logic it needed: names
for the nodes ONNX Runtime inlines, precision of nodes kept float, fused activations charged to
the kernel FP32 fuses them into."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

import onnx
import pytest
from onnx import TensorProto, helper

from pipeline.models import module
from pipeline.models.ocr import mobile as ocr_mobile
from pipeline.models.ocr.decode import score

CHECKPOINT = Path(__file__).resolve().parent.parent / "pipeline/models/checkpoints/ocr_mobile.safetensors"
TINY = ([8, 8, 16, 16, 16], 16)


def test_mobile_network_keeps_the_ctc_contract():
    import torch

    from pipeline.models.ocr.net import NUM_CLASSES
    from pipeline.models.ocr.train import network

    assert module("ocr_mobile") is ocr_mobile and ocr_mobile.dataset is module("ocr").dataset
    net = ocr_mobile.build_network(*TINY)
    with torch.inference_mode():
        out = net(torch.from_numpy(ocr_mobile.example_input(batch=3, width=96)))
    assert tuple(out.shape) == (3, 96 // 4, NUM_CLASSES)
    kinds = {type(m).__name__ for m in net.modules()}
    assert {"Hardswish", "Hardsigmoid", "SqueezeExcite", "InvertedResidual"} <= kinds
    depthwise = [m for m in net.modules() if isinstance(m, torch.nn.Conv2d) and m.groups > 1]
    assert depthwise and all(m.groups == m.in_channels for m in depthwise)
    # The training script builds the same network (same parameters) for --task ocr_mobile.
    trained = network("ocr_mobile", *TINY)
    assert sum(p.numel() for p in trained.parameters()) == sum(p.numel() for p in net.parameters())


def _stage(name: str, workdir: Path) -> dict:
    """One stage on the tiny mobile network, as the runner does it (each in its own child)."""
    from pipeline.config import HardwareConfig
    from pipeline.stages.export import Export
    from pipeline.stages.load import Load
    from pipeline.stages.optimize import Optimize

    from pipeline.models import task
    from pipeline.stages.load import params_key

    hw, data, out = HardwareConfig().target(), str(workdir / "data"), workdir / name
    out.mkdir()
    if name == "load":
        params = params_key({"widths": list(TINY[0]), "hidden": TINY[1]})
        return Load("ocr_mobile", None, None, params).run(None, out)
    split = task("ocr_mobile").split("evaluation", 4, data)
    if name == "export":
        return Export("ocr_mobile", 18, split, hw).run(SimpleNamespace(path=workdir / "load"), out)
    return Optimize(split, hw).run(
        SimpleNamespace(model=workdir / "export" / "model.onnx"), out)


@pytest.mark.slow
def test_export_keeps_mobile_ops_and_optimize_names_what_onnxruntime_inlines(tmp_path):
    from pipeline.core import isolate

    _, exported, optimized = (isolate.call(f"{k} ocr_mobile", _stage, k, tmp_path)
                              for k in ("load", "export", "optimize"))
    # The dynamo export keeps the ops as ops (GlobalAveragePool via torch.onnx.ops.symbolic),
    # and its output matches torch (the stage checks parity).
    assert {"HardSwish", "HardSigmoid", "GlobalAveragePool", "Conv", "LSTM"} <= set(exported["nodes"])
    # ONNX Runtime has no HardSwish kernel and inlines it (HardSigmoid, Mul) with empty names;
    # the optimize stage names them after the module, so they can be profiled and kept float.
    graph = onnx.load(str(tmp_path / "optimize" / "model.onnx")).graph
    names = [n.name for n in graph.node]
    assert all(names) and len(set(names)) == len(names)
    ops = {n.name: n.op_type for n in graph.node}
    assert ops.get("blocks.2.dw.2") == "Mul" and ops.get("blocks.2.dw.2/HardSigmoid") == "HardSigmoid"
    assert optimized["modules"]["blocks.2.dw.2"] == "Mul"


@pytest.mark.slow
def test_mobile_checkpoint_matches_its_card_and_reads_held_out_lines(tmp_path):
    import torch
    from safetensors.torch import load_file

    card = json.loads(CHECKPOINT.with_suffix(".json").read_text())
    assert hashlib.sha256(CHECKPOINT.read_bytes()).hexdigest() == card["sha256"]
    assert CHECKPOINT.stat().st_size < 5e6 and card["task"] == "ocr_mobile"
    assert "ocr_train --task ocr_mobile" in card["command"]
    from pipeline.engine.compose import compose

    m = compose(["model=ocr_mobile"]).model
    assert (list(m.params["widths"]), m.params["hidden"]) == (card["widths"], card["hidden"])
    net = ocr_mobile.build_network(card["widths"], card["hidden"], load_file(str(CHECKPOINT)))
    ds, _ = ocr_mobile.dataset("evaluation", 300, tmp_path)
    preds, labels = [], []
    with torch.inference_mode():
        for _, images, texts in ocr_mobile.batches(ds, 50):
            preds += ocr_mobile.decode(net(torch.from_numpy(images)).numpy())
            labels += texts
    assert score(preds, labels)["sequence_accuracy"] >= 96.0


def _save(tmp_path: Path, name: str, nodes, inputs=("x",), outputs=("y",)) -> Path:
    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in inputs]
    vo = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs]
    path = tmp_path / f"{name}.onnx"
    onnx.save(helper.make_model(helper.make_graph(nodes, name, vi, vo)), str(path))
    return path


def _qdq(tensor: str) -> list:
    return [helper.make_node("QuantizeLinear", [tensor, "s", "z"], [f"{tensor}_q"],
                             name=f"{tensor}_QuantizeLinear"),
            helper.make_node("DequantizeLinear", [f"{tensor}_q", "s", "z"], [f"{tensor}_dq"],
                             name=f"{tensor}_DequantizeLinear")]


def test_precision_needs_every_input_dequantized_and_an_int8_kernel(tmp_path):
    from pipeline.stages.quantize import precisions

    n = helper.make_node
    path = _save(tmp_path, "q", [
        *_qdq("x"), *_qdq("w"),
        n("Conv", ["x_dq", "w_dq"], ["c"], name="conv"), *_qdq("c"),
        # HardSwish kept float: DQ -> HardSigmoid -> Mul(DQ, float) -> Q
        n("HardSigmoid", ["c_dq"], ["h"], name="act/HardSigmoid"), *_qdq("h"),
        n("Mul", ["c_dq", "h"], ["m"], name="act"), *_qdq("m"),
        # an excluded conv between INT8 neighbours: weights float, so it runs in float
        n("Conv", ["m_dq", "w2"], ["y"], name="float_conv"), *_qdq("y"),
    ])
    p = precisions(path)
    assert p["conv"] == "int8-static"
    assert p["act"] == "float"                    # one input is not dequantized
    assert p["act/HardSigmoid"] == "float"        # no INT8 kernel, even between DQ and Q
    assert p["float_conv"] == "float"


def test_fused_activation_is_charged_to_the_conv_fp32_fuses_it_into(tmp_path):
    from pipeline.measure.profile import fusion_groups

    n = helper.make_node
    fp32 = _save(tmp_path, "f", [
        n("Conv", ["x", "w"], ["c"], name="conv"),
        n("HardSigmoid", ["c"], ["h"], name="act/HardSigmoid"),
        n("Mul", ["c", "h"], ["m"], name="act"),
        n("Conv", ["m", "w2"], ["y"], name="next"),
    ])
    int8 = _save(tmp_path, "i", [*_qdq("c"), *_qdq("h"), *_qdq("m"), *_qdq("y")])
    f32 = {"conv": {"op": "Conv", "ms": 1.0}, "next": {"op": "Conv", "ms": 1.0}}
    i8 = {"conv": {"op": "QLinearConv", "ms": 0.4}, "act": {"op": "QLinearMul", "ms": 0.5},
          "act/HardSigmoid": {"op": "HardSigmoid", "ms": 0.2}, "next": {"op": "QLinearConv", "ms": 0.3},
          "c_DequantizeLinear": {"op": "DequantizeLinear", "ms": 0.1},
          "h_QuantizeLinear": {"op": "QuantizeLinear", "ms": 0.1}}
    g = fusion_groups(fp32, int8, f32, i8)
    assert g["host"] == {"act": "conv", "act/HardSigmoid": "conv"}
    assert g["members"] == {"conv": ["act", "act/HardSigmoid"]}
    # The conv alone is 2.5x faster in INT8; with its activation and the Q/DQ around it, slower.
    assert g["int8_ms"]["conv"] == pytest.approx(0.4 + 0.5 + 0.2 + 0.1 + 0.1)
    assert g["fp32_ms"]["conv"] == 1.0 and "next" not in g["int8_ms"]


def test_no_fusion_groups_without_fused_nodes(tmp_path):
    from pipeline.measure.profile import fusion_groups

    fp32 = _save(tmp_path, "f", [helper.make_node("Conv", ["x", "w"], ["y"], name="conv")])
    g = fusion_groups(fp32, fp32, {"conv": {"op": "Conv", "ms": 1.0}},
                      {"conv": {"op": "QLinearConv", "ms": 0.5},
                       "x_QuantizeLinear": {"op": "QuantizeLinear", "ms": 0.1}})
    assert g == {"host": {}, "members": {}, "int8_ms": {}, "fp32_ms": {}}
