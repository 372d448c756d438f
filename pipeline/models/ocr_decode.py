"""CTC greedy decoding and the OCR metrics (exact-match sequence accuracy, character error rate).

In: logits [N, T, classes] (numpy or torch) and label strings. Out: decoded strings and a metric
dict. Pure numpy so the same code scores torch, ONNX Runtime and any later runtime's outputs.
"""
from __future__ import annotations

import numpy as np

from pipeline.models.ocr_data import ALPHABET


def greedy_decode(logits) -> list[str]:
    """Best path: argmax per frame, merge repeats, drop blanks (class 0)."""
    best = np.asarray(logits).argmax(axis=-1)
    out = []
    for row in best:
        keep = row[(row != 0) & np.concatenate(([True], row[1:] != row[:-1]))]
        out.append("".join(ALPHABET[k - 1] for k in keep))
    return out


def edit_distance(a: str, b: str) -> int:
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def score(predictions: list[str], labels: list[str]) -> dict[str, float]:
    """Sequence accuracy (exact match) and CER (edits / reference characters), both in %."""
    if len(predictions) != len(labels) or not labels:
        raise ValueError(f"cannot score {len(predictions)} predictions against {len(labels)} labels")
    exact = sum(p == t for p, t in zip(predictions, labels))
    edits = sum(edit_distance(p, t) for p, t in zip(predictions, labels))
    chars = sum(len(t) for t in labels)
    return {"sequence_accuracy": 100.0 * exact / len(labels), "cer": 100.0 * edits / chars}
