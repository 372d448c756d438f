"""A detector's raw head judged by its detections (``metric=agreement metric.detections=yolo``):
boxes decoded from [4 + classes, anchors] at the score threshold, suppressed within a class,
and a candidate's detections matched to the baseline's (same class, IoU 0.5); the task's metrics,
predictions and served answers read them; a head of the wrong shape, an unknown layout or the
layout under another metric is one line."""
from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.metrics import detection


def decode(row, score: float, iou: float, nms: str = "per_class") -> list[dict]:
    return detection.Head("yolo", score, iou, nms).decode(row)


def _head(anchors: list[tuple], classes: int = 2, count: int = 32) -> np.ndarray:
    """[4 + classes, count]: each anchor given (cx, cy, w, h, class, score), the rest empty
    (there are more anchors than channels: how the layout is told from its transpose)."""
    x = np.zeros((4 + classes, count), np.float32)
    for k, (cx, cy, w, h, c, s) in enumerate(anchors):
        x[:4, k] = cx, cy, w, h
        x[4 + c, k] = s
    return x


HEAD = _head([(50, 50, 20, 20, 0, 0.9),    # kept
              (52, 50, 20, 20, 0, 0.6),    # the same object, weaker: suppressed
              (52, 50, 20, 20, 1, 0.5),    # same place, another class: kept
              (150, 80, 10, 30, 1, 0.3),   # kept
              (10, 10, 5, 5, 0, 0.2)])     # under the threshold


def test_a_head_decodes_into_boxes_best_first_suppressed_within_a_class():
    found = decode(HEAD, 0.25, 0.45)
    assert [(d["class"], d["score"]) for d in found] == [(0, 0.9), (1, 0.5), (1, 0.3)]
    assert found[0]["box"] == [40.0, 40.0, 60.0, 60.0] and found[2]["box"] == [145, 65, 155, 95]
    assert decode(HEAD.T, 0.25, 0.45) == found  # [anchors, 4 + classes] too
    assert decode(HEAD, 0.95, 0.45) == []
    assert len(decode(HEAD, 0.25, 0.99)) == 4  # nothing overlaps that much
    # across classes (code that calls cv2.dnn.NMSBoxes without class ids): the 1 at the 0's
    # place goes too
    assert [(d["class"], d["score"]) for d in decode(HEAD, 0.25, 0.45, "all")] == \
        [(0, 0.9), (1, 0.3)]
    assert detection.decision(found) == "[0, 1, 1]"
    with pytest.raises(ValueError, match=r"\[4 \+ classes, anchors\]"):
        detection.head(np.zeros((1, 6, 5)))


def test_detections_are_matched_by_class_and_overlap():
    base = decode(HEAD, 0.25, 0.45)
    assert detection.f1([base], [base]) == 100.0 and detection.f1([[]], [[]]) == 100.0
    assert detection.f1([base], [base[:2]]) == pytest.approx(100 * 4 / 5)  # one lost
    moved = [{**d, "box": [v + 15 for v in d["box"]]} for d in base]       # IoU 0.14
    assert detection.f1([base], [moved]) == 0.0
    other = [{**d, "class": 1 - d["class"]} for d in base]
    # the two overlapping boxes of either class still find each other; the third finds none
    assert detection.f1([base], [other]) == pytest.approx(100 * 4 / 6)


def test_the_layout_is_checked_when_the_config_is_made():
    from pipeline.core.errors import ConfigError
    from pipeline.engine.compose import compose

    data = ["model=onnx", "model.path=m.onnx", "data=saved", "data.path=d"]
    with pytest.raises(ConfigError, match="metric.detections=ssd: valid choices: yolo"):
        compose([*data, "metric=agreement", "metric.detections=ssd"])
    with pytest.raises(ConfigError, match="metric=agreement, not metric=classification"):
        compose([*data, "metric=classification", "metric.detections=yolo"])
    with pytest.raises(ConfigError, match="metric.nms=none: valid choices: per_class, all"):
        compose([*data, "metric=agreement", "metric.detections=yolo", "metric.nms=none"])
    with pytest.raises(ConfigError, match="metric.score_threshold=1.5: must be between 0 and 1"):
        compose([*data, "metric=agreement", "metric.detections=yolo",
                 "metric.score_threshold=1.5"])


