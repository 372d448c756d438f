"""A detector's raw head read as detections, and how closely a candidate's follow the baseline's.

In: one sample's output of a YOLO-style head (``metric.detections=yolo``): ``[4 + classes,
anchors]``, each anchor's box (centre x, centre y, width, height, in the input's pixels) and each
class's score, already activated, as Ultralytics' YOLOv8 and later export it; or its transpose
``[anchors, 4 + classes]`` (told apart by which axis is longer: there are more anchors than
classes). Out: ``decode``, the detections a deployment reads: each anchor's best class, kept at
``score_threshold`` and above, then non-maximum suppression at ``iou_threshold`` within each
class (or across classes, ``metric.nms=all``), as the models' own inference code decodes them;
``f1``, for two models' detections on the same inputs, the share of detections both find (same
class, boxes overlapping at IoU 0.5 or more), pooled over the samples, in %.

Why not the raw output's argmax or cosine: a head's 2100 to 8400 anchors hold near-equal box
coordinates and scores near zero, so an argmax over them flips on rounding (FP32 against its own
FP16 copy read 94 % on a YOLOv8n), while a cosine over the whole tensor is held up by the boxes'
large coordinates and hides scores that INT8 ruined. What a user ships is the boxes.
"""
from __future__ import annotations

import json

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


def head(row) -> np.ndarray:
    """One sample's output as ``[4 + classes, anchors]``."""
    x = np.asarray(row, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"a YOLO head's output is [4 + classes, anchors] per sample; got "
                         f"{list(x.shape)}")
    return x.T if x.shape[0] > x.shape[1] else x


def decode(row, score_threshold: float, iou_threshold: float,
           nms_mode: str = "per_class") -> list[dict]:
    """The sample's detections, best first: ``{"class", "score", "box": [x1, y1, x2, y2]}``;
    ``nms_mode``: boxes suppressed within their class (per_class) or across classes (all)."""
    x = head(row)
    scores = x[4:]
    classes = scores.argmax(axis=0)
    best = scores[classes, np.arange(scores.shape[1])]
    keep = np.flatnonzero(best >= score_threshold)
    if not keep.size:
        return []
    cx, cy, w, h = x[:4, keep]
    boxes = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1)
    groups = classes[keep] if nms_mode == "per_class" else np.zeros(keep.size, np.int64)
    picked = nms(boxes, best[keep], groups, iou_threshold)
    return [{"class": int(classes[keep[k]]), "score": round(float(best[keep[k]]), 6),
             "box": [round(float(v), 2) for v in boxes[k]]} for k in picked]


def nms(boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray, iou: float) -> list[int]:
    """Indices kept by greedy non-maximum suppression within each of ``classes`` (a group per
    box), best score first: at most ``MAX_DETECTIONS``, from the ``MAX_CANDIDATES`` best boxes
    (a ruined candidate whose every anchor passes the threshold is decoded in milliseconds,
    not compared 8400 x 8400 times)."""
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
        suppressed[i + 1:] |= (classes[rest] == classes[k]) & (ious(boxes[k], boxes[rest]) > iou)
    return kept


def ious(box: np.ndarray, others: np.ndarray) -> np.ndarray:
    """Intersection over union of ``box`` with each of ``others`` (x1, y1, x2, y2)."""
    x1 = np.maximum(box[0], others[:, 0])
    y1 = np.maximum(box[1], others[:, 1])
    x2 = np.minimum(box[2], others[:, 2])
    y2 = np.minimum(box[3], others[:, 3])
    inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
    union = _area(box) + _area(others) - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def _area(b: np.ndarray) -> np.ndarray:
    return np.clip(b[..., 2] - b[..., 0], 0, None) * np.clip(b[..., 3] - b[..., 1], 0, None)


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
