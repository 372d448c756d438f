"""Bad input and a refusing machine end in one line that names the file (and its line), the stage
and the real cause: each case here once ended in a traceback, a wrong exit code or a line that
named the wrong thing. Tiny ``onnx.helper`` graphs and a few generated files; no whole run."""
from __future__ import annotations

import json
import types
from pathlib import Path

import numpy as np
import pytest

from pipeline.core.errors import ConfigError, StageError


def _model(path: Path, inputs: dict[str, list], nodes, outputs: dict[str, list]) -> Path:
    import onnx
    from onnx import TensorProto, helper

    def values(shapes):
        return [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in shapes.items()]

    graph = helper.make_graph(nodes, "g", values(inputs), values(outputs))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def _classifier(path: Path) -> Path:
    """image [batch, 3, 8, 8] -> logits [batch, 3]: average per channel."""
    from onnx import helper

    return _model(path, {"image": ["batch", 3, 8, 8]},
                  [helper.make_node("GlobalAveragePool", ["image"], ["p"]),
                   helper.make_node("Flatten", ["p"], ["logits"])], {"logits": ["batch", 3]})


def _task(tmp_path: Path, *args: str):
    from pipeline.engine.compose import compose
    from pipeline.models import task
    from pipeline.models.sources import task_key

    cfg = compose(list(args))
    return task(task_key(cfg.model, cfg.data, cfg.metric, str(tmp_path / "data-dir")))


def test_a_malformed_pooling_config_of_an_hf_folder_names_the_file_and_line(tmp_path):
    from pipeline.models.hf_folder import pooling_of

    st = tmp_path / "1_Pooling" / "config.json"
    st.parent.mkdir()
    st.write_text('{\n  "word_embedding_dimension": 32,\n  "pooling_mode_mean_tokens": tru\n}\n')
    with pytest.raises(ConfigError) as e:  # exit 2, one line (was exit 4 and a traceback)
        pooling_of(tmp_path, {})
    assert str(e.value).startswith(f"{st}: line 3: not valid JSON (Expecting value at column 31)")
    st.write_text("[1, 2]")
    with pytest.raises(ConfigError, match=f"^{st}: a JSON list where an object was expected"):
        pooling_of(tmp_path, {})
    assert pooling_of(tmp_path, {"pooling": "cls"}) == "cls"  # given: the file is not read


def test_external_data_of_a_constant_node_is_checked_before_any_stage(tmp_path):
    """onnx loads a Constant's external data too; one outside the model's folder is refused up
    front, like an initializer's (it passed, and onnx refused it later in a stage)."""
    import onnx
    from onnx import helper, numpy_helper

    from pipeline.models.onnx_file import external_data_inside

    (tmp_path / "m").mkdir()
    value = numpy_helper.from_array(np.eye(3, dtype=np.float32), "w")
    other = helper.make_graph([helper.make_node("Constant", [], ["c"], value=value)], "other",
                              [], [helper.make_tensor_value_info("c", 1, [3, 3])])
    path = _model(tmp_path / "m" / "const.onnx", {"x": ["batch", 3]},
                  [helper.make_node("Constant", [], ["w"], value=value),
                   helper.make_node("MatMul", ["x", "w"], ["y"])], {"y": ["batch", 3]})
    onnx.save_model(onnx.load(str(path)), str(path), save_as_external_data=True,
                    location="const.data", size_threshold=0, convert_attribute=True)
    external_data_inside(onnx.load(str(path), load_external_data=False), path)  # inside: fine
    model = onnx.load(str(path), load_external_data=False)
    for entry in model.graph.node[0].attribute[0].t.external_data:
        if entry.key == "location":
            entry.value = "../outside.data"
    with pytest.raises(ConfigError, match="tensor w's external data names '../outside.data', "
                                          "which resolves to .*, outside"):
        external_data_inside(model, path)
    # a Constant inside a subgraph (an If's branch) is read too
    model = onnx.load(str(path), load_external_data=False)
    branch = onnx.helper.make_graph([onnx.helper.make_node("Identity", ["w"], ["z"])], "b", [],
                                    [helper.make_tensor_value_info("z", 1, [3, 3])])
    branch.node.insert(0, model.graph.node[0])
    branch.node[0].attribute[0].t.external_data[0].value = "/etc/hostname"
    model.graph.node.append(helper.make_node("If", ["cond"], ["z"], then_branch=branch,
                                             else_branch=other))
    with pytest.raises(ConfigError, match="names '/etc/hostname', which resolves to .*, outside"):
        external_data_inside(model, path)


