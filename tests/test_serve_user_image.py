"""The user's own image model served from raw bytes, as its evaluation read its samples.

A run of an ONNX file on image data records its ``data.image`` steps and its output's decoding
(``serving`` in the report and the manifest); the server reads PNG or JPEG bytes through the same
functions and answers what the metric decodes. End to end: the small classifier of
``tests/byo_net.py`` as an ONNX file, compiled to INT8 with ``slo.mode=serve`` (its p99 measured
by the real server from the image files' own bytes), published to a local registry, served from
its registry ref; every evaluation image's file, posted as it is, gets the classes whose hash is
the candidate's output-hash ledger. In process: a recognizer's feeds and decoded text through the
server's reader equal the task's own evaluation batches of one, for PaddleOCR-style settings
(height 48 with the width rounded up, BGR, mean/std, constant padding to a minimum width), and a
model the server cannot read says why in one line.
"""
from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import requests

from tests.conftest import run_cli, run_folder
from tests.serve_helpers import start

FAST = ["bench.min_rounds=20", "bench.min_seconds=0", "bench.max_seconds=0.3",
        "bench.warmup_max_runs=20", "bench.size_buckets=2", "bench.cold_start_repeats=0",
        "bench.aa_tolerance=0.5", "gate.min_speedup=0", "gate.check_slo_p99=false",
        "gate.require_aa_check=false",  # timing verdicts off: tests/conftest.py tiny_args
        "quant.profile_runs=3", "quant.ranking_samples=20", "quant.region_trials=0"]
CLASSIFIER = ["model=onnx", "data=imagefolder", "data.calibration_samples=30",
              "data.evaluation_samples=45", "metric=classification", "metric.top_k=2"]


@pytest.fixture(scope="module")
def classifier_run(tmp_path_factory):
    """(root, report, published ref, the args that compose the run's task) of the byo
    classifier's INT8 run, its served p99 measured from raw bytes."""
    from tests import byo_net

    root = tmp_path_factory.mktemp("serve_byo")
    byo_net.write_folder(root / "data", 25)
    byo_net.to_onnx(byo_net.train(root / "cnn.safetensors"), root / "cnn.onnx", opset=12)
    args = [*CLASSIFIER, f"model.path={root / 'cnn.onnx'}", f"data.path={root / 'data'}"]
    proc = run_cli(*args, "model.eval_batch_size=1", "slo.mode=serve", "slo.serve_qps=5",
                   "slo.serve_seconds=2", "slo.p99_ms=60000", f"workdir={root / 'work'}",
                   f"data_dir={root / 'dd'}", f"registry.root={root / 'registry'}", *FAST)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((run_folder(proc) / "report.json").read_text())
    return root, report, report["published"].split("@")[0], args


def _task(data_dir: Path, *args: str):
    from pipeline.engine.compose import compose
    from pipeline.models import task
    from pipeline.models.sources import task_key

    cfg = compose(list(args))
    return task(task_key(cfg.model, cfg.data, cfg.metric, str(data_dir)))


def _evaluation_files(t, count: int) -> list[bytes]:
    """The evaluation split's image files, in the order the run evaluated them, as they are."""
    from pipeline.serve.slo import request_bodies

    return request_bodies(t, t.dataset(t.split("evaluation", count, "")), count)


