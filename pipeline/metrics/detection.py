"""A detector's raw head read as detections, and how closely a candidate's follow the baseline's.

In: one sample's output of a YOLO-style head, laid out as ``metric.detections`` says:

- ``yolo``: ``[4 + classes, anchors]``, each anchor's box (centre x, centre y, width, height, in
  the input's pixels) and each class's score, already activated, as Ultralytics' YOLOv8 and later
  export it;
- ``yolov5``: ``[anchors, 5 + classes]``, the box, then an objectness score, then each class's
  score given an object (YOLOv5 and YOLOv7 exports): an anchor's score for a class is their
  product;
- ``yolox``: as ``yolov5``, but the box still on the head's grids (YOLOX exported without its
  decoding, as its own ONNX demo reads it): the centre is an offset from its cell and the size a
  log, at strides 8, 16 and 32 (and 64: the P6 models) over the input's height and width; its
  suppression counts a box's sides in whole pixels (+1), as YOLOX's demo does;
- ``end2end``: ``[detections, 6]``, a graph that ends in its own selection (YOLOv10 and YOLO26,
  NMS-free, or an export with its suppression inside, Ultralytics' ``nms=True``): each row a box's
  corners (x1, y1, x2, y2, in the input's pixels), its score and its class; columns after the
  sixth (a segmenter's mask coefficients, a pose model's keypoints) are not read.

A head's axes may come either way (told apart by which is longer: there are more anchors than
channels). Out: ``Head.decode``, the detections a deployment reads: each anchor's best class,
kept at ``score_threshold`` and above, then non-maximum suppression at ``iou_threshold`` within
each class (or across classes, ``metric.nms=all``), as the models' own inference code decodes
them (an ``end2end`` graph's rows: those kept at the threshold, nothing suppressed again);
``f1``, for two models' detections on the same inputs, the share of detections both find (same
class, boxes overlapping at IoU 0.5 or more), pooled over the samples, in %.

Why not the raw output's argmax or cosine: a head's 2100 to 8400 anchors hold near-equal box
coordinates and scores near zero, so an argmax over them flips on rounding (FP32 against its own
FP16 copy read 94 % on a YOLOv8n), while a cosine over the whole tensor is held up by the boxes'
large coordinates and hides scores that INT8 ruined. What a user ships is the boxes.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from pipeline.task.metric import MetricSpec

MATCH_IOU = 0.5   # a candidate's box and the baseline's are the same detection at this overlap
MAX_DETECTIONS = 300  # per sample, highest scores first (Ultralytics' own default)
MAX_CANDIDATES = 30000  # boxes into the suppression, best first (Ultralytics' max_nms)

# Against FP16, which finds exactly its own detections (100): one detection in a hundred found
# or lost by the candidate passes; past it the user decides (gate.max_accuracy_drop). Beside it,
# never judged, the detections a model found over the evaluation set: what the F1 rests on (one
# found or lost among 26 moves it about 2 points, ``resolution``).
SPECS = {"detection_f1": MetricSpec("detection_f1", True, needs_labels=False, limit=1.0),
         "detections_found": MetricSpec("detections_found", True, "", needs_labels=False,
                                        limit=None, scale="detections")}


# A sample's detections agree with the baseline's (the gate's output agreement) at this F1 on
# that sample alone: the default budget. Under 100 detections on a sample that is every one of
# them; on a denser page, one crossing the score threshold is not a different answer.
SAMPLE_F1 = 100.0 - SPECS["detection_f1"].limit

# The channels before the class scores, by layout: the box, then (yolov5, yolox) the objectness
BOX_CHANNELS = {"yolo": 4, "yolov5": 5, "yolox": 5}
# YOLOX's grids: one cell per stride's step over the input; P6 models add a fourth level
GRID_STRIDES = ((8, 16, 32), (8, 16, 32, 64))
# An end-to-end graph's row: x1, y1, x2, y2, score, class (then what the task adds, unread)
END2END_COLUMNS = 6
# Rows of an end-to-end graph (Ultralytics keeps 300); a head's anchors are thousands (a
# one-class YOLOv5 at 320 x 320: 6300 rows of 6), which this layout would misread
END2END_MAX_ROWS = 1000
# Columns of an end-to-end row: 6, a segmenter's 38, a pose model's 57; a head laid out
# [channels, anchors] has thousands
END2END_MAX_COLUMNS = 64
LAYOUTS = (*BOX_CHANNELS, "end2end")


def head(row, layout: str = "yolo") -> np.ndarray:
    """One sample's output as ``[box channels + classes, anchors]``."""
    x = np.asarray(row, dtype=np.float32)
    first = BOX_CHANNELS[layout]
    if x.ndim != 2:
        raise ValueError(f"a {layout} head's output is [{first} + classes, anchors] per sample "
                         f"(or its transpose); got {list(x.shape)}")
    return x.T if x.shape[0] > x.shape[1] else x