def png_header(width: int, height: int) -> bytes:
    """A PNG file's signature and header claiming ``width`` x ``height`` RGB pixels, and no pixel
    data: opening it reads the size, decoding it would fail."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0,
                                                                0, 0))
            + chunk(b"IDAT", b"") + chunk(b"IEND", b""))


@pytest.mark.parametrize("case", ["truncated", "40000x40000", "10000x10000"])
def test_a_truncated_or_oversized_image_is_named_by_its_file(tmp_path, case):
    """A 40000x40000 header was PIL's DecompressionBombError (a traceback); a 10000x10000 one
    passes PIL's limit and grew the process to 3.7 GB: both refused from the header alone (the
    file holds no pixel data, so a decode would say "truncated" instead)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for label in ("a", "b"):
        (tmp_path / "imgs" / label).mkdir(parents=True)
        for i in range(4):
            Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)).save(
                tmp_path / "imgs" / label / f"{i}.png")
    bad = tmp_path / "imgs" / "b" / "2.png"
    if case == "truncated":
        bad.write_bytes(bad.read_bytes()[:60])  # past the header: Pillow opens it, then runs dry
        said = "cannot be read as an image (image file is truncated)"
    else:
        w, h = map(int, case.split("x"))
        bad.write_bytes(png_header(w, h))
        said = f"{w * h:,} pixels, more than 40,000,000 (pipeline.data.images.MAX_PIXELS); " \
            "nothing was decoded"
    # the task reads the first evaluation samples to learn which axis varies, so the bad file
    # may be met while the task is made or when batches are read: either way it is named
    with pytest.raises(StageError) as e:
        t = _task(tmp_path, "model=onnx", f"model.path={_classifier(tmp_path / 'cls.onnx')}",
                  "data=imagefolder", f"data.path={tmp_path / 'imgs'}",
                  "data.calibration_samples=2", "data.evaluation_samples=6",
                  "metric=classification")
        list(t.batches(t.data().dataset, 4))
    assert str(e.value).startswith(f"{bad}: ") and str(e.value).endswith(said)
    assert "\n" not in str(e.value)


def test_each_input_of_a_two_input_model_reads_the_column_named_like_it(tmp_path):
    """docs/byo.md: a model with several inputs reads one column per input name; it was refused
    unless data.input_column (default ``image``) named an existing column."""
    from onnx import helper

    model = _model(tmp_path / "two.onnx", {"a": ["batch", 4], "b": ["batch", 4]},
                   [helper.make_node("Sub", ["a", "b"], ["y"])], {"y": ["batch", 4]})
    rows = [{"a": [float(i)] * 4, "b": [1.0, 2.0, 3.0, float(-i)], "x": [0.5] * 4}
            for i in range(8)]
    table = tmp_path / "t.jsonl"
    table.write_text("".join(json.dumps(r) + "\n" for r in rows))
    common = ["model=onnx", f"model.path={model}", "data=jsonl", f"data.path={table}",
              "data.calibration_samples=2", "data.evaluation_samples=6", "metric=agreement"]
    t = _task(tmp_path, *common)  # data.input_column is left at its default, "image"
    batch = next(t.batches(t.data().dataset, 8, sort=False))
    assert np.array_equal(batch.feeds["a"], np.asarray([r["a"] for r in rows], np.float32))
    assert np.array_equal(batch.feeds["b"], np.asarray([r["b"] for r in rows], np.float32))
    # an input without a column of its name reads data.input_column
    (tmp_path / "t2.jsonl").write_text("".join(json.dumps({"a": r["a"], "x": r["x"]}) + "\n"
                                               for r in rows))
    t = _task(tmp_path, *common, f"data.path={tmp_path / 't2.jsonl'}", "data.input_column=x")
    batch = next(t.batches(t.data().dataset, 8, sort=False))
    assert np.array_equal(batch.feeds["b"], np.full((8, 4), 0.5, np.float32))
    with pytest.raises(ConfigError, match="the data has no column 'b', nor "
                                          "data.input_column=image \\(columns: a, x\\)"):
        _task(tmp_path, *common, f"data.path={tmp_path / 't2.jsonl'}")
    with pytest.raises(ConfigError, match="a and b would all read column 'a'"):
        _task(tmp_path, *common, f"data.path={tmp_path / 't2.jsonl'}", "data.input_column=a")


