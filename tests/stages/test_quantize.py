"""quantize: INT8 from the prepared float model with onnxruntime.quantization. Static QDQ where
asked (the weighted ops read DequantizeLinear of INT8 weights and activations), the named nodes
left float, and dynamic INT8 of token-wise MatMuls with weights per output channel.

Each test builds a small ONNX graph with ``onnx.helper`` and runs the real stage on it, as the
INT8 recipe does."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from pipeline.stages.quantize import Quantize
from tests.stages.support import (INT8, artifact, dynamic_int8, exact_dynamic_matmul,
                                  mlp_graph, outputs, run, save, split, sqnr_db, token_graph)

def test_weighted_ops_get_qdq_and_an_excluded_node_stays_float(tmp_path):
    from pipeline.stages.calibrate import Calibrate

    rng = np.random.default_rng(0)
    src = tmp_path / "prepared"
    model = mlp_graph(src, rng, 6, 5, 3)
    cal = split(tmp_path, model, rng.standard_normal((16, 6)), "calibration")
    cmeta = run(Calibrate(cal, "minmax", 4), artifact(src), tmp_path / "cal")
    meta = run(Quantize(INT8, True, "minmax", ("MatMul",), (), exclude=("matmul2",)),
               artifact(src), tmp_path / "int8",
               calibration=artifact(tmp_path / "cal", "calibrate", **cmeta))
    assert meta["precision"] == {"matmul0": "int8-static", "relu1": "float", "matmul2": "float"}

    g = onnx.load(str(tmp_path / "int8" / "model.onnx")).graph
    producer = {o: n for n in g.node for o in n.output}
    inits = {i.name: i for i in g.initializer}
    node = {n.name: n for n in g.node}
    x, w = (producer[t] for t in node["matmul0"].input)
    assert x.op_type == w.op_type == "DequantizeLinear"
    assert inits[w.input[0]].data_type == TensorProto.INT8  # the weight is stored in 8 bits
    assert producer[x.input[0]].op_type == "QuantizeLinear"  # the activation is quantized
    assert node["matmul2"].input[1] == "W2" and inits["W2"].data_type == TensorProto.FLOAT
    assert meta["onnxruntime_disabled_optimizers"] == ["QDQPropagationTransformer"]


def test_dynamic_weights_are_quantized_per_output_channel(tmp_path):
    rng = np.random.default_rng(0)
    w = rng.normal(size=(32, 16))
    w[:, 0] *= 100  # one output column a hundred times the others: a per-tensor scale crushes them
    f = token_graph(tmp_path / "f.onnx", {"w": w}, [helper.make_node("MatMul", ["x", "w"], ["y"], "mm")],
               32, 16)
    x = rng.normal(size=(4, 10, 32)).astype(np.float32)
    ref = outputs(f, {"x": x})[0]
    q = dynamic_int8(f, tmp_path / "q")
    y = outputs(q, {"x": x})[0]
    # the small columns keep their precision: per-tensor weights give them under 3 bits (~14 dB)
    assert sqnr_db(ref[..., 1:], y[..., 1:]) > 30
    counts = {n.op_type for n in onnx.load(str(q)).graph.node}
    assert counts & {"DynamicQuantizeLinear", "DynamicQuantizeMatMul", "MatMulInteger"}


def test_the_resolved_weight_range_multiplies_exactly(tmp_path, isa):
    """Dynamic INT8 with the settings resolved for the CPU (``dynamic_int8``: 7-bit weights
    without VNNI/AMX) gives ONNX Runtime's u8 x s8 MatMul the exact integer product, recomputed
    here from the model's own quantized weights and scales. The inputs are the worst case for
    AVX2's vpmaddubsw: activations near 255 times positive weights near the top of their range,
    so full-range weights' pair sums (2 x 255 x 127) overflow its 16-bit saturation and come
    out about half what they should; 7-bit ones (2 x 255 x 64) fit. ``isa`` runs it natively and
    with an AVX2 machine's settings (the cap); only a real AVX2 machine runs the saturating
    kernels themselves (ONNX Runtime's MLAS dispatches on cpuid, not on the caps): there, a
    resolve that kept full-range weights fails this test (docs/cpus.md)."""
    from onnx import numpy_helper

    from pipeline.core.env import effective_flags
    from pipeline.quant.defaults import VNNI_FLAGS

    rng = np.random.default_rng(0)
    w = rng.uniform(0.9, 1.0, size=(64, 16))  # per output channel every weight within 10% of max
    f = token_graph(tmp_path / "f.onnx", {"w": w},
                    [helper.make_node("MatMul", ["x", "w"], ["y"], "mm")], 64, 16)
    q = dynamic_int8(f, tmp_path / "q")
    inits = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(q)).graph.initializer}
    wq, wzp, ws = inits["w_quantized"], inits["w_zero_point"], inits["w_scale"]
    assert wq.dtype == np.int8 and not wzp.any()  # signed, symmetric weights
    if not set(VNNI_FLAGS) & set(effective_flags()):
        # AVX2 kernels (here, or what the cap stands for): a pair of u8 x s8 products must fit
        # a signed 16-bit sum. Checked on the weights, so the capped run of a VNNI machine, whose
        # own kernels are exact anyway, still catches settings an AVX2 machine would saturate.
        assert 2 * 255 * int(np.abs(wq.astype(np.int64)).max()) <= 32767, INT8

    x = rng.uniform(0.95, 1.0, size=(2, 5, 64)).astype(np.float32)
    assert np.round(x.min() * 255 / x.max()) > 200  # the activations fill the top of the u8 range
    want = exact_dynamic_matmul(x, wq, ws)
    got = outputs(q, {"x": x})[0]
    # exact up to float32 scaling (~1e-7 relative); a saturated pair sum costs ~50 %
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max(), (INT8, np.abs(got - want).max())


def test_a_decoders_8_bit_weights_multiply_exactly_at_the_resolved_accuracy_level(tmp_path, isa):
    """A decoder's INT8 (MatMulNBits at 8 bits, the decoder defaults' block and symmetry) at the
    accuracy level resolved for the CPU: 4 (int8 activations) wherever AVX2 is, the level an
    AVX2 machine's saturating u8 x s8 pair sums would break if its kernels used them. The
    weights are quantized by the pipeline's own ``quantize_folder``. The worst case: every
    weight near the top of its block's range, all positive in half the columns (codes near 255)
    and of alternating sign in the other half (near 255 and 1), against activations all of
    magnitude 1 (exact int8 codes) whose signs make every product of a half positive, so that
    pair sums reach the top of a 16-bit sum whether a kernel pairs the codes unsigned (255 x 127
    twice overflows it) or signed. Compared with the exact product of the dequantized weights;
    ``isa`` runs it on the emulated AVX2 CPU too (tests/test_cpu_emulation.py), where MLAS takes
    an AVX2 machine's kernels."""
    from onnx import numpy_helper

    from pipeline.config.quant import DecoderQuant
    from pipeline.core.env import effective_flags
    from pipeline.quant.stream_nbits import quantize_folder
    from pipeline.recipes.decoder import accuracy_level

    q, bits = DecoderQuant(), 8  # quant=int8 on a decoder: every MatMul at 8 bits
    level, why = accuracy_level(q, effective_flags())
    k, n = 4 * q.block_size, 16
    rng = np.random.default_rng(0)
    sign = np.where(np.arange(k) % 2, -1.0, 1.0)
    w = rng.uniform(0.9, 1.0, size=(k, n))
    w[:, n // 2:] *= sign[:, None]
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], "mm")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", n])],
                          [numpy_helper.from_array(w.astype(np.float32), "w")])
    src, out = tmp_path / "f", tmp_path / "q"
    src.mkdir()
    out.mkdir()
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]),
              str(src / "model.onnx"), save_as_external_data=True, location="model.onnx.data",
              size_threshold=0)
    done = quantize_folder(src, out, {"mm": bits}, q.block_size, q.symmetric, level)
    assert done["matmul_bits"] == {"4": 0, "8": 1}
    model = onnx.load(str(out / "model.onnx"))
    node = next(nd for nd in model.graph.node if nd.op_type == "MatMulNBits")
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    codes = inits[node.input[1]].reshape(n, k).astype(np.int64)  # one byte a weight at 8 bits
    scales = np.repeat(inits[node.input[2]].reshape(n, -1), q.block_size, axis=1)
    assert len(node.input) < 4 and codes.max() >= 250  # symmetric: zero point 128; full range
    dequantized = (codes - 128) * scales  # [n, k]
    # the premise: against the all-ones row (activation code 127), unsigned codes overflow
    assert 127 * (codes[:, 0::2] + codes[:, 1::2]).max() > 32767
    x = np.stack([sign, -sign, np.ones(k)]).astype(np.float32)
    want = x.astype(np.float64) @ dequantized.T
    got = outputs(out / "model.onnx", {"x": x})[0]
    # exact up to float32 scaling; a saturated pair sum loses about half of the product
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max(), (level, why,
                                                                     np.abs(got - want).max())