def _identity_run(tmp_path, rows: list, shape: list, layout: str):
    """An identity graph of ``shape`` over ``rows`` written into the data, read as
    ``metric.detections=layout``: the task, its arguments, the model and the evaluation's batch."""
    import datasets

    from tests.test_serve_user_image import _identity, _task

    datasets.Dataset.from_dict({"x": rows}).save_to_disk(str(tmp_path / "saved"))
    model = _identity(tmp_path / "m.onnx", {"x": shape})
    args = ("model=onnx", f"model.path={model}", "data=saved", f"data.path={tmp_path / 'saved'}",
            "data.calibration_samples=2", "data.evaluation_samples=6", "metric=agreement",
            f"metric.detections={layout}")
    t = _task(tmp_path / "first", *args)
    return t, args, model, next(t.batches(t.dataset(t.split("evaluation", 6, "")), 6, sort=False))


def test_a_detectors_run_judges_and_serves_its_detections(tmp_path):
    """An identity graph over heads written into the data: the task's primary metric is
    detection_f1, its predictions the decoded boxes; a candidate that lost a detection scores
    under 100 where the outputs' cosine barely moves; the served answer is the boxes, as
    evaluated, read back through the serving record."""
    import datasets

    from pipeline.core.errors import ConfigError
    from pipeline.serve import artifact
    from pipeline.serve.readers import UserArraysReader
    from tests.test_serve_user_image import _identity, _task

    rng = np.random.default_rng(0)
    heads = []
    for _ in range(8):
        x = rng.uniform(0, 0.05, (6, 64)).astype(np.float32)  # background: no detection
        x[:4] = rng.uniform(20, 200, (4, 64))
        x[4 + rng.integers(0, 2), rng.integers(0, 64, 3)] = rng.uniform(0.5, 0.95, 3)
        heads.append(x)
    t, args, model, batch = _identity_run(tmp_path, heads, ["batch", 6, 64], "yolo")
    assert t.metrics.primary == "detection_f1"
    preds = t.predictions(batch.feeds["x"])
    assert all(1 <= len(p["detections"]) <= 3 for p in preds)
    truth = list(batch.feeds["x"])
    same = t.score(preds, truth)
    assert same["detection_f1"] == 100.0
    assert same["detections_found"] == sum(len(p["detections"]) for p in preds)
    weaker = batch.feeds["x"].copy()
    k = int(np.argmax(weaker[0, 4:].max(axis=0)))
    weaker[0, 4:, k] = 0.1  # the first sample's best detection falls under the threshold
    scores = t.score(t.predictions(weaker), truth)
    assert scores["detection_f1"] < 100.0 and scores["cosine_mean"] > 0.99
    # served: the boxes as evaluated, not the raw head
    spec = t.serving_spec()
    assert (spec.decoding.detections, spec.decoding.score_threshold) == ("yolo", 0.25)
    served = artifact._served("m:v1", model, {"model": {"source": "onnx", "name": "m"}},
                              json.loads(json.dumps(spec.to_dict())), None, None, {}, None)
    answers = UserArraysReader(served.reader_key).answers(batch.feeds["x"])
    assert answers == [{"detections": p["detections"], "decision": p["decision"]}
                       for p in preds]
    # the one input read from the column named like it (data.input_column=image is none);
    # neither there: one line naming both
    datasets.Dataset.from_dict({"y": heads}).save_to_disk(str(tmp_path / "other"))
    with pytest.raises(ConfigError, match=r"data.input_column=image: not a column of .*other, "
                                          r"nor is the model's input x \(columns: y\)"):
        _task(tmp_path / "dd3", *args[:2], "data=saved", f"data.path={tmp_path / 'other'}",
              *args[4:])
    # read as numbers, the run says what the shape suggests
    plain = _task(tmp_path / "dd4", *args[:-1])
    assert plain.metrics.primary == "argmax_agreement"
    assert any("before any suppression, metric.detections=yolo, yolov5 or yolox (as its head "
               "is laid out) judges the boxes" in w for w in plain.warnings)
    flat = _identity(tmp_path / "flat.onnx", {"x": ["batch", 3]})
    with pytest.raises(ConfigError, match=r"yolo: its head is \[batch, 4 \+ classes, anchors\]"):
        _task(tmp_path / "dd2", *args[:1], f"model.path={flat}", *args[2:])


