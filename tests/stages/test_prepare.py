"""prepare: the float model as the quantizer wants it: every tensor's shape inferred, the graph's
inputs and outputs kept. It writes only in its own folder: onnxruntime's symbolic shape
inference, when it fails, saves ``sym_shape_infer_temp.onnx`` (and its external data) in the
current directory."""
from pathlib import Path
from types import SimpleNamespace

import onnx
from onnx import TensorProto, helper

from pipeline.core.errors import StageError
from pipeline.stages.prepare import Prepare
from tests.stages.support import artifact, mlp_graph, outputs, run


def test_every_tensor_gets_its_shape_and_the_interface_is_kept(tmp_path):
    import numpy as np

    rng = np.random.default_rng(0)
    src = tmp_path / "fp32"
    model = mlp_graph(src, rng, 6, 5, 3)
    assert not onnx.load(str(model)).graph.value_info  # the intermediate tensors: no shapes
    meta = run(Prepare(), artifact(src), tmp_path / "prepared")
    assert meta["symbolic_shape_inference"] is True

    g = onnx.load(str(tmp_path / "prepared" / "model.onnx")).graph
    shapes = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in (*g.input, *g.value_info, *g.output)}
    assert shapes == {"x": ["batch", 6], "t0": ["batch", 5], "t1": ["batch", 5], "y": ["batch", 3]}
    x = rng.standard_normal((3, 6)).astype(np.float32)
    assert np.allclose(outputs(tmp_path / "prepared" / "model.onnx", {"x": x})[0],
                       outputs(model, {"x": x})[0], atol=1e-5)


def _unknown_op_model(path: Path) -> None:
    # An op of a domain no one knows: symbolic shape inference cannot type its output.
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["t"]),
                           helper.make_node("Foo", ["t"], ["u"], domain="my.domain"),
                           helper.make_node("Relu", ["u"], ["y"])], "g", [x], [y])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13),
                                                  helper.make_opsetid("my.domain", 1)]), str(path))


def test_failed_symbolic_inference_leaves_nothing_in_cwd(tmp_path, monkeypatch):
    model = tmp_path / "m.onnx"
    _unknown_op_model(model)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    out = tmp_path / "stage"
    out.mkdir()
    monkeypatch.chdir(cwd)
    try:
        meta = Prepare().run(SimpleNamespace(model=model), out)
        assert meta["symbolic_shape_inference"] is False  # it did fail, and went on without it
    except StageError:
        pass  # the retry may fail too on an unknown op: what it leaves behind is the point
    assert sorted(p.name for p in cwd.iterdir()) == []
    assert not (out / "scratch").exists()


def test_prepare_through_the_runner_with_a_relative_cache(tmp_path, monkeypatch):
    """The runner's temporary folder is relative when the cache is (workdir=artifacts): the
    stage's change of directory must not lose it."""
    from pipeline.config import HardwareConfig
    from pipeline.engine.runner import Runner

    monkeypatch.chdir(tmp_path)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), "m.onnx")
    parent = SimpleNamespace(model="m.onnx", digest="0" * 64)
    before = sorted(p.name for p in tmp_path.iterdir())
    out = Runner(Path("w"), HardwareConfig(), log=lambda m: None).run(Prepare(), parent)
    assert (out.path / "model.onnx").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(before + ["w"])
