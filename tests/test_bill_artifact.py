"""The ONNX bill: parameters, FLOPs, activations and roofline of real and hand-built graphs.

The tiny OCR network (``model=ocr_tiny``) is exported here with torch's TorchScript exporter (one
second, where the pipeline's dynamo export takes tens); the pipeline's own artifacts are checked
in the end-to-end test at the bottom, on the shared tiny run.
"""
from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from pipeline.bill import artifact_bill, markdown
from pipeline.bill.onnx_cost import analyse
from pipeline.engine.compose import compose
from pipeline.core.errors import ConfigError
from tests.conftest import session_run

SAMPLE = [1, 32, 164]
BATCH = 8


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(network, exported ONNX path, conv output shapes at BATCH x SAMPLE)."""
    import torch

    from pipeline.models.ocr import crnn as ocr

    m = compose(["model=ocr_tiny"]).model
    net = ocr.build_network(m.params["widths"], m.params["hidden"])
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # distinct BatchNorm values: the exporter merges identical initializers
        for mod in net.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                for t in (mod.weight, mod.bias, mod.running_mean):
                    t.copy_(torch.randn(t.shape, generator=gen))
                mod.running_var.copy_(torch.rand(mod.running_var.shape, generator=gen) + 0.5)
    convs = []
    hooks = [mod.register_forward_hook(lambda mod, i, o: convs.append((mod, tuple(o.shape))))
             for mod in net.modules() if isinstance(mod, torch.nn.Conv2d)]
    with torch.no_grad():
        net(torch.zeros(BATCH, *SAMPLE))
    for h in hooks:
        h.remove()
    path = tmp_path_factory.mktemp("bill") / "tiny.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (torch.zeros(2, *ocr.example_input(1).shape[1:]),), str(path),
                          dynamo=False, opset_version=18, do_constant_folding=False,
                          input_names=["image"], output_names=["logits"],
                          dynamic_axes={"image": {0: "batch", 3: "width"}})
    return net, path, convs


def test_parameter_count_equals_the_networks(tiny):
    net, path, _ = tiny
    b = artifact_bill(path, BATCH, SAMPLE, compose().hardware)
    assert b.parameters == sum(p.numel() for p in net.parameters())
    buffers = sum(mod.running_mean.numel() + mod.running_var.numel() for mod in net.modules()
                  if hasattr(mod, "running_mean") and mod.running_mean is not None)
    assert b.excluded_constants == {"batchnorm statistics": buffers}
    assert b.parameter_bytes_by_dtype == {"fp32": 4.0 * b.parameters}


def test_macs_follow_the_layer_formulas(tiny):
    net, path, convs = tiny
    b = analyse(path, BATCH, SAMPLE)
    conv = sum(math.prod(out) * mod.in_channels * math.prod(mod.kernel_size) for mod, out in convs)
    assert b["by_op"]["Conv"]["macs"] == conv
    steps, hidden, size = SAMPLE[-1] // 4, net.rnn.hidden_size, net.rnn.input_size
    lstm = steps * BATCH * 2 * 4 * hidden * (size + hidden)
    assert b["by_op"]["LSTM"]["macs"] == lstm
    head = BATCH * steps * net.head.in_features * net.head.out_features
    assert b["by_op"]["MatMul"]["macs"] == head
    assert b["macs"] == conv + lstm + head and b["flops"] >= 2 * b["macs"]
    assert b["outputs"]["logits"] == (BATCH, steps, net.head.out_features)
    assert b["unknown_shape_count"] == 0 and not b["uncounted"]


def test_activations_roofline_and_batch_scaling(tiny):
    _, path, _ = tiny
    hw = compose(["hardware.memory_bandwidth_gbs=10", "hardware.peak_tflops.fp32=0.1"]).hardware
    one, eight = artifact_bill(path, 1, SAMPLE, hw), artifact_bill(path, 8, SAMPLE, hw)
    assert eight.flops == pytest.approx(8 * one.flops)
    a = eight.activations
    assert 0 < a.largest_bytes <= a.peak_bytes <= a.total_bytes + a.io_bytes
    assert a.io_bytes == 4 * (8 * math.prod(SAMPLE) + math.prod(eight.outputs["logits"]))
    r = eight.roofline
    assert r.compute_ms == pytest.approx(1e3 * eight.flops / 0.1e12)
    assert r.memory_ms == pytest.approx(1e3 * eight.compulsory_bytes / 10e9)
    assert r.bound_ms == max(r.compute_ms, r.memory_ms) <= r.unfused_ms
    assert r.intensity_flop_per_byte == pytest.approx(eight.flops / eight.compulsory_bytes)
    assert eight.fits is True and r.bound_by in ("compute", "memory")
    assert r.ridge_flop_per_byte == pytest.approx(0.1e12 / 10e9) and r.peaks_missing is None
    # the record's JSON (report.json, `pipeline.bill --json`) has the keys the bill always had
    from pipeline.core.json_record import to_json

    data = to_json(eight)
    assert data["roofline"]["bound_ms"] == r.bound_ms and data["activations"]["peak_bytes"] > 0
    assert data["measured_p50_ms"] is None and data["memory_bytes"] == eight.memory_bytes


def test_dynamic_input_without_a_shape_is_a_config_error(tiny):
    _, path, _ = tiny
    with pytest.raises(ConfigError, match="dynamic sizes"):
        analyse(path, BATCH, None)
    with pytest.raises(ConfigError, match="give the 3 after the batch"):
        analyse(path, BATCH, [32, 164])


def test_the_size_the_benchmark_fed_reaches_every_input_sharing_its_dimension(tmp_path):
    """A model with no representative sample (a user's file, an encoder) is billed at the size
    the benchmark fed its dynamic axis; a second input declaring the same symbolic dimension
    (an attention mask beside the ids) takes it too, and the cost follows the size."""
    nodes = [helper.make_node("Add", ["a", "b"], ["y"])]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", "sequence"])
              for n in ("a", "b")]
    path = tmp_path / "two.onnx"
    onnx.save(_model(nodes, inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                                    None)], []), path)
    with pytest.raises(ConfigError, match="dynamic sizes"):
        analyse(path, 2, None)
    short, long = analyse(path, 2, None, ("a", 1, 16)), analyse(path, 2, None, ("a", 1, 64))
    assert short["inputs"] == {"a": [2, 16], "b": [2, 16]} and long["inputs"]["b"] == [2, 64]
    assert long["flops"] == 4 * short["flops"] > 0


def test_an_unnamed_dynamic_axis_the_data_held_at_one_size_is_billed_at_it(tmp_path):
    """PaddleOCR's recognizer declares its height as "?" beside a dynamic width; every line the
    benchmark fed was 48 high, so the bill takes 48 there (it stopped on the "?" before)."""
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, None, "w"])]
    path = tmp_path / "rec.onnx"
    onnx.save(_model(nodes, inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                                    None)], []), path)
    with pytest.raises(ConfigError, match=r"dynamic sizes \['\?'\]"):
        analyse(path, 2, None, ("x", 3, 320))
    assert analyse(path, 2, None, [("x", 3, 320), ("x", 2, 48)])["inputs"] == {
        "x": [2, 3, 48, 320]}
    # Paddle2ONNX writes a dynamic batch as -1: billed at the batch asked, not refused as a
    # "fixed batch of -1" (its text-direction classifier)
    minus = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, 48, 192])]
    onnx.save(_model(nodes, minus, [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                                                   None)], []), path)
    assert analyse(path, 8, None)["inputs"] == {"x": [8, 3, 48, 192]}


def _model(nodes, inputs, outputs, inits, opset=18):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def test_quantized_weights_are_parameters_scales_are_not(tmp_path):
    w = numpy_helper.from_array(np.ones((16, 8, 3, 3), np.int8), "w_q")
    ws = numpy_helper.from_array(np.full(16, 0.1, np.float32), "w_scale")
    wz = numpy_helper.from_array(np.zeros(16, np.int8), "w_zp")
    xs = numpy_helper.from_array(np.array(0.02, np.float32), "x_scale")
    xz = numpy_helper.from_array(np.array(128, np.uint8), "x_zp")
    nodes = [helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zp"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "x_scale", "x_zp"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zp"], ["wd"], axis=0),
             helper.make_node("Conv", ["xd", "wd"], ["y"], pads=[1, 1, 1, 1])]
    m = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8, 10, 10])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w, ws, wz, xs, xz])
    path = tmp_path / "qdq.onnx"
    onnx.save(m, path)
    b = analyse(path, 2, [8, 10, 10])
    assert b["parameters"] == 16 * 8 * 9 and b["parameters_by_dtype"] == {"int8": 16 * 8 * 9}
    assert b["excluded_constants"] == {"quantization scales and zero points": 16 + 16 + 1 + 1}
    conv = next(o for o in b["ops"] if o["op"] == "Conv")
    assert conv["precision"] == "int8" and conv["macs"] == 2 * 16 * 10 * 10 * 8 * 9
    # The fused kernel reads the int8 input and weights and writes float32 output.
    assert conv["bytes"] == 2 * 8 * 100 * 1 + 16 * 8 * 9 + 2 * 16 * 100 * 4


def test_gemm_and_attention(tmp_path):
    wt = numpy_helper.from_array(np.ones((64, 32), np.float32), "wt")  # [N, K], transB
    gemm = _model([helper.make_node("Gemm", ["x", "wt"], ["y"], transB=1)],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 32])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [wt])
    onnx.save(gemm, tmp_path / "gemm.onnx")
    assert analyse(tmp_path / "gemm.onnx", 4, [32])["macs"] == 4 * 64 * 32
    q = helper.make_tensor_value_info("q", TensorProto.FLOAT, ["B", 16, 4 * 8])
    k = helper.make_tensor_value_info("k", TensorProto.FLOAT, [2, 24, 2 * 8])
    v = helper.make_tensor_value_info("v", TensorProto.FLOAT, [2, 24, 2 * 8])
    att = _model([helper.make_node("Attention", ["q", "k", "v"], ["o"], q_num_heads=4,
                                   kv_num_heads=2)], [q, k, v],
                 [helper.make_tensor_value_info("o", TensorProto.FLOAT, None)], [], opset=23)
    onnx.save(att, tmp_path / "att.onnx")
    b = analyse(tmp_path / "att.onnx", 2, [16, 32])
    assert b["by_op"]["Attention"]["macs"] == 2 * 4 * 16 * 24 * (8 + 8)


@pytest.mark.slow
def test_every_pipeline_report_has_a_bill(tiny_run):
    """The real pipeline's artifacts (dynamo export, optimized, FP16, INT8) at the gate's batch."""
    report = json.loads((session_run(tiny_run) / "report.json").read_text())
    bill = report["bill"]
    load = json.loads((Path(report["lineage"]["source"]["path"]) / "artifact.json").read_text())
    assert bill["source_parameters"] == load["meta"]["parameters"]
    assert bill["models"]["export"]["parameters"] == load["meta"]["parameters"]
    assert set(bill["models"]) == {"export", "fp32", "fp16", "candidate"}
    assert bill["batch"] == report["config"]["gate"]["speedup_batch_size"]
    cand = bill["models"]["candidate"]
    assert "int8" in cand["parameters_by_dtype"] and cand["roofline"]["bound_ms"] > 0
    assert cand["measured_p50_ms"] == report["rows"][-1]["latency"][str(bill["batch"])]["p50"]
    assert cand["measured_over_bound"] == pytest.approx(
        cand["measured_p50_ms"] / cand["roofline"]["bound_ms"])
    assert bill["capacity"]["options"]
    md = (session_run(tiny_run) / "report.md").read_text()
    assert "## Bill" in md and "roofline ms" in md and "measured p50 ms" in md
    assert markdown(bill).startswith("## Bill")
    # a runtime that beat the floor: the peak figures are wrong, and the page says so
    beaten = {**bill, "models": {**bill["models"], "candidate": {**cand,
                                                                 "measured_over_bound": 0.7}}}
    assert "**Measured faster than the roofline:** candidate (0.70x)" in markdown(beaten)
    floors = {**bill, "models": {k: {**b, "measured_over_bound": 1.5}
                                 for k, b in bill["models"].items()}}
    assert "Measured faster than the roofline" not in markdown(floors)


def test_integer_kernels_and_fused_attention_are_counted(tmp_path):
    """A dynamic INT8 MatMul (its int8 weight read by the integer kernel itself, no
    DequantizeLinear) counts its weight as a parameter and its product as work; ONNX Runtime's
    fused BERT attention counts the packed Q/K/V projection and QK^T and AV. Both read 0 before."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    w = numpy_helper.from_array(np.ones((16, 8), np.float32), "w")
    m = _model([helper.make_node("MatMul", ["x", "w"], ["y"])],
               [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, 16])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w], opset=17)
    onnx.save(m, tmp_path / "f.onnx")
    quantize_dynamic(str(tmp_path / "f.onnx"), str(tmp_path / "q.onnx"),
                     weight_type=QuantType.QInt8)
    b = analyse(tmp_path / "q.onnx", 2, [4, 16])
    assert b["parameters_by_dtype"].get("int8") == 16 * 8
    assert b["macs"] >= 2 * 4 * 16 * 8

    nodes = [helper.make_node("Attention", ["x", "w", "b"], ["y"], domain="com.microsoft",
                              num_heads=2)]
    inits = [numpy_helper.from_array(np.ones((8, 24), np.float32), "w"),
             numpy_helper.from_array(np.zeros(24, np.float32), "b")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                     ["N", 4, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    fused = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                                helper.make_opsetid("com.microsoft", 1)])
    onnx.save(fused, tmp_path / "attention.onnx")
    a = analyse(tmp_path / "attention.onnx", 1, [4, 8])
    # [1, 4, 8] x [8, 24], then QK^T and AV: 2 x 4 x 4 x 8
    assert a["macs"] == 1 * 4 * 8 * 24 + 2 * 4 * 4 * 8


def test_the_parameter_line_says_why_the_count_moved():
    from pipeline.bill.render import _parameters_line

    assert "(equal)" in _parameters_line(10, 10, 9) and "BatchNorm" in _parameters_line(10, 10, 9)
    moved = _parameters_line(35584, 34752, 36800)  # a BERT: unused pooler, packed Q/K/V
    assert "832 the exported forward never reads" in moved and "BatchNorm" not in moved
    assert "fused attention" in moved and "(unchanged)" in _parameters_line(5, 5, 5)