def test_a_users_classifier_is_served_from_its_registry_ref_as_evaluated(classifier_run,
                                                                         tmp_path):
    root, report, ref, args = classifier_run
    spec = report["serving"]
    assert (spec["reader"], spec["input"], spec["metric"]) == ("image", "image", "classification")
    assert spec["labels"] == ["class0", "class1", "class2"] and spec["sample_size"] == [16, 16]
    served = next(c for c in report["verdict"]["checks"] if c["check"] == "served_p99_ms")
    assert served["passed"] and report["verdict"]["served"]["ok"] > 0, served
    assert not report["verdict"]["served"]["errors"], report["verdict"]["served"]
    # only its batch axis is dynamic: no input size to bill at, nor a "measured up to 8" (the
    # batch) against slo.max_input
    bill = report["bill"]
    assert bill["size_axis"] is None and "only its batch axis" in bill["size_from"]
    assert bill["input_shape"] == [8, 3, 16, 16]
    assert bill["capacity"]["measured_max_input"] is None and "warning" not in bill["capacity"]
    candidate = next(r for r in report["rows"] if r["role"] == "candidate")
    bodies = _evaluation_files(_task(root / "dd", *args), 45)
    assert all(b.startswith(b"\x89PNG") for b in bodies)  # the files as written, not re-encoded
    running = start(ref, tmp_path, f"registry.root={root / 'registry'}")
    try:
        answers = []
        for body in bodies:
            r = requests.post(f"{running.url}/predict", data=body,
                              headers={"Content-Type": "image/png"}, timeout=60)
            assert r.status_code == 200, r.text
            answers.append(r.json()["prediction"])
        from PIL import Image

        buf = io.BytesIO()
        Image.open(io.BytesIO(bodies[0])).convert("RGB").save(buf, format="JPEG", quality=95)
        jpeg = requests.post(f"{running.url}/predict", data=buf.getvalue(),
                             headers={"Content-Type": "image/jpeg"}, timeout=60)
        text = requests.post(f"{running.url}/predict", data=b"a sentence",
                             headers={"Content-Type": "text/plain"}, timeout=60)
        buf = io.BytesIO()
        Image.new("RGB", (17, 16)).save(buf, format="PNG")  # no resize: 16x16 only
        wrong = requests.post(f"{running.url}/predict", data=buf.getvalue(),
                              headers={"Content-Type": "image/png"}, timeout=60)
    finally:
        assert running.stop() == 0, running.log.read_text()
    from pipeline.metrics.outputs import output_hash

    assert output_hash([a["top_k"] for a in answers]) == candidate["output_sha256"]
    assert all(a["label"] == f"class{a['class']}" and 0 < a["score"] <= 1 for a in answers)
    assert jpeg.status_code == 200 and len(jpeg.json()["prediction"]["top_k"]) == 2
    assert text.status_code == 415 and "reads images" in text.json()["error"]
    assert wrong.status_code == 400, wrong.text  # one line, not the runtime's 500
    assert "a 17x16 image becomes an input of 3x16x17; the model takes 3x16x16" in \
        wrong.json()["error"]
    assert "images for classification" in running.log.read_text()