def test_gather_in_the_dynamic_op_types_stores_an_embedding_table_in_8_bits(tmp_path):
    """``quant.dynamic_op_types`` with Gather (docs/transformers.md): the token embedding table (a
    Gather of an initializer) is stored in 8 bits and only the looked-up rows are dequantized, so
    the INT8 file no longer carries an encoder's largest float tensor."""
    from types import SimpleNamespace

    from onnx import numpy_helper

    from pipeline.quant.calibration import DYNAMIC
    from tests.stages.support import int8_settings

    rng = np.random.default_rng(0)
    vocab, hidden = 50, 16
    table = rng.normal(scale=0.05, size=(vocab, hidden)).astype(np.float32)
    w = rng.normal(size=(hidden, 8)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["e"], name="embed"),
         helper.make_node("MatMul", ["e", "w"], ["y"], name="mm")], "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["b", "t"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "t", 8])],
        [numpy_helper.from_array(table, "table"), numpy_helper.from_array(w, "w")])
    src = tmp_path / "f.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(src))
    out = tmp_path / "q"
    out.mkdir()
    Quantize(int8_settings(), True, DYNAMIC, (),  # this CPU's settings, as the recipe's
             ("MatMul", "Gemm", "Attention", "Gather")).run(SimpleNamespace(model=src), out)
    q = onnx.load(str(out / "model.onnx")).graph
    inits = {i.name: i for i in q.initializer}
    gather = next(n for n in q.node if n.op_type == "Gather")
    assert inits[gather.input[0]].data_type in (TensorProto.UINT8, TensorProto.INT8)
    assert not any(i.data_type == TensorProto.FLOAT and tuple(i.dims) == (vocab, hidden)
                   for i in q.initializer)
    ids = rng.integers(0, vocab, size=(2, 7)).astype(np.int64)
    ref, y = outputs(src, {"ids": ids})[0], outputs(out / "model.onnx", {"ids": ids})[0]
    assert sqnr_db(ref, y) > 25


