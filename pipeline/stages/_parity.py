"""Parity between two forward functions on the same real inputs: the check run after every
conversion (export, optimize, FP16). In: two callables feeds -> first output, a task and a data
set. Out: max absolute output difference and the share of identical predictions (the task's own:
decoded strings, classes)."""
from __future__ import annotations

import numpy as np

from pipeline.core.errors import StageError
from pipeline.metrics.outputs import non_finite_samples


def compare(reference, candidate, task, ds, batch_size: int = 16) -> dict:
    """Also counts the samples whose outputs hold NaN or inf, the reference's and the
    candidate's (``non_finite``): a difference involving NaN is no number, so the largest
    difference is taken where both outputs are finite."""
    max_diff, same, total, bad_ref, bad_cand = 0.0, 0, 0, 0, 0
    for idx, feeds, _ in task.batches(ds, batch_size):
        a, b = reference(feeds), candidate(feeds)
        bad_ref += non_finite_samples(a, len(idx))
        bad_cand += non_finite_samples(b, len(idx))
        with np.errstate(invalid="ignore", over="ignore"):
            diff = np.abs(a.astype(np.float64) - b)
        diff = diff[np.isfinite(diff)]
        max_diff = max(max_diff, float(diff.max()) if diff.size else 0.0)
        # continuous outputs (embeddings) agree by the task's own test, not by equality
        agree = getattr(task, "same_outputs", None)
        if agree is not None:
            flags = agree(a, b)
        else:
            flags = [x == y for x, y in zip(task.predictions(a), task.predictions(b))]
        same += sum(bool(f) for f in flags)
        total += len(flags)
    return {"max_abs_diff": max_diff, "decoded_agreement": same / total, "samples": total,
            "non_finite": {"reference": bad_ref, "converted": bad_cand}}


def require(parity: dict, tolerance: float, what: str) -> dict:
    """Fail the stage, with the numbers, when a lossless conversion changed the outputs; first,
    when the model it converts already answers NaN or inf (no conversion can be checked on
    those samples, and no accuracy measured: the model or the way its inputs are made is
    broken, which the numbers of a failed comparison would not say)."""
    bad = parity.get("non_finite", {})
    n = parity["samples"]
    if bad.get("reference"):
        raise StageError(f"the model gives NaN or inf outputs on {bad['reference']} of {n} "
                         "samples of the data, before any conversion: nothing can be compared "
                         "or scored on them; check the model and how "
                         "its inputs are prepared (data=, the preprocessing settings)")
    if parity["max_abs_diff"] > tolerance or parity["decoded_agreement"] < 1.0 or bad.get(
            "converted"):
        nan = (f", NaN or inf on {bad['converted']} of {n} samples where the model before it "
               "gave numbers" if bad.get("converted") else "")
        raise StageError(f"{what}: max |output diff| {parity['max_abs_diff']:.2e} (tolerance "
                         f"{tolerance:.0e}), decoded agreement {parity['decoded_agreement']:.1%}"
                         f"{nan}")
    return parity


def node_counts(model_path) -> dict[str, int]:
    import onnx

    counts: dict[str, int] = {}
    for node in onnx.load(str(model_path), load_external_data=False).graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return dict(sorted(counts.items()))
