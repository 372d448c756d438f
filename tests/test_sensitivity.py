"""The mixed search's sensitivity proxy (``pipeline.quant.sensitivity``): 4-bit rounding error
per weight row, weighted by the energy of the input channel that row multiplies.

A hand-made graph shows the weighting: two MatMuls share one weight whose row 0 rounds badly
and whose row 1 is on the 4-bit grid; the one fed through channel 0 scores above zero, the one
fed through channel 1 scores exactly zero. Then the proxy on a tiny decoder the builder exported:
every MatMul, the output layer included, gets a finite score, in one forward pass per sequence."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from pipeline.quant.sensitivity import group_scores, node_scores, rtn_error


def test_weights_on_the_4bit_grid_round_without_error():
    rng = np.random.default_rng(0)
    scale = rng.uniform(0.01, 0.1, size=(2, 1, 5))           # two blocks of 32 along K
    codes = rng.integers(-7, 8, size=(2, 32, 5)).astype(np.float32)
    codes[:, 0, :] = -8                                      # the extreme sets the scale
    on_grid = (codes * scale).reshape(64, 5)
    assert np.allclose(rtn_error(on_grid, 4, 32), 0.0, atol=1e-12)
    off_grid = on_grid + 0.5 * scale.repeat(32, axis=1).reshape(64, 5)
    off_grid[[0, 32]] = on_grid[[0, 32]]                    # keep each block's extreme
    err = rtn_error(off_grid, 4, 32)
    assert err.shape == (64,) and (err[1:32] > 0).all()
    # 8 bits: a finer grid, a smaller error on the same weights
    assert rtn_error(off_grid, 8, 32).sum() < err.sum()


def _folder(tmp_path, w: np.ndarray):
    """A genai-style folder: ids -> embedding (2 channels) -> two MatMuls sharing ``w``, one fed
    channel 0 only, the other channel 1 only."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    emb = np.ones((10, 2), np.float32) * np.array([[3.0, 1.0]], np.float32)
    inits = [numpy_helper.from_array(emb, "emb"), numpy_helper.from_array(w, "W"),
             numpy_helper.from_array(np.array([1.0, 0.0], np.float32), "only0"),
             numpy_helper.from_array(np.array([0.0, 1.0], np.float32), "only1")]
    nodes = [helper.make_node("Gather", ["emb", "input_ids"], ["x"]),
             helper.make_node("Mul", ["x", "only0"], ["x0"]),
             helper.make_node("Mul", ["x", "only1"], ["x1"]),
             helper.make_node("MatMul", ["x0", "W"], ["a"], name="/model/layers.0/a/MatMul"),
             helper.make_node("MatMul", ["x1", "W"], ["b"], name="/model/layers.1/b/MatMul"),
             helper.make_node("Add", ["a", "b"], ["logits"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, None]),
                     helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, None])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    tmp_path.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(tmp_path / "model.onnx"), save_as_external_data=True,
              location="model.onnx.data", size_threshold=0)
    (tmp_path / "genai_config.json").write_text(json.dumps({"model": {"decoder": {
        "filename": "model.onnx", "num_key_value_heads": 1, "head_size": 1}}}))
    return tmp_path


def test_a_rows_error_counts_by_the_energy_of_its_input_channel(tmp_path):
    w = np.zeros((2, 3), np.float32)
    w[0] = [0.55, -0.25, 0.65]    # between grid points: rounds with an error
    w[1] = [-0.8, 0.3, 0.7]       # the block's extreme -0.8: scale 0.1, on the grid
    scores = node_scores(_folder(tmp_path / "f", w), [[1, 2, 3], [4, 5]], block_size=16)
    assert scores["/model/layers.0/a/MatMul"] > 1e-4
    assert scores["/model/layers.1/b/MatMul"] == pytest.approx(0.0, abs=1e-12)
    assert sorted(p.name for p in (tmp_path / "f").iterdir()) == [
        "genai_config.json", "model.onnx", "model.onnx.data"]  # the folder is never written
    assert not list(tmp_path.glob(".sensitivity-*"))        # the scratch graph is gone
    assert group_scores(scores, {"layers.0": ["/model/layers.0/a/MatMul"],
                                 "both": list(scores)}) == pytest.approx(
        {"layers.0": scores["/model/layers.0/a/MatMul"], "both": sum(scores.values())})


@pytest.mark.slow  # the builder's import and export
def test_every_matmul_of_a_built_decoder_gets_a_score(tmp_path):
    from llm_tiny import built, llama
    from pipeline.recipes.decoder import groups
    from pipeline.stages.weight_only import matmuls

    folder = built(llama(tmp_path / "hf"), tmp_path / "onnx")
    scores = node_scores(folder, [[0, 5, 9, 17, 30, 2], [3, 4, 8]], block_size=32)
    names = matmuls(folder)
    assert set(scores) == set(names)
    assert all(math.isfinite(v) and 0 < v < 1 for v in scores.values())
    by_group = group_scores(scores, groups(names))
    assert set(by_group) == {"layers.0", "layers.1", "lm_head"}
