"""Tensors that carry an attention-mask sentinel (scores + finfo.min) are kept float by static
INT8: one scale spanning -3.4e38 rounds every real score to 0 and the Softmax goes uniform
(all-mpnet-base-v2 read mean cosine 0.04 against FP16)."""
from __future__ import annotations

import types

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from pipeline.quant.mask_nodes import mask_nodes, sentinel_tensors
from pipeline.stages.calibrate import write_ranges
from pipeline.stages.quantize import Quantize
from tests.stages.support import int8_settings

MIN = float(np.finfo(np.float32).min)


def _model():
    """scores [N, 6] + where(keep, 0, finfo.min) -> Softmax -> MatMul W: masked attention."""
    scores = helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["n", 6])
    keep = helper.make_tensor_value_info("keep", TensorProto.BOOL, ["n", 6])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])
    w = np.random.default_rng(0).normal(size=(6, 3)).astype(np.float32)
    inits = [numpy_helper.from_array(np.array(0, np.float32), "zero"),
             numpy_helper.from_array(np.array(MIN, np.float32), "lowest"),
             numpy_helper.from_array(w, "w")]
    nodes = [helper.make_node("Where", ["keep", "zero", "lowest"], ["mask"], name="Mask"),
             helper.make_node("Add", ["scores", "mask"], ["masked"], name="AddMask"),
             helper.make_node("Softmax", ["masked"], ["probs"], name="Softmax", axis=-1),
             helper.make_node("MatMul", ["probs", "w"], ["y"], name="Value")]
    g = helper.make_graph(nodes, "g", [scores, keep], [y], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def _feeds(n, seed):
    rng = np.random.default_rng(seed)
    keep = np.ones((n, 6), bool)
    keep[:, 4:] = rng.random((n, 2)) < 0.5  # padding at the end, as in a batch
    return {"scores": rng.normal(0, 2, (n, 6)).astype(np.float32), "keep": keep}


def test_the_nodes_around_a_sentinel_range_are_found():
    ranges = {"mask": (MIN, 0.0), "masked": (MIN, 5.0), "probs": (0.0, 1.0),
              "scores": (-1.3e3, 900.0), "y": (-float("inf"), 1.0)}
    # an outlier activation (1.3e3) is not a mask; an infinite range is
    assert sentinel_tensors(ranges) == ["mask", "masked", "y"]
    assert mask_nodes(_model(), ranges) == ["Mask", "AddMask", "Softmax", "Value"]
    assert mask_nodes(_model(), {"mask": (-1e4, 0.0)}) == ["Mask", "AddMask"]  # BERT's -10000
    assert mask_nodes(_model(), {"scores": (-9e3, 9e3)}) == []


def test_static_int8_keeps_the_masked_scores_float(tmp_path):
    from onnxruntime.quantization.calibrate import CalibrationMethod, create_calibrator

    from pipeline.quant.calibration import Feeds

    model = tmp_path / "model.onnx"
    onnx.save(_model(), str(model))
    calibrator = create_calibrator(str(model), None, augmented_model_path=str(tmp_path / "aug.onnx"),
                                   calibrate_method=CalibrationMethod.MinMax)
    calibrator.collect_data(Feeds([_feeds(32, 1)]))
    (tmp_path / "cal").mkdir()
    write_ranges(calibrator.compute_data(), tmp_path / "cal" / "calibration.json")
    # The settings resolved for this CPU (7-bit weights without VNNI): exact on every class,
    # so the error bound below is the rounding's, not the kernels'.
    stage = Quantize(settings=int8_settings(), per_channel=False, method="minmax",
                     static_op_types=None, dynamic_op_types=())
    (tmp_path / "q").mkdir()
    meta = stage.run(types.SimpleNamespace(model=model), tmp_path / "q",
                     types.SimpleNamespace(path=tmp_path / "cal", meta={"calibration_set": "t"}))
    feeds = _feeds(32, 1)  # the calibration set: ranges that cover it
    ref = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = ort.InferenceSession(str(tmp_path / "q" / "model.onnx"),
                               providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    # Quantized with the sentinel's scale, every kept score is 0 and the attention uniform:
    # the error is then of the order of W itself (~1); kept float, only W's 7- or 8-bit and the
    # probabilities' 8-bit rounding remain.
    assert np.abs(got - ref).max() < 0.05, np.abs(got - ref).max()
    assert {"Mask", "AddMask", "Softmax"} <= set(meta["mask_nodes"])
    assert meta["precision"]["AddMask"] == "float" and meta["precision"]["Softmax"] == "float"
