"""Classifier metrics: top-1 and top-k accuracy from logits (or probabilities) and integer labels.

In: outputs [N, classes] and labels [N] (ints, or strings mapped through ``class_names``). Out: a
dict of percentages. Pure numpy, so torch's, ONNX Runtime's and OpenVINO's outputs are scored by
the same code.
"""
from __future__ import annotations

import numpy as np

from pipeline.task.metric import MetricSpec

SPECS = {"top1": MetricSpec("top1", True), "top5": MetricSpec("top5", True)}


def label_ids(labels, class_names: list[str] | None = None) -> np.ndarray:
    """Labels as class indices: ints as they are, names through ``class_names``."""
    labels = list(labels)
    if labels and isinstance(labels[0], str):
        if not class_names:
            raise ValueError("string labels need the class names to map them to output indices")
        index = {n: i for i, n in enumerate(class_names)}
        unknown = sorted({lab for lab in labels if lab not in index})
        if unknown:
            raise ValueError(f"labels {unknown[:5]} are not among the {len(class_names)} classes")
        return np.asarray([index[lab] for lab in labels])
    return np.asarray(labels, dtype=np.int64)


def topk(outputs, labels, ks=(1, 5)) -> dict[str, float]:
    out = np.asarray(outputs)
    if out.ndim != 2:
        raise ValueError(f"a classifier's output must be [batch, classes], got shape {out.shape}")
    y = np.asarray(labels, dtype=np.int64)
    if len(y) != len(out):
        raise ValueError(f"{len(out)} outputs against {len(y)} labels")
    if len(y) and (y.min() < 0 or y.max() >= out.shape[1]):
        raise ValueError(f"labels range {y.min()}..{y.max()} does not fit {out.shape[1]} classes")
    order = np.argsort(-out, axis=1, kind="stable")
    res = {}
    for k in ks:
        if k <= out.shape[1]:
            hit = (order[:, :k] == y[:, None]).any(axis=1)
            res[f"top{k}"] = 100.0 * float(hit.mean()) if len(y) else float("nan")
    return res
