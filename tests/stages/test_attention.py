"""attention: an unfused self-attention whose scores carry additive terms (a position bias and a
mask, as MPNet's) becomes one MultiHeadAttention per layer computing the same outputs, the terms
summed once for the layers that share them; a graph the fused kernel does not reproduce is kept
as it was; and the fuse stage applies it where onnxruntime's optimizer fused no attention."""
from __future__ import annotations

import numpy as np
import pytest

from tests.stages.support import artifact, outputs, run, save, split

SEQ, HIDDEN, HEADS, LAYERS = 5, 8, 2, 2


def _encoder(folder, rng, bias_heads=HEADS):
    """x [batch, 5, 8] -> LAYERS x (Q, K, V projections, head split, scaled Q.K^T + a position
    bias + a mask, Softmax, P.V, head merge, output projection + residual), as exporters write
    an attention whose scores carry extra terms."""
    from onnx import TensorProto, helper, numpy_helper

    d = HIDDEN // HEADS
    c = {"heads": np.array([0, 0, HEADS, d], np.int64),
         "merged": np.array([0, 0, HIDDEN], np.int64),
         "root_d": np.float32(np.sqrt(d)),
         "position_bias": rng.standard_normal((1, bias_heads, SEQ, SEQ)).astype(np.float32),
         "mask": np.where(np.arange(SEQ) < SEQ - 1, 0, np.finfo(np.float32).min)
         .astype(np.float32).reshape(1, 1, 1, SEQ)}
    n, nodes, x = helper.make_node, [], "x"
    for layer in range(LAYERS):
        p = f"l{layer}/"
        for w in "qkvo":
            c[p + w] = (rng.standard_normal((HIDDEN, HIDDEN)) / np.sqrt(HIDDEN)).astype(np.float32)
        for w in "qkv":
            nodes += [n("MatMul", [x, p + w], [p + w + "_proj"], name=p + w),
                      n("Reshape", [p + w + "_proj", "heads"], [p + w + "_split"],
                        name=p + w + "_split")]
        nodes += [
            n("Transpose", [p + "q_split"], [p + "qt"], perm=[0, 2, 1, 3], name=p + "qt"),
            n("Transpose", [p + "k_split"], [p + "kt"], perm=[0, 2, 3, 1], name=p + "kt"),
            n("Transpose", [p + "v_split"], [p + "vt"], perm=[0, 2, 1, 3], name=p + "vt"),
            n("MatMul", [p + "qt", p + "kt"], [p + "scores"], name=p + "qk"),
            n("Div", [p + "scores", "root_d"], [p + "scaled"], name=p + "scale"),
            n("Add", [p + "scaled", "position_bias"], [p + "biased"], name=p + "bias"),
            n("Add", [p + "biased", "mask"], [p + "masked"], name=p + "mask"),
            n("Softmax", [p + "masked"], [p + "probs"], axis=-1, name=p + "softmax"),
            n("MatMul", [p + "probs", p + "vt"], [p + "context"], name=p + "pv"),
            n("Transpose", [p + "context"], [p + "ct"], perm=[0, 2, 1, 3], name=p + "ct"),
            n("Reshape", [p + "ct", "merged"], [p + "merged"], name=p + "merge"),
            n("MatMul", [p + "merged", p + "o"], [p + "out"], name=p + "o"),
            n("Add", [p + "out", x], [p + "residual"], name=p + "residual")]
        x = p + "residual"
    nodes.append(n("Identity", [x], ["y"], name="y"))
    io = [helper.make_tensor_value_info(k, TensorProto.FLOAT, ["batch", SEQ, HIDDEN]) for k in "xy"]
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in c.items()]
    return save(folder / "model.onnx", nodes, io[:1], io[1:], inits)


def _ops(path):
    import onnx

    counts: dict = {}
    for node in onnx.load(str(path)).graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def test_each_layer_becomes_one_multi_head_attention_with_the_same_outputs(tmp_path):
    from pipeline.stages.attention import fused_copy

    rng = np.random.default_rng(0)
    model = _encoder(tmp_path, rng)
    target = tmp_path / "fused.onnx"
    assert fused_copy(model, target, HEADS) == LAYERS
    ops = _ops(target)
    assert ops["MultiHeadAttention"] == LAYERS
    assert "Softmax" not in ops and "Transpose" not in ops and "Div" not in ops
    # the bias and the mask summed once for both layers, plus each layer's residual Add
    assert ops["Add"] == 1 + LAYERS
    x = rng.standard_normal((3, SEQ, HIDDEN)).astype(np.float32)
    assert np.allclose(outputs(target, {"x": x})[0], outputs(model, {"x": x})[0], atol=1e-5)


@pytest.mark.parametrize("bias_heads, why", [(1, "differ"), (HEADS, "attention_bias")])
def test_a_graph_the_fused_kernel_does_not_reproduce_is_kept_as_it_was(tmp_path, bias_heads, why,
                                                                       capfd):
    """Fused with one head instead of two: with a bias shared by the heads the kernel runs but the
    outputs differ; with one bias per head the runtime refuses it. Either way the record says why
    and the file is the unfused graph itself, and the runtime's refusal is not also logged on the
    user's terminal (a red ``[E:onnxruntime ...]`` line from the probe's session)."""
    from pipeline.config import HardwareConfig
    from pipeline.core import isolate
    from pipeline.models import task
    from pipeline.stages.attention import checked

    rng = np.random.default_rng(1)
    model = _encoder(tmp_path, rng, bias_heads)
    data = split(tmp_path, model, rng.standard_normal((8, SEQ, HIDDEN)))
    t = task(data.task)
    # in a child process, as the runner runs stages: checked() sets onnxruntime's process-wide
    # thread pool, which later tests' plain sessions must not inherit
    record = isolate.call("attention check", checked, model, tmp_path / "out.onnx", 1, t,
                          t.dataset(data), HardwareConfig().target())
    assert record["fused"] == 0 and why in record["why_not"]
    assert (tmp_path / "out.onnx").read_bytes() == model.read_bytes()
    assert "onnxruntime" not in capfd.readouterr().err


def test_the_fuse_stage_fuses_the_attention_the_optimizer_left(tmp_path):
    from pipeline.config import HardwareConfig
    from pipeline.stages.fuse import Fuse

    rng = np.random.default_rng(2)
    src = tmp_path / "export"
    src.mkdir()
    model = _encoder(src, rng)
    rows = rng.standard_normal((8, SEQ, HIDDEN))
    meta = run(Fuse(split(tmp_path, model, rows), "bert", HEADS, HIDDEN, HardwareConfig()),
               artifact(src), tmp_path / "fused")
    assert meta["fusions"]["MultiHeadAttention"] == LAYERS
    assert meta["attention"]["fused"] == LAYERS and meta["attention"]["why_not"] is None
    assert meta["nodes"]["MultiHeadAttention"] == LAYERS
    assert meta["parity_vs_export"]["max_abs_diff"] <= 1e-3