def test_the_verdict_says_when_one_detection_outweighs_the_limit():
    """26 baseline detections: one lost is 100 / 51 = 1.96 points, past the 1-point default;
    the check says so (and passes or fails as the limit says). 200 of them: nothing to say.
    A limit on detection_f1 is a known metric when the config is made."""
    from pipeline.engine.compose import compose
    from pipeline import gate
    from pipeline.config import GateConfig
    from pipeline.task.contract import MetricsSpec

    specs = MetricsSpec((detection.SPECS["detection_f1"], detection.SPECS["detections_found"]),
                        "detection_f1")
    for n, says in ((26, True), (200, False)):
        one_lost = 100 * 2 * (n - 1) / (2 * n - 1)
        m = gate.Measures(reference="FP16", speed=None,
                          reference_metrics={"detection_f1": 100.0, "detections_found": n},
                          candidate_metrics={"detection_f1": one_lost, "detections_found": n - 1})
        check = gate._accuracy(m, GateConfig(), specs)[0]
        assert ("one found or lost moving it 1.96 points" in check.detail) == says, check.detail
        assert check.passed == (not says)
    cfg = compose(["model=onnx", "model.path=m.onnx", "data=saved", "data.path=d",
                   "metric=agreement", "metric.detections=yolo",
                   "gate.max_accuracy_drop={detection_f1: 3}"])
    assert cfg.gate.max_accuracy_drop == {"detection_f1": 3}


def test_a_served_box_is_mapped_back_into_the_posted_image():
    """A bright square at x 30..50, y 10..20 of a 90x30 photo, letterboxed into 48x48: where it
    lands in the input, read from the pixels, mapped back through the request's geometry, is
    where it was (to a pixel); the geometry crosses a worker's frame whole; clipped to the
    image; an answer without detections is left as it is."""
    from PIL import Image

    from pipeline.config.data import ImagePrep
    from pipeline.data import images
    from pipeline.serve.inputs import Prepared
    from pipeline.serve.readers import ImageSteps, in_image
    from pipeline.serve.workers import answer, prepared_frame, split

    a = np.zeros((30, 90, 3), np.uint8)
    a[10:20, 30:50] = 255
    photo = Image.fromarray(a)
    for resize in ("letterbox", "fixed"):
        prep = ImagePrep(resize=resize, height=48, width=48, letterbox_fill=0,
                         interpolation="nearest")
        steps = ImageSteps("x", "float32", ("batch", 3, 48, 48), prep)
        x = images.to_array(photo, prep)[0]
        ys, xs = np.nonzero(x > 0.5)
        box = [float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1)]
        geometry = steps.geometry(photo)
        whole = prepared_frame(7, Prepared({"x": x[None]}, 48, 0.1, 0.2, geometry))
        header, payload = split(whole[:])
        assert answer(header, payload).geometry == geometry
        mapped = in_image({"detections": [{"box": box}]}, geometry)["detections"][0]
        assert np.allclose(mapped["image_box"], [30, 10, 50, 20], atol=1.0), (resize, mapped)
    wide = in_image({"detections": [{"box": [-5.0, 0.0, 60.0, 48.0]}]}, geometry)
    assert wide["detections"][0]["image_box"] == [0.0, 0.0, 90.0, 30.0]  # clipped
    assert in_image({"decision": "[]", "output": [1.0]}, geometry) == {"decision": "[]",
                                                                      "output": [1.0]}