def test_a_full_disk_in_prepare_is_one_line_naming_the_path(tmp_path, capfd):
    """quant_pre_process logs a failed optimization with its traceback and goes on, and onnx's
    shape inference writes an empty file when the disk is full: the stage said neither where nor
    why (no room at all), or cached an empty model (a page or two left). (That it builds where
    there is room, every whole run shows.)"""
    from pipeline.config import HardwareConfig
    from pipeline.engine.runner import Runner
    from pipeline.stages.prepare import Prepare
    from tests.faults import tmpfs

    parent = types.SimpleNamespace(model=str(_classifier(tmp_path / "cls.onnx")), digest="0" * 64)
    for left in (0, 8192):
        with tmpfs(tmp_path / f"disk{left}", size="128k", fill_to_bytes=left) as disk:
            with pytest.raises(StageError) as e:
                Runner(disk, HardwareConfig(), log=lambda m: None).run(Prepare(), parent)
            line = str(e.value)
            assert line.startswith(f"stage prepare: {disk}/cache/prepare/") and "\n" not in line
            assert line.endswith("(ENOSPC)") and "No space left on device" in line, line
            assert not list((disk / "cache" / "prepare").iterdir())  # nothing cached
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Optimization Failed" not in err, err


@pytest.mark.parametrize("case", ["scalar", "state"])
def test_an_input_not_batched_on_its_first_axis_is_one_line(tmp_path, case):
    """silero-vad's shapes: a sample rate fed as a scalar (one value for the whole call) and a
    recurrent state [2, batch, 128]. The pipeline stacks samples on the first axis; the scalar
    had ended in numpy's traceback (exit 4), the state in a line about the task contract."""
    from onnx import helper

    extra = ({"sr": []} if case == "scalar" else {"state": [2, "batch", 4]})
    model = _model(tmp_path / "vad.onnx", {"x": ["batch", 4], **extra},
                   [helper.make_node("Identity", ["x"], ["y"])], {"y": ["batch", 4]})
    rows = [{"x": [float(i)] * 4, "sr": 16000.0, "state": [[0.0] * 4] * 2} for i in range(8)]
    table = tmp_path / "t.jsonl"
    table.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ConfigError) as e:  # exit 2, one line, when the task is made
        _task(tmp_path, "model=onnx", f"model.path={model}", "data=jsonl", f"data.path={table}",
              "metric=agreement")
    line = str(e.value)
    assert "\n" not in line and "batches every input along its first axis" in line
    assert ("input sr is a scalar (shape [])" if case == "scalar" else
            "input state has shape [2, 'batch', 4], a fixed first axis of 2") in line


def test_dynamic_int8_of_a_graph_it_would_not_change_is_one_line(tmp_path):
    """Convolutions and pooling only (nudenet's detector): quant=dynamic would ship the FP32
    model as its candidate and time it against itself. Refused in one line, naming what it
    quantizes and what to use instead."""
    from pipeline.engine.compose import compose
    from pipeline.recipes.main import _something_dynamic

    model = _classifier(tmp_path / "cls.onnx")
    args = ["model=onnx", f"model.path={model}", "data=jsonl", f"data.path={tmp_path / 't.jsonl'}",
            "data.input_column=image", "data.calibration_samples=2", "data.evaluation_samples=4",
            "metric=agreement", "quant=dynamic"]
    (tmp_path / "t.jsonl").write_text("".join(
        json.dumps({"image": np.full((3, 8, 8), float(i)).tolist()}) + "\n" for i in range(8)))
    t = _task(tmp_path, *args)
    with pytest.raises(ConfigError, match="^quant=dynamic: the graph has no op dynamic INT8 "
                                          "quantizes \\(quant.dynamic_op_types: MatMul, Gemm, "
                                          "LSTM, GRU, Attention\\).*quant=int8"):
        _something_dynamic(compose(args), t, types.SimpleNamespace(model=model), None)