def test_a_scale_that_is_not_finite_fails_the_stage_naming_the_tensor(tmp_path):
    """A calibration range that reached infinity gives a Q/DQ scale of inf or NaN, and the model
    would answer NaN for every input: refused in one line, not shipped to the gate."""
    import pytest
    from onnx import numpy_helper

    from pipeline.core.errors import StageError
    from pipeline.stages.quantize import _finite_scales

    def model(scale: float):
        inits = [numpy_helper.from_array(np.array(scale, np.float32), "s"),
                 numpy_helper.from_array(np.array(128, np.uint8), "z")]
        nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="q_x"),
                 helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], name="dq_x")]
        path = tmp_path / f"{scale}.onnx"
        save(path, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
             [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], inits)
        return path

    _finite_scales(model(0.02))
    for bad in (float("inf"), float("nan"), 0.0):
        with pytest.raises(StageError, match="q_x.*calibration range of x"):
            _finite_scales(model(bad))
    assert onnx.load(str(model(0.5)))  # the helper writes loadable models


def test_a_gemm_with_a_2d_bias_quantizes_per_channel_and_keeps_its_name(tmp_path):
    """Google's magika: onnxruntime's MatMul+Add fusion leaves its dense layers as Gemm with a
    [1, N] bias, on which the per-channel QDQ quantizer failed ("The truth value of an array with
    more than one element is ambiguous"). The prepare stage gives the bias as [N]; and with no
    LSTM or GRU in the graph, no quantize_dynamic pass runs to rename each Gemm <gemm>_MatMul
    (the float-node edits of the mixed search then found no weight under its name)."""
    from onnx import numpy_helper

    from pipeline.stages.calibrate import Calibrate
    from pipeline.stages.prepare import Prepare

    rng = np.random.default_rng(0)
    src = tmp_path / "fp32"
    src.mkdir()
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
             for n, s in (("W1", (6, 5)), ("B1", (1, 5)), ("W2", (5, 3)), ("B2", (1, 3)))]
    save(src / "model.onnx", [helper.make_node("Gemm", ["x", "W1", "B1"], ["t"], name="gemm0"),
                              helper.make_node("Relu", ["t"], ["r"], name="relu1"),
                              helper.make_node("Gemm", ["r", "W2", "B2"], ["y"], name="gemm2")],
         [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 6])],
         [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])], inits)
    meta = run(Prepare(), artifact(src), tmp_path / "prepared")
    assert sorted(meta["flattened_gemm_bias"]) == ["gemm0", "gemm2"]
    x = rng.standard_normal((4, 6)).astype(np.float32)
    assert np.allclose(outputs(tmp_path / "prepared" / "model.onnx", {"x": x})[0],
                       outputs(src / "model.onnx", {"x": x})[0], atol=1e-6)
    prepared = tmp_path / "prepared"
    cal = split(tmp_path, prepared / "model.onnx", rng.standard_normal((16, 6)), "calibration")
    cmeta = run(Calibrate(cal, "minmax", 4), artifact(prepared), tmp_path / "cal")
    meta = run(Quantize(INT8, True, "minmax", None, ("LSTM", "GRU")), artifact(prepared),
               tmp_path / "int8", calibration=artifact(tmp_path / "cal", "calibrate", **cmeta))
    assert meta["precision"]["gemm0"] == meta["precision"]["gemm2"] == "int8-static", meta
    names = {n.name for n in onnx.load(str(tmp_path / "int8" / "model.onnx")).graph.node}
    assert {"gemm0", "gemm2"} <= names and not any(n.endswith("_MatMul") for n in names)


