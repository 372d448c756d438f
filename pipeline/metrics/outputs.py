"""Model outputs compared: the output-hash ledger and agreement between two evaluations.

In: the predictions of one evaluation (decoded strings, a classifier's top-k lists, or a
label-free output's decision and values), or two evaluate artifacts (each with
``predictions.json``). Out: a sha256 over the predictions, so two artifacts whose outputs differ
in a single sample are told apart even when their accuracy is equal; and the share of samples on
whose decision two evaluations agree, which the gate, the report and the runtime choice read.
A continuous output (an embedding, a regression: no class axis, so no decision) agrees when it is
within a relative tolerance of the other's, row by row (``close``): compared exactly, float
noise alone made every embedding model read 0 %, and a cosine of a one-value output would only
check its sign.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import numpy as np

from pipeline.metrics import detection

# A continuous row agrees when |candidate - baseline| <= RTOL * |baseline| (L2 norms over the
# row; ``gate.output_rtol``). 0.25 is, for unit-length embeddings, a cosine of 0.969: the bar the
# 1st-percentile cosine gate sets for the worst rows. For one value per row it is 25 % of it.
RTOL = 0.25


@dataclass(frozen=True)
class Rule:
    """When one sample's output agrees with the baseline's: a continuous row within ``rtol``
    (``gate.output_rtol``); a detector's detections at ``sample_f1`` or more on that sample,
    100 less the detection F1 budget the user gave (``gate.max_accuracy_drop``), so that a
    budget loosened for the whole set is not refused again sample by sample."""
    rtol: float = RTOL
    sample_f1: float = detection.SAMPLE_F1

    @classmethod
    def of(cls, gate) -> "Rule":
        """The rule a gate config sets (an object without those fields: the defaults). A number
        for ``gate.max_accuracy_drop`` is the primary metric's limit, which for a detector is
        its detection F1's; a mapping may name ``detection_f1``."""
        setting = getattr(gate, "max_accuracy_drop", None)
        budget = setting.get("detection_f1") if isinstance(setting, dict) else setting
        f1 = cls.sample_f1 if budget is None else 100.0 - float(budget)
        return cls(float(getattr(gate, "output_rtol", RTOL)), f1)


def output_hash(predictions: list) -> str:
    """Strings are joined as they always were (the OCR ledger's hashes stay valid); other
    predictions (classes, vectors) hash their JSON."""
    text = ("\n".join(predictions) if all(isinstance(p, str) for p in predictions)
            else json.dumps(predictions))
    return hashlib.sha256(text.encode()).hexdigest()


def decision(prediction):
    """What two models must agree on for one sample: a decoded string as it is, a classifier's
    top-1 class (its predictions are top-k lists), a label-free output's argmax (``decision``) or,
    for continuous outputs without a class axis, the rounded output itself (``agrees`` compares
    those within a tolerance instead)."""
    if isinstance(prediction, dict):
        return prediction["decision"] if prediction.get("decision") is not None else \
            json.dumps(prediction.get("output"))
    if isinstance(prediction, list):
        return prediction[0] if prediction else None
    return prediction


def continuous(prediction) -> bool:
    """A label-free output without a decision: compared within a tolerance, not exactly."""
    return isinstance(prediction, dict) and prediction.get("decision") is None \
        and prediction.get("output") is not None


def close(x, y, rtol: float = RTOL) -> bool:
    """Row ``x`` within ``rtol`` of the baseline's row ``y`` (relative L2 error); a zero baseline
    row agrees only with zero."""
    x, y = np.asarray(x, dtype=np.float64).ravel(), np.asarray(y, dtype=np.float64).ravel()
    if x.shape != y.shape:
        return False
    return bool(np.linalg.norm(x - y) <= rtol * np.linalg.norm(y))


