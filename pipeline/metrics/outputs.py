"""Decoded outputs compared: the output-hash ledger and agreement between two evaluations.

In: the decoded predictions of one evaluation (a list of strings), or two evaluate artifacts
(each with ``predictions.json``). Out: a sha256 over the decoded outputs, so two artifacts whose
outputs differ in a single line are told apart even when their accuracy is equal; and the share
of identical decoded outputs between two evaluations, which the gate, the report and the runtime
choice read.
"""
from __future__ import annotations

import hashlib
import json


def output_hash(predictions: list[str]) -> str:
    return hashlib.sha256("\n".join(predictions).encode()).hexdigest()


def agreement(a, b) -> float:
    """Share of identical decoded outputs between two evaluate artifacts."""
    pa = json.loads((a.path / "predictions.json").read_text())
    pb = json.loads((b.path / "predictions.json").read_text())
    if len(pa) != len(pb):
        return 0.0
    return sum(x == y for x, y in zip(pa, pb)) / len(pa)