def _objectness_head(objects: list[tuple], classes: int = 2, count: int = 84) -> np.ndarray:
    """[count, 5 + classes] (YOLOv5's and YOLOX's layout): each object given (anchor, x, y, w,
    h, objectness, class, score), the rest empty."""
    x = np.zeros((count, 5 + classes), np.float32)
    for k, cx, cy, w, h, obj, c, s in objects:
        x[k, :5] = cx, cy, w, h, obj
        x[k, 5 + c] = s
    return x


def test_an_objectness_head_scores_each_class_times_the_objectness():
    """yolov5: boxes already in pixels; an anchor's class score is objectness x the class's:
    0.8 x 0.9 = 0.72 is kept, 0.9 x 0.2 = 0.18 is not, though either number alone passes."""
    x = _objectness_head([(3, 40, 24, 32, 16, 0.8, 1, 0.9), (9, 10, 10, 8, 8, 0.9, 0, 0.2),
                          (12, 41, 24, 32, 16, 0.7, 1, 0.8)])  # the first one's weaker twin
    read = detection.Head("yolov5", 0.25, 0.45)
    found = read.decode(x)
    assert [(d["class"], d["score"]) for d in found] == [(1, 0.72)]
    assert found[0]["box"] == [24.0, 16.0, 56.0, 32.0]
    assert read.decode(x.T) == found  # [5 + classes, anchors] too
    with pytest.raises(ValueError, match=r"a yolov5 head's output is \[5 \+ classes, anchors\]"):
        read.decode(x[None])


def test_a_raw_yolox_head_is_decoded_on_its_strides_grids():
    """A 64x64 input's grids: 8x8 cells at stride 8, 4x4 at 16, 2x2 at 32 (84 anchors, level
    after level, row by row). An offset (0.5, 0.5) in cell (2, 1) of stride 16 (anchor 64 + 4 +
    2) with log sizes (log 2, 0) is a 32x16 box centred at (40, 24), as YOLOX's demo decodes
    it; the grids of another input size or anchor count are refused."""
    raw = _objectness_head([(70, 0.5, 0.5, np.log(2), 0.0, 0.8, 1, 0.9)])
    read = detection.Head("yolox", 0.25, 0.45, "all", (64, 64))
    assert read.decode(raw) == [{"class": 1, "score": 0.72, "box": [24.0, 16.0, 56.0, 32.0]}]
    assert detection.grid_strides(84, 64, 64) == (8, 16, 32)
    assert detection.grid_strides(85, 64, 64) == (8, 16, 32, 64)  # P6: one 64-pixel cell more
    assert detection.grid_strides(84, 64, 32) is None
    with pytest.raises(ValueError, match="not the grids of a 64x32 input"):
        detection.Head("yolox", 0.25, 0.45, "all", (64, 32)).decode(raw)
    # YOLOX's suppression counts sides in whole pixels: two 10-pixel boxes 4 apart overlap at
    # 60 / 140 = 0.43 as areas, at 77 / 165 = 0.47 as pixels; one goes at 0.45
    boxes, groups = np.array([[0, 0, 10, 10], [4, 0, 14, 10]], np.float32), np.zeros(2, int)
    assert detection.nms(boxes, np.array([0.9, 0.8]), groups, 0.45) == [0, 1]
    assert detection.nms(boxes, np.array([0.9, 0.8]), groups, 0.45, pixels=True) == [0]
    for bad in ({"layout": "ssd"}, {"layout": "yolox"}):  # unknown; grids of no size
        with pytest.raises(ValueError, match="ssd|input_size"):
            detection.Head(**bad)
    ruined = raw.copy()
    ruined[:, 2:4] = 1e4  # exp overflows: infinite boxes, no warning, still decoded
    assert len(detection.Head("yolox", 0.25, 0.45, "all", (64, 64)).decode(ruined)) == 1