def agrees(x, y, rule: Rule = Rule()) -> bool:
    """Does prediction ``x`` agree with the baseline's ``y``? A detector's sample agrees when
    its detections are the baseline's within the detection F1 budget on that sample alone
    (``rule.sample_f1``), not when every class it finds is: on a page of 140 detections,
    one of them crossing the score threshold made a model that kept 99.8 % of them (FP32 on
    OpenVINO BF16) disagree on 36 % of the pages."""
    if continuous(x) and continuous(y):
        return close(x["output"], y["output"], rule.rtol)
    if _detections(x) and _detections(y):
        return detection.f1([y["detections"]], [x["detections"]]) >= rule.sample_f1 - 1e-9
    return decision(x) == decision(y)


def _detections(prediction) -> bool:
    return isinstance(prediction, dict) and isinstance(prediction.get("detections"), list)


def agreement(a, b, rule: Rule = Rule()) -> float:
    """Share of samples on whose decision (continuous outputs: within ``rule.rtol`` of the
    baseline ``b``'s; detections: ``rule.sample_f1``) two evaluate artifacts agree."""
    pa = json.loads((a.path / "predictions.json").read_text())
    pb = json.loads((b.path / "predictions.json").read_text())
    if len(pa) != len(pb):
        return 0.0
    return sum(agrees(x, y, rule) for x, y in zip(pa, pb)) / len(pa)


def own_agreement(fp32, fp16, rule: Rule = Rule()) -> float | None:
    """FP32's own agreement with FP16 (their evaluate artifacts); None where FP32 was not
    evaluated or its predictions are gone."""
    if fp32 is None:
        return None
    try:
        return agreement(fp32, fp16, rule)
    except FileNotFoundError:
        return None


def agreement_limit(minimum: float, own: float | None) -> float:
    """The agreement with FP16 a candidate must reach: ``minimum`` (``gate.min_output_agreement``),
    or FP32's ``own`` where that is less. The float model is what a candidate must not fall short
    of: when a detector's decision was every class it found on a sample, FP32 itself agreed on
    92.7 % of a YOLO26s's document pages, under a 95 % limit no candidate could then meet (a
    detector's samples are now compared within its F1 budget, ``agrees``; any other decision can
    still sit at a threshold). Every check of agreement (the gate, the runtime choice,
    quant=auto) asks this."""
    return own if own is not None and np.isfinite(own) and own < minimum else minimum


def required(gate, fp32, fp16) -> float:
    """``agreement_limit`` under a gate config: its ``min_output_agreement``, or FP32's own
    agreement with FP16 (evaluate artifacts; ``fp32`` may be None) by its ``Rule``, if less."""
    return agreement_limit(gate.min_output_agreement, own_agreement(fp32, fp16, Rule.of(gate)))


def kind(a) -> str:
    """How the agreement of evaluation ``a`` reads: decisions identical, rows within a
    tolerance, or a detector's detections within its F1 budget."""
    pa = json.loads((a.path / "predictions.json").read_text())
    if pa and _detections(pa[0]):
        return "detections"
    return "within" if pa and continuous(pa[0]) else "identical"


def non_finite_samples(outputs, batch: int) -> int:
    """How many of a batch's ``batch`` samples have a NaN or an infinity anywhere in the model's
    output: a kernel that overflowed (static INT8 on some runtimes) answers NaN where the float
    model answers a number, and a decision taken from NaN (an argmax of 0, an empty string)
    looks like any other wrong answer. The samples are the axis of the batch's size, the first
    such (a time-major CTC output has its batch second); an integer output has none."""
    a = np.asarray(outputs)
    if not np.issubdtype(a.dtype, np.floating) or a.size == 0:
        return 0
    axis = next((i for i, n in enumerate(a.shape) if n == batch), None)
    if axis is None:  # no axis of the batch's size: the whole batch counts as one
        return 0 if np.isfinite(a).all() else batch
    rows = np.moveaxis(a, axis, 0).reshape(batch, -1)
    return int((~np.isfinite(rows)).any(axis=1).sum())
