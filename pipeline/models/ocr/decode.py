"""CTC greedy decoding and the OCR metrics for the built-in OCR tasks: the generic CTC metrics
(``pipeline.metrics.ctc``) with this task's alphabet.

In: logits [N, T, classes] (numpy or torch) and label strings. Out: decoded strings and a metric
dict (exact-match sequence accuracy and character error rate, in %).
"""
from __future__ import annotations

import numpy as np

from pipeline.metrics.ctc import edit_distance, score  # noqa: F401 - the task's metric functions
from pipeline.metrics import ctc
from pipeline.models.ocr.data import ALPHABET

CHARSET = list(ALPHABET)


def greedy_decode(logits) -> list[str]:
    """Best path: argmax per frame, merge repeats, drop blanks (class 0)."""
    return ctc.greedy_decode(np.asarray(logits), CHARSET)