def _image_rows(path, size, rows: int, cols: int):
    """An ONNX file: [b, 3, h, w] -> its first rows x cols values, as [b, rows, cols]."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("Flatten", ["images"], ["flat"]),
         helper.make_node("Slice", ["flat", "zero", "end", "one"], ["part"]),
         helper.make_node("Reshape", ["part", "shape"], ["y"])], "g",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["batch", 3, *size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", rows, cols])],
        [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
         (("zero", [0]), ("end", [rows * cols]), ("one", [1]), ("shape", [-1, rows, cols]))])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.save(m, str(path))
    return path


def test_a_yolox_run_reads_its_grids_from_the_models_input(tmp_path):
    """The task reads a yolox head's grid size from the model's fixed image input, decodes the
    evaluation's outputs on it, records it for the server (which answers the same boxes), and
    refuses, at task build, an input whose size the graph leaves open or an output that is not
    that input's grids."""
    import datasets

    from pipeline.core.errors import ConfigError
    from pipeline.serve import artifact
    from pipeline.serve.readers import UserArraysReader
    from tests.test_serve_user_image import _task

    def model(path, size, anchors=84):
        return _image_rows(path, size, anchors, 7)

    rng = np.random.default_rng(1)
    rows = []
    for _ in range(8):
        head = _objectness_head([(int(k), *rng.uniform(0, 1, 2), *rng.uniform(-0.5, 0.5, 2),
                                  rng.uniform(0.6, 1), int(rng.integers(0, 2)),
                                  rng.uniform(0.6, 1)) for k in rng.choice(84, 3, replace=False)])
        image = np.zeros(3 * 64 * 64, np.float32)
        image[:head.size] = head.ravel()
        rows.append(image.reshape(3, 64, 64))
    datasets.Dataset.from_dict({"images": rows}).save_to_disk(str(tmp_path / "saved"))
    args = ("data=saved", f"data.path={tmp_path / 'saved'}", "data.calibration_samples=2",
            "data.evaluation_samples=6", "metric=agreement", "metric.detections=yolox",
            "metric.nms=all")
    path = model(tmp_path / "m.onnx", (64, 64))
    t = _task(tmp_path / "d1", "model=onnx", f"model.path={path}", *args)
    assert t.metrics.primary == "detection_f1" and t.detection_head().input_size == (64, 64)
    batch = next(t.batches(t.dataset(t.split("evaluation", 6, "")), 6, sort=False))
    out = batch.feeds["images"].reshape(6, -1)[:, :84 * 7].reshape(6, 84, 7)
    preds = t.predictions(out)
    want = [detection.Head("yolox", 0.25, 0.45, "all", (64, 64)).decode(o) for o in out]
    assert [p["detections"] for p in preds] == want and all(want)
    assert t.score(preds, list(out))["detection_f1"] == 100.0
    spec = t.serving_spec()
    assert spec.decoding.input_size == (64, 64) and spec.decoding.detections == "yolox"
    served = artifact._served("m:v1", path, {"model": {"source": "onnx", "name": "m"}},
                              json.loads(json.dumps(spec.to_dict())), None, None, {}, None)
    answers = UserArraysReader(served.reader_key).answers(out)
    assert [a["detections"] for a in answers] == want
    # read as numbers, the transposed head ([batch, anchors, 5 + classes]) is named too
    plain = _task(tmp_path / "d4", "model=onnx", f"model.path={path}", *args[:5])
    assert plain.metrics.primary == "argmax_agreement"
    assert any("yolo, yolov5 or yolox" in w for w in plain.warnings), plain.warnings
    with pytest.raises(ConfigError, match=r"yolox: the head's boxes are on grids over the "
                                          r"input's height and width, which .* does not fix"):
        _task(tmp_path / "d2", "model=onnx",
              f"model.path={model(tmp_path / 'open.onnx', ('h', 'w'))}", *args)
    with pytest.raises(ConfigError, match=r"is not the grids of its 64x64 input .* "
                                          r"metric.detections=yolov5"):
        _task(tmp_path / "d3", "model=onnx",
              f"model.path={model(tmp_path / 'odd.onnx', (64, 64), anchors=80)}", *args)


