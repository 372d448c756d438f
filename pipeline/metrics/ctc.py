"""Text recognizers trained by others: greedy CTC decoding with their character set, then sequence
accuracy and character error rate.

In: logits [N, T, classes] (or [T, N, classes] with ``time_major``), a character set (class 0 is
the blank, class i the set's character i-1), label strings. Out: strings and percentages. The
character set comes from a text file (one character per line, or the whole set on one line) or
from the ONNX model's metadata (``charset``, ``character_set``, ``vocab``, ``alphabet`` or
PaddleOCR's ``character``).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.task.metric import MetricSpec

SPECS = {"sequence_accuracy": MetricSpec("sequence_accuracy", True),
         "cer": MetricSpec("cer", False)}  # both in points, 0.3 by default (CER gated when named)
METADATA_KEYS = ("charset", "character_set", "vocab", "alphabet", "character")
PADDLE_KEY = "character"  # PaddleOCR's exports (and RapidOCR's copies of them)


def charset_from_file(path: str | Path) -> list[str]:
    """One character per line, or the whole set on a single line. Only a trailing newline is
    stripped, so a space can be a character of its own line."""
    return _chars(Path(path).read_text(encoding="utf-8"), str(path))


def _chars(text: str, where: str) -> list[str]:
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    chars = list(lines[0]) if len(lines) == 1 else lines
    if not chars or any(len(c) != 1 for c in chars):
        bad = next((c for c in chars if len(c) != 1), "")
        raise ValueError(f"{where}: a character set needs one character per line or all on one "
                         f"line; found {bad!r}")
    return chars


def charset_from_onnx(model, classes: int | None = None) -> list[str] | None:
    """The character set an exporter stored in the model's metadata, if any, read as a file is
    (one per line, or all on one line). PaddleOCR's exports store theirs under ``character``,
    one per line, without the space their decoder appends as the last class
    (``use_space_char``): it is appended when the output has a class for it (``classes``, the
    blank included, is two more than the list)."""
    props = {p.key: p.value for p in model.metadata_props}
    for key in METADATA_KEYS:
        if key in props:
            chars = _chars(props[key], f"the model's {key!r} metadata")
            if key == PADDLE_KEY and lacks_paddle_space(classes, chars):
                chars.append(" ")
            return chars
    return None


def lacks_paddle_space(classes, chars: list[str]) -> bool:
    """The output has one class more than the set and its blank, and the set has no space: a
    PaddleOCR recognizer's dictionary without the space its decoder appends."""
    return classes == len(chars) + 2 and " " not in chars


def paddle_space_hint(classes, chars: list[str]) -> str:
    """What a character set one short of a PaddleOCR recognizer's classes lacks."""
    if lacks_paddle_space(classes, chars):
        return (" (PaddleOCR's recognizers have a space as their last class, which their "
                "dictionary files leave out: add a line holding one space at the end)")
    return ""


def greedy_decode(logits, charset: list[str], time_major: bool = False) -> list[str]:
    """Best path: argmax per frame, merge repeats, drop blanks (class 0)."""
    out = np.asarray(logits)
    if out.ndim != 3:
        raise ValueError(f"CTC decoding needs [batch, time, classes] outputs, got shape {out.shape}")
    if time_major:
        out = out.transpose(1, 0, 2)
    if out.shape[2] != len(charset) + 1:
        raise ValueError(f"the output has {out.shape[2]} classes; a character set of "
                         f"{len(charset)} plus the blank needs {len(charset) + 1}")
    best = out.argmax(axis=-1)
    texts = []
    for row in best:
        keep = row[(row != 0) & np.concatenate(([True], row[1:] != row[:-1]))]
        texts.append("".join(charset[k - 1] for k in keep))
    return texts


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
    return {"sequence_accuracy": 100.0 * exact / len(labels),
            "cer": 100.0 * edits / chars if chars else float("nan")}