@pytest.mark.parametrize("tail", [False, True], ids=["join-is-output", "join-then-selection"])
def test_an_output_joined_from_boxes_and_scores_keeps_the_scores(tmp_path, tail):
    """A detector's head joins coordinates in pixels and scores in 0..1 into its one output (YOLOv8
    as nudenet ships it). One INT8 scale over the joined output rounded every score below half
    the step to 0; the output's Concat now stays float and each part keeps its own scale. An
    NMS-free head (YOLO26) joins them, then transposes and picks rows before its output: the
    nodes after the join stay float too (quantized, each carried the joined scale on)."""
    from onnx import numpy_helper

    from pipeline.stages.calibrate import Calibrate

    rng = np.random.default_rng(0)
    src = tmp_path / "prepared"
    src.mkdir()
    inits = [numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "Wb"),
             numpy_helper.from_array(np.float32(100.0), "px"),
             numpy_helper.from_array(rng.standard_normal((8, 6)).astype(np.float32), "Ws")]
    nodes = [helper.make_node("MatMul", ["x", "Wb"], ["b0"], name="boxes"),
             helper.make_node("Mul", ["b0", "px"], ["b"], name="pixels"),
             helper.make_node("MatMul", ["x", "Ws"], ["s0"], name="logits"),
             helper.make_node("Sigmoid", ["s0"], ["s"], name="scores"),
             helper.make_node("Concat", ["b", "s"], ["j" if tail else "y"], name="head", axis=1)]
    if tail:  # [batch, 10] -> [10, batch] -> back: two data-movement ops after the join
        nodes += [helper.make_node("Transpose", ["j"], ["t"], name="turn", perm=[1, 0]),
                  helper.make_node("Transpose", ["t"], ["y"], name="back", perm=[1, 0])]
    save(src / "model.onnx", nodes,
         [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
         [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 10])], inits)
    rows = rng.standard_normal((64, 8))
    cal = split(tmp_path, src / "model.onnx", rows, "calibration")
    cmeta = run(Calibrate(cal, "minmax", 8), artifact(src), tmp_path / "cal")
    meta = run(Quantize(INT8, True, "minmax", None, ()), artifact(src), tmp_path / "int8",
               calibration=artifact(tmp_path / "cal", "calibrate", **cmeta))
    assert meta["joined_outputs"] == (["head", "turn", "back"] if tail else ["head"])
    g = onnx.load(str(tmp_path / "int8" / "model.onnx")).graph
    # no Q/DQ after the join
    assert next(n for n in g.node if "y" in n.output).op_type == ("Transpose" if tail
                                                                  else "Concat")
    assert not any(n.op_type == "QuantizeLinear" and {"j", "t"} & set(n.input) for n in g.node)
    x = rows[32:].astype(np.float32)
    ref = outputs(src / "model.onnx", {"x": x})[0]
    got = outputs(tmp_path / "int8" / "model.onnx", {"x": x})[0]
    # the scores keep steps of 1/255, not the boxes' hundreds-wide ones
    assert np.abs(got[:, 4:] - ref[:, 4:]).max() < 0.05, np.abs(got[:, 4:] - ref[:, 4:]).max()


def test_joined_outputs_are_only_output_concats_of_far_apart_ranges():
    from pipeline.quant.joined_outputs import joined_outputs

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 2])
    nodes = [helper.make_node("Concat", ["a", "b"], ["y"], name="out", axis=1),
             helper.make_node("Concat", ["a", "b"], ["z"], name="inner", axis=1),
             helper.make_node("MatMul", ["z", "W"], ["m"], name="weighted"),
             helper.make_node("Relu", ["m"], ["w"], name="relu"),
             helper.make_node("Concat", ["a", "b"], ["j"], name="late", axis=1),
             helper.make_node("Transpose", ["j"], ["t"], name="turn"),
             helper.make_node("Split", ["t"], ["u", "v"], name="split", num_outputs=2),
             helper.make_node("Relu", ["v"], ["r"], name="unused")]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [
        helper.make_tensor_value_info(t, TensorProto.FLOAT, None) for t in ("y", "w", "u")]))
    # the output's own join; a join whose way out crosses no weighted op, with that way (not
    # the Relu that leads nowhere); not a join whose next op is weighted
    assert joined_outputs(model, {"a": (0.0, 320.0), "b": (0.0, 1.0)}) == [
        "out", "late", "turn", "split"]
    assert joined_outputs(model, {"a": (-8.0, 8.0), "b": (0.0, 1.0)}) == []  # 8x: within range
    assert joined_outputs(model, {"a": (0.0, 320.0)}) == []  # one range known: nothing to compare