def grid_strides(anchors: int, height: int, width: int) -> tuple[int, ...] | None:
    """The strides whose grids over a ``height`` x ``width`` input hold ``anchors`` cells, as
    YOLOX lays them out (each level's rows of cells, level after level); None if none do."""
    for strides in GRID_STRIDES:
        if sum((height // s) * (width // s) for s in strides) == anchors:
            return strides
    return None


def on_some_grid(anchors: int, height: int, width: int) -> bool:
    """Whether ``anchors`` are the cells of a YOLO head's grids over a ``height`` x ``width``
    input: strides 8, 16, 32 (64 for P6, 4 for P2), one anchor a cell (anchor-free heads) or
    three (YOLOv5, YOLOv7)."""
    layouts = (*GRID_STRIDES, (4, 8, 16, 32))
    return any(per * sum((height // s) * (width // s) for s in strides) == anchors
               for strides in layouts for per in (1, 3))


def on_grid(x: np.ndarray, height: int, width: int) -> np.ndarray:
    """A raw YOLOX head ``[5 + classes, anchors]`` with its boxes in the input's pixels: each
    centre its cell's offset plus the cell, times the stride; each size exp of it, times the
    stride (YOLOX's own ``demo_postprocess``)."""
    strides = grid_strides(x.shape[1], height, width)
    if strides is None:
        raise ValueError(f"a yolox head of {x.shape[1]} anchors is not the grids of a "
                         f"{height}x{width} input at strides 8, 16, 32 (64)")
    cells, steps = [], []
    for s in strides:
        ys, xs = np.mgrid[0:height // s, 0:width // s]
        cells.append(np.stack([xs.ravel(), ys.ravel()]))
        steps.append(np.full(xs.size, s, np.float32))
    cell, step = np.concatenate(cells, axis=1), np.concatenate(steps)
    out = x.copy()
    out[:2] = (x[:2] + cell) * step
    with np.errstate(over="ignore"):  # a ruined candidate's huge logs are boxes as wide as inf
        out[2:4] = np.exp(x[2:4]) * step
    return out


@dataclass(frozen=True)
class Head:
    """How a detector's head is read: its layout, and the thresholds and suppression its own
    inference code decodes it at. ``input_size``: the input's height and width, whose grids a
    ``yolox`` head's raw boxes are on (the task reads it from the model's fixed input)."""
    layout: str = "yolo"
    score_threshold: float = 0.25
    iou_threshold: float = 0.45
    nms: str = "per_class"
    input_size: tuple[int, int] | None = None

    def __post_init__(self):
        # a record written by hand or by another version: the server's warm-up fails in one line
        if self.layout not in LAYOUTS:
            raise ValueError(f"detections={self.layout!r}: not a head layout "
                             f"({', '.join(LAYOUTS)})")
        if self.layout == "yolox" and not self.input_size:
            raise ValueError("detections=yolox: the input's height and width (input_size), "
                             "whose grids its boxes are on, are not given")

    def decode(self, row) -> list[dict]:
        """The sample's detections, best first: ``{"class", "score", "box": [x1, y1, x2, y2]}``."""
        if self.layout == "end2end":
            return selected(row, self.score_threshold)
        x = head(row, self.layout)
        if self.layout == "yolox":
            x = on_grid(x, *self.input_size)
        first = BOX_CHANNELS[self.layout]
        scores = x[first:] * x[4] if first == 5 else x[first:]  # class given object, x object
        classes = scores.argmax(axis=0)
        best = scores[classes, np.arange(scores.shape[1])]
        keep = np.flatnonzero(best >= self.score_threshold)
        if not keep.size:
            return []
        cx, cy, w, h = x[:4, keep]
        boxes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1)
        groups = classes[keep] if self.nms == "per_class" else np.zeros(keep.size, np.int64)
        # YOLOX's demo (and code copied from it) counts a box's sides in whole pixels, +1
        picked = nms(boxes, best[keep], groups, self.iou_threshold, self.layout == "yolox")
        return [{"class": int(classes[keep[k]]), "score": round(float(best[keep[k]]), 6),
                 "box": [round(float(v), 2) for v in boxes[k]]} for k in picked]


def selected(row, score_threshold: float) -> list[dict]:
    """An end-to-end graph's rows ``[detections, 6+]`` as detections: those scoring
    ``score_threshold`` or more, best first, as the exporters' own code reads them (the padding
    rows score 0). Not suppressed again: the graph chose them. A row with a number that is not
    finite is no detection (a ruined candidate's), and a class is the nearest whole number (the
    graph casts its index to the rows' float type)."""
    x = np.asarray(row, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] < END2END_COLUMNS:
        raise ValueError(f"an end2end output is [detections, {END2END_COLUMNS}] per sample (x1, "
                         f"y1, x2, y2, score, class); got {list(x.shape)}")
    x = x[:, :END2END_COLUMNS]
    keep = np.flatnonzero(np.isfinite(x).all(axis=1) & (x[:, 4] >= score_threshold))
    keep = keep[np.argsort(-x[keep, 4], kind="stable")][:MAX_DETECTIONS]
    return [{"class": int(np.rint(x[k, 5])), "score": round(float(x[k, 4]), 6),
             "box": [round(float(v), 2) for v in x[k, :4]]} for k in keep]


def nms(boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray, iou: float,
        pixels: bool = False) -> list[int]:
    """Indices kept by greedy non-maximum suppression within each of ``classes`` (a group per
    box), best score first: at most ``MAX_DETECTIONS``, from the ``MAX_CANDIDATES`` best boxes
    (a ruined candidate whose every anchor passes the threshold is decoded in milliseconds,
    not compared 8400 x 8400 times). ``pixels``: overlaps of sides counted in whole pixels."""
    order = np.argsort(-scores, kind="stable")[:MAX_CANDIDATES]
    suppressed = np.zeros(order.size, dtype=bool)
    kept: list[int] = []
    for i, k in enumerate(order):
        if suppressed[i]:
            continue
        kept.append(int(k))
        if len(kept) == MAX_DETECTIONS:
            break
        rest = order[i + 1:]
        suppressed[i + 1:] |= (classes[rest] == classes[k]) & (
            ious(boxes[k], boxes[rest], pixels) > iou)
    return kept


def ious(box: np.ndarray, others: np.ndarray, pixels: bool = False) -> np.ndarray:
    """Intersection over union of ``box`` with each of ``others`` (x1, y1, x2, y2); ``pixels``:
    each side's length + 1, as code that counts the pixels a box covers does."""
    one = 1.0 if pixels else 0.0
    x1 = np.maximum(box[0], others[:, 0])
    y1 = np.maximum(box[1], others[:, 1])
    x2 = np.minimum(box[2], others[:, 2])
    y2 = np.minimum(box[3], others[:, 3])
    inter = np.clip(x2 - x1 + one, 0, None) * np.clip(y2 - y1 + one, 0, None)
    union = _area(box, one) + _area(others, one) - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def _area(b: np.ndarray, one: float = 0.0) -> np.ndarray:
    return (np.clip(b[..., 2] - b[..., 0] + one, 0, None)
            * np.clip(b[..., 3] - b[..., 1] + one, 0, None))


def f1(baseline: list[list[dict]], candidate: list[list[dict]]) -> float:
    """Detections both find, in % of all found (2 x matched / (baseline's + candidate's)), each
    of the candidate's matched, best score first, to the unmatched baseline box of its class
    that overlaps it most, at ``MATCH_IOU`` or more. 100 when neither finds anything."""
    matched = found = 0
    for ref, cand in zip(baseline, candidate):
        found += len(ref) + len(cand)
        free = list(range(len(ref)))
        for d in cand:
            same = [j for j in free if ref[j]["class"] == d["class"]]
            if not same:
                continue
            overlap = ious(np.asarray(d["box"]), np.asarray([ref[j]["box"] for j in same]))
            j = int(np.argmax(overlap))
            if overlap[j] >= MATCH_IOU:
                matched += 1
                free.remove(same[j])
    return 100.0 if found == 0 else 100.0 * 2 * matched / found


def decision(detections: list[dict]) -> str:
    """What a sample's detections decide, for the gate's output agreement: the classes found
    and how many of each (the boxes move by fractions of a pixel between precisions)."""
    return json.dumps(sorted(d["class"] for d in detections))


def resolution(metric: str, reference: dict, limit: float | None) -> str:
    """What one detection weighs in ``detection_f1`` over the baseline's ``detections_found``
    (one lost of n: 100 / (2n - 1) points), said where that is more than the limit: the
    evaluation set is too small to tell the limit from one box near the score threshold."""
    n = reference.get("detections_found") if metric == "detection_f1" else None
    if not isinstance(n, (int, float)) or n < 1:
        return ""
    step = 100.0 / (2 * n - 1)
    if limit is None or step <= limit:
        return ""
    return (f"; it rests on {int(n)} detections, one found or lost moving it {step:.2f} points, "
            f"more than the limit: evaluate more samples (data.evaluation_samples) or size "
            f"gate.max_accuracy_drop to it")