def test_an_end_to_end_graphs_rows_are_its_detections_as_selected():
    """[detections, 6+]: the rows at the threshold, best first, nothing suppressed again (two
    overlapping boxes of one class both kept: the graph chose them); a row with a number that is
    not finite is none, a class the nearest whole number, columns past the sixth unread."""
    x = np.zeros((300, 8), np.float32)  # padding rows score 0
    x[0] = [10, 10, 50, 50, 0.3, 2.0000002, 9, 9]
    x[1] = [12, 12, 52, 52, 0.9, 2, 0, 0]
    x[2] = [1, 1, 5, 5, np.nan, 1, 0, 0]
    x[3] = [1, 1, 5, np.inf, 0.8, 1, 0, 0]
    x[4] = [1, 1, 5, 5, 0.2, 1, 0, 0]
    assert detection.Head("end2end").decode(x) == [
        {"class": 2, "score": 0.9, "box": [12.0, 12.0, 52.0, 52.0]},
        {"class": 2, "score": 0.3, "box": [10.0, 10.0, 50.0, 50.0]}]
    assert [d["score"] for d in detection.Head("end2end", 0.15).decode(x)] == [0.9, 0.3, 0.2]
    with pytest.raises(ValueError, match=r"end2end output is \[detections, 6\] .* got \[300, 5\]"):
        detection.Head("end2end").decode(x[:, :5])


def test_an_end_to_end_run_judges_and_serves_the_rows_its_graph_selected(tmp_path):
    """An identity graph over rows written into the data, [batch, 300, 6]: judged by
    detection_f1 on the selected rows, served as evaluated; a shape no end-to-end exporter
    writes (a head's anchors as rows or as columns, a flat output) refused at task build; read
    as numbers, the run names the layout."""

    from pipeline.core.errors import ConfigError
    from pipeline.serve import artifact
    from pipeline.serve.readers import UserArraysReader
    from tests.test_serve_user_image import _identity, _task

    rng = np.random.default_rng(2)
    rows = []
    for _ in range(8):
        x = np.zeros((300, 6), np.float32)
        n = int(rng.integers(1, 5))
        corner = rng.uniform(0, 200, (n, 2))
        x[:n, :2], x[:n, 2:4] = corner, corner + rng.uniform(10, 60, (n, 2))
        x[:n, 4] = np.sort(rng.uniform(0.3, 0.95, n))[::-1]
        x[:n, 5] = rng.integers(0, 80, n)
        rows.append(x)
    t, args, model, batch = _identity_run(tmp_path, rows, ["batch", 300, 6], "end2end")
    assert t.metrics.primary == "detection_f1"
    preds = t.predictions(batch.feeds["x"])
    assert [len(p["detections"]) for p in preds] == [
        int((r[:, 4] >= 0.25).sum()) for r in batch.feeds["x"]]
    truth = list(batch.feeds["x"])
    assert t.score(preds, truth)["detection_f1"] == 100.0
    moved = batch.feeds["x"].copy()
    moved[0, 0, 5] += 1  # the first sample's best detection named another class
    assert t.score(t.predictions(moved), truth)["detection_f1"] < 100.0
    spec = t.serving_spec()
    assert spec.decoding.detections == "end2end" and spec.decoding.input_size is None
    served = artifact._served("m:v1", model, {"model": {"source": "onnx", "name": "m"}},
                              json.loads(json.dumps(spec.to_dict())), None, None, {}, None)
    answers = UserArraysReader(served.reader_key).answers(batch.feeds["x"])
    assert [a["detections"] for a in answers] == [p["detections"] for p in preds]
    plain = _task(tmp_path / "e2", *args[:-1])
    assert any("metric.detections=end2end judges the detections it selects" in w
               for w in plain.warnings), plain.warnings
    for shape, says in ((["batch", 6300, 6], r"has 6300 rows, more than an end-to-end export "
                                             r"keeps .* metric.detections=yolo, yolov5 or yolox"),
                        (["batch", 84, 8400], r"its output is \[batch, detections, 6\] .* has "
                                              r"shape \['batch', 84, 8400\]"),
                        (["batch", 3], r"has shape \['batch', 3\]")):
        other = _identity(tmp_path / f"m{shape[1]}.onnx", {"x": shape})
        with pytest.raises(ConfigError, match=says):
            _task(tmp_path / f"e{shape[1]}", args[0], f"model.path={other}", *args[2:])


