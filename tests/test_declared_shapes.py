"""An ONNX file whose declarations lie (as published recognizers do): a fixed input batch of 1
and an output declared ``[1, seqlen]`` while the graph returns ``[time, batch, classes]``. The
pipeline runs the graph on a real sample, trusts what it returns, and the import stage writes
the model with the batch axis dynamic and the output declared as it runs. Also: a graph its
authors already quantized is refused for quant=int8 in one line, and run as quant=none by
quant=auto."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

H, CHARS = 8, "ab"


def _model(path, batch=1, quantized=False):
    """x [batch, 1, H, W] -> [W, batch, 3]: each column's class scores (time-major)."""
    w = np.zeros((H, len(CHARS) + 1), np.float32)
    w[: H // 2, 1], w[H // 2:, 2], w[:, 0] = 1.0, 1.0, 0.5  # top half bright: 'a'; bottom: 'b'
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 1, H, "width"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "seqlen"])  # untrue
    nodes = [helper.make_node("Squeeze", ["x", "one"], ["s"]),            # [N, H, W]
             helper.make_node("Transpose", ["s"], ["t"], perm=[2, 0, 1])]  # [W, N, H]
    if quantized:  # what a dynamic quantizer leaves: integer MatMul and its scales
        nodes += [helper.make_node("DynamicQuantizeLinear", ["t"], ["tq", "ts", "tz"]),
                  helper.make_node("MatMulInteger", ["tq", "wq", "tz"], ["yi"]),
                  helper.make_node("Cast", ["yi"], ["yf"], to=TensorProto.FLOAT),
                  helper.make_node("Mul", ["yf", "ts"], ["y"])]
        inits = [numpy_helper.from_array((w > 0).astype(np.uint8), "wq")]
    else:
        nodes.append(helper.make_node("MatMul", ["t", "w"], ["y"]))
        inits = [numpy_helper.from_array(w, "w")]
    inits.append(numpy_helper.from_array(np.array([1], np.int64), "one"))
    g = helper.make_graph(nodes, "g", [x], [y], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(path))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from PIL import Image

    root = tmp_path_factory.mktemp("lies")
    rng = np.random.default_rng(0)
    rows = []
    for k in range(10):
        text = "".join(rng.choice(list(CHARS), size=3))
        cols = []
        for ch in text:  # a bright half per character, a dark column between characters
            glyph = np.zeros((H, 2), np.uint8)
            glyph[(0 if ch == "a" else H // 2):(H // 2 if ch == "a" else H)] = 255
            cols += [glyph, np.zeros((H, 1), np.uint8)]
        Image.fromarray(np.concatenate(cols, axis=1)).save(root / f"{k}.png")
        rows.append({"file": f"{k}.png", "label": text})
    (root / "labels.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "charset.txt").write_text("a\nb\n")
    _model(root / "lies.onnx")
    _model(root / "quantized.onnx", quantized=True)
    return root


def _args(root, name):
    return ["model=onnx", f"model.path={root / name}", "data=labels_file",
            "data.image.color=grey", "data.image.resize=none", f"data.path={root}",
            f"data.labels={root / 'labels.jsonl'}", "data.calibration_samples=4",
            "data.evaluation_samples=6", "metric=ctc", f"metric.charset={root / 'charset.txt'}",
            "registry=null"]


def test_the_graph_is_trusted_over_its_declarations(files, tmp_path):
    """Run in a child, as the pipeline runs its stages (``pipeline.core.isolate``): the stage and the
    pipeline's sessions set onnxruntime's global thread pool, after which no plain session could be
    made in this worker (other tests make some). A failed check is the child's error here."""
    from pipeline.core.isolate import call

    call("the declared-shapes check", _trusted, files, tmp_path)


def _trusted(files, tmp_path):
    from benchmarks.byo import _task
    from pipeline.config import HardwareConfig
    from pipeline.stages.import_onnx import ImportOnnx

    cfg, t = _task(_args(files, "lies.onnx"))  # refused before: "needs [batch, time, classes]"
    assert t.inputs[0].shape[0] == "batch" and t.fixed_batch == ("x",)
    assert t.outputs[0].shape[1:] == ("batch", 3) and t.time_major  # found, not configured
    assert any("trusts the graph" in w for w in t.warnings)
    split = t.split("evaluation", 6, cfg.data_dir)
    ds = t.dataset(split)
    batch = next(t.batches(ds, 6))
    assert len(t.predictions(np.zeros((5, 6, 3), np.float32))) == 6  # time-major decoded
    meta = ImportOnnx(task=t.key, path=t.onnx_source, sha256=t.onnx_sha256, data=split,
                      hardware=HardwareConfig().target()).run(None, tmp_path)
    assert meta["parity_vs_file"]["decoded_agreement"] == 1.0
    assert meta["redeclared"]["batch_made_dynamic"] == ["x"]
    taken = onnx.load(str(tmp_path / "model.onnx"))
    assert taken.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    assert [d.dim_value for d in taken.graph.output[0].type.tensor_type.shape.dim][1:] == [0, 3]
    from pipeline.runtimes import onnxruntime as ort

    hw = HardwareConfig().target()
    out = ort.run(ort.session(tmp_path / "model.onnx", hw), batch.feeds)
    assert out.shape[1] == 6  # the imported model runs the whole batch
    assert t.predictions(out) == [str(x) for x in batch.labels]  # and reads the lines


def test_the_graph_is_run_once_per_file_not_in_every_stage(files, tmp_path, monkeypatch):
    """Each stage's child rebuilds the task; the probe's answer is kept under data_dir (keyed by
    the file, the sample and the runtime), so only the first build runs the graph."""
    import pipeline.core.isolate
    from benchmarks.byo import _task
    from pipeline.models.onnx_file import OnnxTask

    _, t = _task(_args(files, "lies.onnx") + [f"data_dir={tmp_path / 'd'}"])
    assert len(list((tmp_path / "d" / "onnx-probes").glob("*.json"))) == 1

    def again(*_, **__):
        raise AssertionError("the graph was run again for the same file and sample")

    monkeypatch.setattr(pipeline.core.isolate, "call", again)
    rebuilt = OnnxTask(t.key)  # what a stage's child does
    assert (rebuilt.outputs, rebuilt.time_major, rebuilt.warnings, rebuilt.inputs) == \
        (t.outputs, t.time_major, t.warnings, t.inputs)


def test_an_already_quantized_model_is_refused_for_int8(files):
    from benchmarks.byo import _task
    from pipeline.core.errors import ConfigError
    from pipeline.quant.given import already_quantized

    cfg, t = _task(_args(files, "quantized.onnx") + ["quant=int8"])
    assert t.quantized_ops == ["DynamicQuantizeLinear", "MatMulInteger"]
    with pytest.raises(ConfigError, match=r"already quantized \(DynamicQuantizeLinear, "
                                          r"MatMulInteger\): quant=int8 re-quantizes"):
        already_quantized(cfg, t)
    cfg_auto, _ = _task(_args(files, "quantized.onnx") + ["quant=auto"])
    ran, note = already_quantized(cfg_auto, t)
    assert ran.quant.mode.value == "none" and ran.gate == cfg_auto.gate  # none judges its own speed
    assert "running as quant=none" in note
    cfg_float, t_float = _task(_args(files, "lies.onnx") + ["quant=int8"])
    assert already_quantized(cfg_float, t_float) == (cfg_float, None)


def test_int8_on_a_quantized_model_exits_2_before_any_stage(files, tmp_path, capsys):
    from pipeline.cli.main import main

    code = main(_args(files, "quantized.onnx") + ["quant=int8", f"workdir={tmp_path / 'w'}"])
    err = capsys.readouterr().err
    assert code == 2 and "already quantized" in err and "Traceback" not in err
    assert not (tmp_path / "w").exists()
