"""Model outputs compared: the output-hash ledger and agreement between two evaluations.

In: the predictions of one evaluation (decoded strings, a classifier's top-k lists, or a
label-free output's decision and values), or two evaluate artifacts (each with
``predictions.json``). Out: a sha256 over the predictions, so two artifacts whose outputs differ
in a single sample are told apart even when their accuracy is equal; and the share of samples on
whose decision two evaluations agree, which the gate, the report and the runtime choice read.
"""
from __future__ import annotations

import hashlib
import json


def output_hash(predictions: list) -> str:
    """Strings are joined as they always were (the OCR ledger's hashes stay valid); other
    predictions (classes, vectors) hash their JSON."""
    text = ("\n".join(predictions) if all(isinstance(p, str) for p in predictions)
            else json.dumps(predictions))
    return hashlib.sha256(text.encode()).hexdigest()


def decision(prediction):
    """What two models must agree on for one sample: a decoded string as it is, a classifier's
    top-1 class (its predictions are top-k lists), a label-free output's argmax (``decision``) or,
    for continuous outputs without a class axis, the rounded output itself."""
    if isinstance(prediction, dict):
        return prediction["decision"] if prediction.get("decision") is not None else \
            json.dumps(prediction.get("output"))
    if isinstance(prediction, list):
        return prediction[0] if prediction else None
    return prediction


def agreement(a, b) -> float:
    """Share of samples on whose decision two evaluate artifacts agree."""
    pa = json.loads((a.path / "predictions.json").read_text())
    pb = json.loads((b.path / "predictions.json").read_text())
    if len(pa) != len(pb):
        return 0.0
    return sum(decision(x) == decision(y) for x, y in zip(pa, pb)) / len(pa)