def test_a_sample_agrees_when_its_detections_are_the_baselines_within_the_f1_budget():
    """The gate's output agreement for a detector: a dense page that lost one of 140 detections
    at the threshold agrees (its F1 99.6); a sparse one that lost one of five, or named one
    box's class otherwise, does not; the gate says what it counted."""
    from pipeline.config.gate import GateConfig
    from pipeline.metrics.outputs import Rule, agrees

    def page(n, classes=None):
        found = [{"class": (classes or [0] * n)[k], "score": 0.9,
                  "box": [10.0 * k, 0.0, 10.0 * k + 8, 8.0]} for k in range(n)]
        return {"decision": detection.decision(found), "detections": found}

    dense, sparse = page(140), page(5)
    assert agrees({**dense, "detections": dense["detections"][:-1]}, dense)
    assert not agrees({**sparse, "detections": sparse["detections"][:-1]}, sparse)
    assert not agrees(page(5, [0, 0, 0, 0, 1]), sparse)
    assert agrees(page(0), page(0)) and not agrees(page(1), page(0))
    # the bar is the user's budget (Rule.of the gate config): losing one of five is F1 88.9
    assert agrees({**sparse, "detections": sparse["detections"][:-1]}, sparse, Rule(sample_f1=85))
    assert not agrees({**dense, "detections": dense["detections"][:-1]}, dense,
                      Rule.of(GateConfig(max_accuracy_drop={"detection_f1": 0.2})))
    assert Rule.of(GateConfig(max_accuracy_drop=4)).sample_f1 == 96.0
    assert Rule.of(GateConfig(max_accuracy_drop={"cer": 1})).sample_f1 == detection.SAMPLE_F1


def test_a_head_layout_on_rows_shaped_like_an_end_to_end_graphs_is_told_apart(tmp_path):
    """``yolo``/``yolov5`` named for an output of [batch, up to 1000, 6]: refused where the input
    fixes its size and the rows are not a head's cells over it (one-class YOLOv5 heads have that
    shape: 252 rows over 64 x 64 pass), a warning where the size is open."""
    import datasets

    from pipeline.core.errors import ConfigError
    from tests.test_serve_user_image import _identity, _task

    def model(path, rows):
        return _image_rows(path, (64, 64), rows, 6)

    datasets.Dataset.from_dict({"images": [np.zeros((3, 64, 64), np.float32)] * 4}).save_to_disk(
        str(tmp_path / "saved"))
    data = ("data=saved", f"data.path={tmp_path / 'saved'}", "data.calibration_samples=2",
            "data.evaluation_samples=2", "metric=agreement")
    with pytest.raises(ConfigError, match=r"yolov5: .* \['batch', 300, 6\] has the shape of an "
                                          r"end-to-end graph's rows .* metric.detections=end2end "
                                          r"reads; its 300 rows are not the cells"):
        _task(tmp_path / "r1", "model=onnx", f"model.path={model(tmp_path / 'a.onnx', 300)}",
              *data, "metric.detections=yolov5")
    one_class = _task(tmp_path / "r2", "model=onnx",
                      f"model.path={model(tmp_path / 'b.onnx', 252)}", *data,
                      "metric.detections=yolov5")
    assert one_class.metrics.primary == "detection_f1"
    open_size = _identity(tmp_path / "c.onnx", {"x": ["batch", 300, 6]})
    datasets.Dataset.from_dict({"x": [np.zeros((300, 6), np.float32)] * 4}).save_to_disk(
        str(tmp_path / "rows"))
    t = _task(tmp_path / "r3", "model=onnx", f"model.path={open_size}", "data=saved",
              f"data.path={tmp_path / 'rows'}", *data[2:], "metric.detections=yolo")
    assert any("cannot be checked against a head's grids" in w for w in t.warnings), t.warnings
