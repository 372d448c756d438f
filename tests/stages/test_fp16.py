"""fp16: weights and arithmetic in FP16, the interface unchanged: inputs and outputs stay FP32 (a
caller sees no difference) and the op types named to stay FP32 do."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.stages.support import artifact, linear_graph, outputs, run, split


def test_weights_turn_fp16_while_the_interface_and_the_named_ops_stay_fp32(tmp_path):
    import onnx
    from onnx import TensorProto

    from pipeline.config import HardwareConfig
    from pipeline.stages.fp16 import ToFp16

    rng = np.random.default_rng(0)
    src = tmp_path / "fp32"
    src.mkdir()
    weights = {"W1": rng.standard_normal((6, 5)), "W2": rng.standard_normal((5, 3))}
    model = linear_graph(src / "model.onnx", weights, [("MatMul", "W1"), ("Relu", ""),
                                                      ("MatMul", "W2")], width=6)
    rows = rng.standard_normal((8, 6))
    out = tmp_path / "out"
    meta = run(ToFp16(("Relu",), split(tmp_path, model, rows), HardwareConfig()), artifact(src), out)

    converted = onnx.load(str(out / "model.onnx"))
    g = converted.graph
    assert {t.data_type for t in g.initializer} == {TensorProto.FLOAT16}
    assert [v.type.tensor_type.elem_type for v in (*g.input, *g.output)] == [TensorProto.FLOAT] * 2
    assert meta["kept_float32"] == {"Relu": "configured"}
    # the Relu computes in FP32: Casts around it, and its input is cast up to FP32
    casts = [n for n in g.node if n.op_type == "Cast"]
    relu = next(n for n in g.node if n.op_type == "Relu")
    assert any(c.output[0] == relu.input[0] for c in casts)
    assert not list(out.glob("probe*"))  # the per-op probes leave nothing behind
    x = rows[:4].astype(np.float32)
    assert np.allclose(outputs(out / "model.onnx", {"x": x})[0], outputs(model, {"x": x})[0],
                       rtol=1e-2, atol=1e-2)


def _if_graph(path):
    """x [batch, 4] through one of two MatMuls, chosen by an If on the sign of its sum (the
    control flow silero-vad wraps its whole network in)."""
    from onnx import TensorProto, helper, numpy_helper

    from tests.stages.support import save

    def branch(name, scale):
        return helper.make_graph(
            [helper.make_node("MatMul", ["x", f"w_{name}"], [f"y_{name}"])], name, [],
            [helper.make_tensor_value_info(f"y_{name}", TensorProto.FLOAT, ["batch", 4])],
            [numpy_helper.from_array(np.full((4, 4), scale, np.float32), f"w_{name}")])

    return save(path, [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
                       helper.make_node("Greater", ["s", "zero"], ["c"]),
                       helper.make_node("If", ["c"], ["y"], then_branch=branch("a", 0.5),
                                        else_branch=branch("b", -0.5))],
                [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
                [numpy_helper.from_array(np.float32(0), "zero")], opset=13)


def _with_a_failing_converter(src, out, data):
    """The stage with onnxruntime's converter failing on the whole model as it does on
    silero-vad's nested If branches ("Graph attribute inferencing failed"), per-op probes left
    as they are; in a child process, as the runner runs stages."""
    from pipeline.config import HardwareConfig
    from pipeline.stages import fp16

    real = fp16._convert

    def fails_on_the_whole_model(model, dst, block):
        if dst.name == "model.onnx":
            raise RuntimeError("Node (If_0) Op (If) [TypeInferenceError] Graph attribute "
                               "inferencing failed")
        real(model, dst, block)

    fp16._convert = fails_on_the_whole_model
    out.mkdir(parents=True, exist_ok=True)
    return fp16.ToFp16((), data, HardwareConfig()).run(artifact(src), out)


def test_where_control_flow_defeats_the_converter_fp32_stands_in(tmp_path):
    """The converter's failure is played (the real one needs silero's graph): a graph with
    control flow gets the FP32 model as its baseline, saying why, where that failure had ended
    every run at this stage; a graph without control flow still fails the stage."""
    import pytest

    from pipeline.core import isolate
    from pipeline.core.errors import StageError

    rng = np.random.default_rng(0)
    src = tmp_path / "fp32"
    src.mkdir()
    model = _if_graph(src / "model.onnx")
    rows = rng.standard_normal((8, 4))
    meta = isolate.call("fp16", _with_a_failing_converter, src, tmp_path / "out",
                        split(tmp_path, model, rows))
    assert "Graph attribute inferencing failed" in meta["stand_in"]
    assert "If subgraphs; the FP32 model stands in" in meta["stand_in"]
    assert (tmp_path / "out" / "model.onnx").read_bytes() == model.read_bytes()
    plain = tmp_path / "plain"
    plain.mkdir()
    mlp = linear_graph(plain / "model.onnx", {"W": rng.standard_normal((4, 4))},
                       [("MatMul", "W")], width=4)
    (tmp_path / "p").mkdir()
    with pytest.raises(StageError, match="TypeInferenceError"):
        isolate.call("fp16", _with_a_failing_converter, plain, tmp_path / "out2",
                     split(tmp_path / "p", mlp, rows))


def _bisect_against(culprits: dict, ops: set, configured: dict, together=(), always=None):
    """``_culprits`` on ``ops`` with the conversions recorded, not done, and a graph that fails
    when an op type of ``culprits`` (op type: why) is converted, or all of ``together`` are, or
    ``always``; returns what it found and how many graphs were tried, the whole one included."""
    from pipeline.stages import fp16

    tried = []

    def convert(_src, _dst, block):
        tried.append(ops - set(block))

    def fails(_path):
        bad = sorted(tried[-1] & set(culprits))
        if always or bad:
            return always or culprits[bad[0]]
        return "together" if together and set(together) <= tried[-1] else None

    real, fp16._convert = fp16._convert, convert
    try:
        convert(None, None, list(configured))  # the whole graph, as the stage tries it first
        whole = fails(None)
        assert whole, "the cases here all fail whole"
        return fp16._culprits(Path("m"), Path("p"), ops, configured, whole, fails), len(tried)
    finally:
        fp16._convert = real


OPS = {"Add", "Cast", "Concat", "Conv", "Expand", "Gather", "LSTM", "MatMul", "MaxPool", "Mul",
       "Relu", "Reshape", "Shape", "Slice", "Squeeze", "Transpose"}


def test_the_op_type_that_fails_in_fp16_is_found_in_a_few_tries():
    """The OCR network's op types, its LSTM configured and its Transpose crashing: found by
    halving, in far fewer tries than one per op type, with the reason its try gave."""
    found, tries = _bisect_against({"Transpose": "crashed (SIGSEGV)"}, OPS, {"LSTM": "configured"})
    assert found == {"Transpose": "crashed (SIGSEGV)"}
    assert tries <= 7 < len(OPS)  # the whole graph, nothing converted, 4 halvings, the rest


def test_every_culprit_is_kept_and_a_failing_pair_loses_one_member():
    found, _ = _bisect_against({"Conv": "a", "Slice": "b", "Add": "c"}, OPS, {})
    assert found == {"Add": "c", "Conv": "a", "Slice": "b"}
    # two op types that fail only together: one stays FP32, and the other converts
    found, _ = _bisect_against({}, OPS, {}, together=("Gather", "Mul"))
    assert len(found) == 1 and set(found) <= {"Gather", "Mul"}


def test_a_graph_that_fails_with_nothing_converted_blames_no_op_type():
    """The converter itself breaks it (control flow): no op type is kept for it, and the stage
    is told (it stands the FP32 model in where the graph has control flow)."""
    import pytest

    from pipeline.core.errors import StageError

    with pytest.raises(StageError, match="every op type kept in FP32: broken"):
        _bisect_against({}, OPS, {}, always="broken")
