"""Parity between two forward functions on the same real inputs: the check run after every
conversion (export, optimize, FP16). In: two callables feeds -> first output, a task and a data
set. Out: max absolute output difference and the share of identical predictions (the task's own:
decoded strings, classes)."""
from __future__ import annotations

import numpy as np

from pipeline.core.errors import StageError


def compare(reference, candidate, task, ds, batch_size: int = 16) -> dict:
    max_diff, same, total = 0.0, 0, 0
    for _, feeds, _ in task.batches(ds, batch_size):
        a, b = reference(feeds), candidate(feeds)
        max_diff = max(max_diff, float(np.max(np.abs(a.astype(np.float64) - b))))
        # continuous outputs (embeddings) agree by the task's own test, not by equality
        agree = getattr(task, "same_outputs", None)
        if agree is not None:
            flags = agree(a, b)
        else:
            flags = [x == y for x, y in zip(task.predictions(a), task.predictions(b))]
        same += sum(bool(f) for f in flags)
        total += len(flags)
    return {"max_abs_diff": max_diff, "decoded_agreement": same / total, "samples": total}


def require(parity: dict, tolerance: float, what: str) -> dict:
    """Fail the stage, with the numbers, when a lossless conversion changed the outputs."""
    if parity["max_abs_diff"] > tolerance or parity["decoded_agreement"] < 1.0:
        raise StageError(f"{what}: max |output diff| {parity['max_abs_diff']:.2e} (tolerance "
                         f"{tolerance:.0e}), decoded agreement {parity['decoded_agreement']:.1%}")
    return parity


def node_counts(model_path) -> dict[str, int]:
    import onnx

    counts: dict[str, int] = {}
    for node in onnx.load(str(model_path), load_external_data=False).graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return dict(sorted(counts.items()))