def _recognizer(path: Path, classes: int) -> Path:
    """image [batch, 3, 48, width] -> logits [batch, width, classes]: the mean over the height,
    then fixed random weights: an untrained recognizer whose decoding depends on every pixel
    column the preprocessing hands it."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(0).normal(size=(3, classes)).astype(np.float32) * 4
    nodes = [helper.make_node("ReduceMean", ["image"], ["m"], axes=[2], keepdims=0),
             helper.make_node("Transpose", ["m"], ["t"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["t", "w"], ["logits"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("image", TensorProto.FLOAT,
                                                   ["batch", 3, 48, "width"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "width", classes])],
        [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_the_readers_feeds_and_text_are_the_evaluations_own(tmp_path):
    """PaddleOCR-style settings: each line's bytes through the server's reader give exactly the
    feeds of the task's own evaluation batch of one, and the reader's text is the task's
    prediction from the same outputs (in both CTC layouts)."""
    import onnxruntime as ort
    from PIL import Image

    from pipeline.serve.inputs import Limits
    from pipeline.serve.readers import UserImageReader

    chars = "abcdefgh"
    (tmp_path / "chars.txt").write_text("\n".join(chars) + "\n")
    lines, rows, rng = tmp_path / "lines", [], np.random.default_rng(3)
    lines.mkdir()
    for n in range(6):  # text lines of several sizes and aspects, colour
        h, w = int(rng.integers(20, 70)), int(rng.integers(40, 400))
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(lines / f"{n}.png")
        rows.append(json.dumps({"file": f"{n}.png", "label": "abc"}))
    (lines / "labels.jsonl").write_text("\n".join(rows) + "\n")
    model = _recognizer(tmp_path / "rec.onnx", len(chars) + 1)
    t = _task(tmp_path / "dd", "model=onnx", f"model.path={model}", "data=labels_file",
              f"data.path={lines}", f"data.labels={lines / 'labels.jsonl'}",
              "data.calibration_samples=1", "data.evaluation_samples=5", "data.image.resize=height",
              "data.image.height=48", "data.image.width_rounding=ceil", "data.image.min_width=160",
              "data.image.mean=[0.5,0.5,0.5]", "data.image.std=[0.5,0.5,0.5]",
              "data.image.channel_order=bgr", "data.image.pad=constant", "data.image.pad_value=0",
              "data.image.pad_units=normalized", "data.image.pad_width_multiple=8", "metric=ctc",
              f"metric.charset={tmp_path / 'chars.txt'}")
    spec = t.serving_spec()
    assert spec.decoding.charset == tuple(chars) and spec.decoding.time_major is False
    assert spec.image.min_width == 160 and spec.image.resize.value == "height"
    reader = UserImageReader(spec)
    ds = t.dataset(t.split("evaluation", 5, ""))
    bodies = _evaluation_files(t, 5)
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    limits = Limits(1 << 24, 1 << 24, 1 << 14, 1 << 22)
    widths = set()
    for k, body in enumerate(bodies):
        expected = next(t.batches(ds.select([k]), 1)).feeds["image"]
        got = reader.prepare(body, "image/png", limits)
        assert got.feeds["image"].dtype == np.float32
        assert np.array_equal(got.feeds["image"], expected), k
        widths.add(got.size)
        out = session.run(None, got.feeds)[0]
        assert reader.answers(out) == t.predictions(out)
        time_major = UserImageReader(replace(spec, decoding=replace(spec.decoding,
                                                                     time_major=True)))
        assert time_major.answers(out.transpose(1, 0, 2)) == t.predictions(out)
    assert len(widths) > 1 and min(widths) >= 160 and all(w % 8 == 0 for w in widths)
    # a record naming an image step this code lacks (written by another version): one line
    from pipeline.core.errors import ConfigError
    from pipeline.serve import artifact

    record = spec.to_dict()
    other = {**record, "image": {**record["image"], "sharpen": 2}}
    config = {"model": {"source": "onnx", "name": "rec"}}
    with pytest.raises(ConfigError, match="preprocessing cannot be rebuilt by this code.*sharpen"):
        artifact._served("rec:v1", model, config, other, None, None, {}, None)
    # a step this code knows, of a value its checks refuse: the check's own words
    odd = {**record, "image": {**record["image"], "interpolation": "magic"}}
    with pytest.raises(ConfigError, match="cannot be rebuilt.*data.image.interpolation"):
        artifact._served("rec:v1", model, config, odd, None, None, {}, None)
    served = artifact._served("rec:v1", model, config, json.loads(json.dumps(record)), None,
                              None, {}, None)
    assert served.spec == spec and served.reader_key == spec  # read back as it was written


def test_classes_answer_scores_are_probabilities_once():
    """A classifier whose graph ends in a softmax answers its own probabilities; logits get
    theirs; the label names the class."""
    from pipeline.serve.readers import classes_answers

    probs = np.asarray([[0.1, 0.7, 0.2]], np.float32)
    a, = classes_answers(probs, ["cat", "dog", "eel"], 2)
    assert (a["class"], a["label"], a["top_k"]) == (1, "dog", [1, 2])
    assert a["score"] == pytest.approx(0.7, abs=1e-6)
    b, = classes_answers(np.log(probs) + 3.0, None, 5)
    assert (b["class"], b["label"], b["top_k"]) == (1, "1", [1, 2, 0])
    assert b["score"] == pytest.approx(0.7, abs=1e-5)


def _identity(path: Path, inputs: dict) -> Path:
    """Each input's shape as given; the output is the first input, unchanged."""
    import onnx
    from onnx import TensorProto, helper

    first = next(iter(inputs))
    graph = helper.make_graph(
        [helper.make_node("Identity", [first], ["y"])], "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, inputs[first])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_a_model_of_arrays_is_read_from_json_as_evaluated(tmp_path):
    """Inputs that are a table's number lists (audio frames, byte features): one sample's arrays
    by input name in a JSON body, padded in a batch as the evaluation padded them, answered as
    the metric reads the output; a body that does not fit is one 400 line naming the input."""
    from pipeline.serve.inputs import BadInput, Limits
    from pipeline.serve.readers import UserArraysReader
    from pipeline.serve.slo import request_bodies

    model = _identity(tmp_path / "m.onnx", {"x": ["batch", "time"], "z": ["batch", 2]})
    table = tmp_path / "t.jsonl"
    rng = np.random.default_rng(1)
    table.write_text("".join(json.dumps({"x": rng.normal(size=int(n)).round(3).tolist(),
                                         "z": [1.0, 2.0]}) + "\n"
                             for n in rng.integers(3, 9, 10)))
    t = _task(tmp_path / "dd", "model=onnx", f"model.path={model}", "data=jsonl",
              f"data.path={table}", "data.calibration_samples=2", "data.evaluation_samples=8",
              "data.image.pad_width_multiple=4", "metric=agreement")
    spec = t.serving_spec()
    assert spec.reader == "arrays" and spec.size_axis == ("x", 1)
    assert [i.name for i in spec.inputs] == ["x", "z"] and t.not_served is None
    reader = UserArraysReader(spec)
    ds = t.dataset(t.split("evaluation", 8, ""))
    limits = Limits(1 << 20, 1, 1)
    bodies = request_bodies(t, ds, 8)  # as a client holding arrays sends them: numpy's .npz
    assert all(b[:4] == b"PK\x03\x04" for b in bodies)
    prepared = [reader.prepare(b, "application/octet-stream", limits) for b in bodies]
    for k, sample in enumerate(t._arrays(ds, list(range(8)))):  # JSON numbers: the same feeds
        body = json.dumps({"inputs": {n: a.tolist() for n, a in sample.items()}}).encode()
        as_json = reader.prepare(body, "application/json", limits).feeds
        assert all(np.array_equal(as_json[n], prepared[k].feeds[n]) for n in ("x", "z")), k
    for k, p in enumerate(prepared):  # each alone: the evaluation's batch of one
        expected = next(t.batches(ds.select([k]), 1)).feeds
        alone = reader.stack([p.feeds])
        assert all(np.array_equal(alone[n], a) for n, a in expected.items()), k
        assert p.size == p.feeds["x"].shape[1]  # the batcher's shape class: x's length
    batch = reader.stack([p.feeds for p in prepared])  # several: padded as evaluated
    evaluated = next(t.batches(ds, 8, sort=False)).feeds
    assert all(np.array_equal(batch[n], evaluated[n]) for n in ("x", "z"))
    assert batch["x"].shape[1] % 4 == 0
    assert reader.answers(batch["x"]) == t.predictions(batch["x"])
    assert [a.shape for a in reader.example().values()] == [
        (1, *spec.example["x"]), (1, 2)]
    bad = {b'{"inputs": {"x": [1, 2]}}': "one array for each of the model's inputs ['x', 'z']",
           b'{"inputs": {"x": [[1]], "z": [1, 2]}}': "input x: an array of shape [1, 1]",
           b'{"inputs": {"x": [1], "z": [1, 2, 3]}}': "the model takes [2] for one sample",
           b'{"inputs": {"x": ["a"], "z": [1, 2]}}': "input x: not an array of float32",
           b'{"inputs": {"x": [NaN], "z": [1, 2]}}': "input x: holds NaN or infinity",
           b"not json": "not valid JSON",
           b'{"inputs": {"x": ' + b"[" * 5000 + b"]" * 5000 + b"}}": "nested too deeply"}
    for body, words in bad.items():
        with pytest.raises(BadInput) as e:
            reader.prepare(body, "application/json", limits)
        assert e.value.status == 400 and words in e.value.line, e.value.line

    def npz(**arrays) -> bytes:
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        return buf.getvalue()

    def npy(a, **kw) -> bytes:
        buf = io.BytesIO()
        np.save(buf, a, **kw)
        return buf.getvalue()

    lying = npy(np.zeros(4, np.float32)).replace(b"(4,)", b"(9,)")  # its header: 9 values
    bomb = io.BytesIO()
    np.savez_compressed(bomb, x=np.zeros(1 << 19, np.float32), z=np.zeros(2, np.float32))
    bad = {npy(np.zeros(4, np.float32)): (400, "a .npy body holds one array; the model's "
                                               "inputs are ['x', 'z']"),
           npz(x=np.zeros(4, np.float32)): (400, "the numpy body holds ['x']"),
           npz(x=np.zeros(4, np.float32), z=np.zeros(3, np.float32)):
               (400, "the model takes [2] for one sample"),
           npz(x=np.array([None, 1], dtype=object), z=np.zeros(2)): (400, "never read"),
           b"PK\x03\x04 truncated": (400, "not a readable .npz"),
           bomb.getvalue(): (413, "uncompressed, over --max-body-bytes=1048576")}
    for body, (status, words) in bad.items():
        with pytest.raises(BadInput) as e:
            reader.prepare(body, "application/octet-stream", limits)
        assert (e.value.status, words in e.value.line) == (status, True), e.value.line
    from pipeline.serve.inputs import numpy_inputs

    with pytest.raises(BadInput, match=r"its .npy header says \[9\] float32 \(36 bytes\) and "
                                       r"16 bytes follow"):
        numpy_inputs(lying, limits, ["x"])
    with pytest.raises(BadInput, match=r"input x: not a .npy array"):
        numpy_inputs(lying[:8] + b"\0" + lying[9:], limits, ["x"])  # its header's length: 0
    one = numpy_inputs(npy(np.arange(3, dtype=np.float32)), limits, ["x"])
    assert one["x"].tolist() == [0.0, 1.0, 2.0]


def test_an_image_beside_other_inputs_is_read_from_json_as_evaluated(tmp_path):
    """An image input beside an array input (a detector fed its image and its scale factors):
    one JSON body holds the arrays and the image file's bytes in base64; each request alone is
    the evaluation's batch of one, several are padded as its batches were; the record reads
    back as written; bad image values are one 400 line naming the input. Two image inputs are
    not served, and say why."""
    import base64

    import datasets
    from PIL import Image

    from pipeline.core.errors import ConfigError
    from pipeline.serve import artifact, slo
    from pipeline.serve.inputs import BadInput, Limits
    from pipeline.serve.readers import UserArraysReader

    model = _identity(tmp_path / "m.onnx", {"image": ["batch", 3, 8, "width"], "x": ["batch", 4]})
    rng = np.random.default_rng(3)
    images = [Image.fromarray(rng.integers(0, 256, (8, int(w), 3), dtype=np.uint8))
              for w in rng.integers(5, 12, 8)]
    datasets.Dataset.from_dict({"image": images, "x": [[float(k)] * 4 for k in range(8)]}) \
        .save_to_disk(str(tmp_path / "saved"))
    args = ("model=onnx", f"model.path={model}", "data=saved", f"data.path={tmp_path / 'saved'}",
            "data.calibration_samples=2", "data.evaluation_samples=6", "metric=agreement",
            "data.image.pad_width_multiple=4")
    t = _task(tmp_path / "dd", *args)
    spec = t.serving_spec()
    assert spec.reader == "arrays" and spec.image_input.name == "image" and t.not_served is None
    assert spec.image_input.sample_size == images[0].size
    config = {"model": {"source": "onnx", "name": "m"}}
    served = artifact._served("m:v1", model, config, json.loads(json.dumps(spec.to_dict())),
                              None, None, {}, None)
    assert served.reader_key == spec and "image an image file" in served.what
    reader = UserArraysReader(spec)
    ds = t.dataset(t.split("evaluation", 6, ""))
    bodies = slo.request_bodies(t, ds, 6)
    limits = Limits(1 << 20, 1 << 20, 1 << 12, 1 << 20)
    prepared = [reader.prepare(b, "application/json", limits) for b in bodies]
    for k, p in enumerate(prepared):  # each alone: the evaluation's batch of one
        expected = next(t.batches(ds.select([k]), 1)).feeds
        alone = reader.stack([p.feeds])
        assert all(np.array_equal(alone[n], a) for n, a in expected.items()), k
    batch = reader.stack([p.feeds for p in prepared])  # several: padded as evaluated
    evaluated = next(t.batches(ds, 6, sort=False)).feeds
    assert all(np.array_equal(batch[n], evaluated[n]) for n in ("image", "x"))
    assert len({p.feeds["image"].shape[3] for p in prepared}) > 1  # widths differ: padded
    assert reader.answers(batch["image"]) == t.predictions(batch["image"])
    warm = reader.example()
    assert warm["image"].shape[:3] == (1, 3, 8) and warm["x"].shape == (1, 4)
    # the input-size limit: an image brought to a fixed size is bounded by its steps (a
    # detector's 3x928x928 is over the default limit and must still be served, warm-up first);
    # an image of any width is checked like any input
    few = Limits(1 << 20, 1 << 20, 1 << 12, 100)
    fixed = replace(spec, image_input=replace(spec.image_input, steps=replace(
        spec.image_input.steps, resize="fixed", height=8, width=12)))
    assert UserArraysReader(fixed).prepare(bodies[0], "application/json", few).feeds[
        "image"].shape == (1, 3, 8, 12)
    # so is an array of fixed sizes (x is [batch, 4]): a YOLO's 3x320x320 sent as numbers
    three = Limits(1 << 20, 1 << 20, 1 << 12, 3)
    assert UserArraysReader(fixed).prepare(bodies[0], "application/json", three).feeds[
        "x"].shape == (1, 4)
    with pytest.raises(BadInput) as e:
        reader.prepare(bodies[0], "application/json", few)
    assert e.value.status == 413 and "over the limit of 100" in e.value.line
    good = json.loads(bodies[0])["inputs"]
    text = base64.b64encode(b"not an image at all").decode()
    bad = {"a list": ([1, 2], 'input image: an image file is sent as {"b64"'),
           "bad base64": ({"b64": "%%%"}, "input image: not valid base64"),
           "not an image": ({"b64": text}, "input image: body is not a PNG or JPEG image")}
    for case, (value, words) in bad.items():
        body = json.dumps({"inputs": {**good, "image": value}}).encode()
        with pytest.raises(BadInput) as e:
            reader.prepare(body, "application/json", limits)
        assert e.value.status == 400 and words in e.value.line, (case, e.value.line)
    with pytest.raises(BadInput) as e:  # the image file itself as the body: JSON is asked for
        reader.prepare(base64.b64decode(good["image"]["b64"]), "image/png", limits)
    assert e.value.status == 415 and "image image in base64" in e.value.line

    # two image inputs: not served, said before any stage, and by the server
    model2 = _identity(tmp_path / "m2.onnx", {"image": ["batch", 3, 8, 8],
                                              "mask": ["batch", 3, 8, 8]})
    datasets.Dataset.from_dict({"image": images[:4], "mask": images[:4]}) \
        .save_to_disk(str(tmp_path / "saved2"))
    t2 = _task(tmp_path / "dd2", "model=onnx", f"model.path={model2}", "data=saved",
               f"data.path={tmp_path / 'saved2'}", "data.calibration_samples=2",
               "data.evaluation_samples=2", "metric=agreement", "data.image.resize=fixed",
               "data.image.height=8", "data.image.width=8")
    assert t2.serving_spec() is None
    assert "has 2 inputs read from images (image, mask)" in t2.not_served
    with pytest.raises(ConfigError, match="^slo.mode=serve: .*read from images.*slo.mode=model"):
        slo.preflight(t2)
    with pytest.raises(ConfigError, match="recorded no serving spec"):
        artifact._served_as("m:v1", model2, config, None, None, None, {}, None)
