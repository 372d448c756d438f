"""The `metric=` group's schema: which metric scores the user's model and how to read its outputs.

In: nothing (typed config). Out: ``MetricConfig``: ``classification`` (top-1 and top-k from
logits and integer or named labels), ``ctc`` (greedy CTC decoding with a character set from a text
file or the ONNX metadata, then sequence accuracy and CER) or ``agreement`` (no labels: how closely
each model's outputs follow the FP16 baseline's). Values are checked when the config is made
(exit 2); whether the metric fits the model's outputs is checked when the task is built, before
any stage runs, and so is a ``primary`` the task does not report.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.core.errors import ConfigError


# metric.detections: how a detector's head is laid out (pipeline.metrics.detection)
DETECTION_LAYOUTS = ("yolo", "yolov5", "yolox", "end2end")
NMS_MODES = ("per_class", "all")  # metric.nms: boxes suppressed within a class, or across all


class MetricName(str, enum.Enum):
    classification = "classification"
    ctc = "ctc"
    agreement = "agreement"


@dataclass
class MetricConfig:
    name: MetricName = MetricName.classification
    top_k: int = 5                 # classification: top-k besides top-1 (skipped if > classes)
    class_names: list[str] = field(default_factory=list)  # classification: output index -> name,
                                   # for string labels; empty: labels are the output indices
    charset: str = ""              # ctc: text file, one character per line or all on one line;
                                   # empty: the ONNX model's metadata (charset, vocab, ...)
    time_major: bool = False       # ctc: outputs are [time, batch, classes]
    primary: str = ""              # the metric the gate (and the quantization search) judges, one
                                   # of those the task reports (e.g. spearman, cosine_p1); empty:
                                   # the task's own (top1, sequence_accuracy, cosine_mean, ...)
    detections: str = ""           # agreement: reads the output as a detector's head, decoded
                                   # into boxes and judged as detections (detection_f1): yolo
                                   # ([4 + classes, anchors]: box cx, cy, w, h, class scores),
                                   # yolov5 ([anchors, 5 + classes]: box, objectness, class
                                   # scores), yolox (as yolov5, boxes still on the strides'
                                   # grids), end2end ([detections, 6]: x1, y1, x2, y2, score,
                                   # class, already selected by the graph); empty: the output
                                   # as numbers
    score_threshold: float = 0.25  # detections: an anchor's best class score kept from here up
    iou_threshold: float = 0.45    # detections: non-maximum suppression at this overlap ...
                                   # (not end2end: its graph has chosen its rows)
    nms: str = "per_class"         # ... within each class (per_class: Ultralytics' own), or
                                   # across classes (all: code that calls cv2.dnn.NMSBoxes
                                   # without class ids)

    def __post_init__(self):
        self.name = MetricName(self.name)
        if self.top_k < 1:
            raise ConfigError(f"metric.top_k={self.top_k}: must be at least 1")
        if self.detections and self.detections not in DETECTION_LAYOUTS:
            raise ConfigError(f"metric.detections={self.detections}: valid choices: "
                              f"{', '.join(DETECTION_LAYOUTS)} (empty: the output read as numbers)")
        if self.detections and self.name != MetricName.agreement:
            raise ConfigError(f"metric.detections={self.detections}: a detector's head is judged "
                              f"against the FP16 baseline's detections: metric=agreement, not "
                              f"metric={self.name.value}")
        if self.nms not in NMS_MODES:
            raise ConfigError(f"metric.nms={self.nms}: valid choices: {', '.join(NMS_MODES)}")
        for key in ("score_threshold", "iou_threshold"):
            if not 0 < getattr(self, key) < 1:
                raise ConfigError(f"metric.{key}={getattr(self, key)}: must be between 0 and 1")
        if self.charset and not Path(self.charset).is_file():
            raise ConfigError(f"metric.charset={self.charset}: no such file")
