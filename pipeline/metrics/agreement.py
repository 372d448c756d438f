"""When the user has no labels: how closely a candidate's outputs follow the FP16 baseline's.

In: two lists of output arrays for the same inputs (the baseline's and the candidate's), each
[batch, ...]. Out: argmax agreement (for outputs with a class axis), cosine similarity per sample
(mean and 1st percentile: the worst samples are what a user notices), and the max and mean
absolute difference. Continuous outputs (embeddings, regressions) are judged by cosine and
differences; "identical decoded strings" only means something for classifiers and decoders.
"""
from __future__ import annotations

import numpy as np

from pipeline.task.metric import MetricSpec

# Default limits, against FP16 (which scores 100 % and cosine 1 against itself): argmax agreement
# may lose 0.3 points; the mean cosine 0.01 and, gated with it, the 1st percentile 0.03, so the
# worst 1 % of samples stay at cosine >= 0.97 (an average hides a few ruined rows). Differences are
# in the output's units: no default.
SPECS = {"argmax_agreement": MetricSpec("argmax_agreement", True, needs_labels=False),
         "cosine_mean": MetricSpec("cosine_mean", True, "", needs_labels=False, limit=0.01,
                                   scale="cosine", gated_with=("cosine_p1", "cosine_parts")),
         "cosine_p1": MetricSpec("cosine_p1", True, "", needs_labels=False, limit=0.03,
                                 scale="cosine"),
         "cosine_parts": MetricSpec("cosine_parts", True, "", needs_labels=False, limit=0.01,
                                    scale="cosine"),
         "max_abs_diff": MetricSpec("max_abs_diff", False, "", needs_labels=False, limit=None,
                                    scale="output units"),
         "mean_abs_diff": MetricSpec("mean_abs_diff", False, "", needs_labels=False, limit=None,
                                     scale="output units")}


# An output's channels (axis 1) whose largest magnitude is under 1/RANGE_RATIO of the widest
# channel's form a part of their own: a sixteenth of the range is what keeps 4 of INT8's 8 bits.
RANGE_RATIO = 16.0


def parts_cosine(baseline: list, candidate: list) -> float:
    """The lowest cosine over the output's parts, each part's values pooled over every sample.

    Why: a detector's one output joins box coordinates (0 to 320) and class scores (0 to 1). A
    cosine over each sample's whole output is the coordinates' cosine: an INT8 model whose
    scores had all become 0 read 0.999 and passed. The channels along axis 1 (a fixed axis,
    as the task declares it) are split by their magnitude over the baseline's samples into the
    wide ones and those under 1/RANGE_RATIO of the widest, and each part is compared on its own.
    Pooled over the evaluation set, a part is judged where it carries signal: the scores of the
    images where something was found, not the rounding of near-zero scores where nothing was."""
    b = [np.asarray(x, dtype=np.float64) for x in baseline]
    c = [np.asarray(x, dtype=np.float64) for x in candidate]
    with np.errstate(invalid="ignore", over="ignore"):
        mags = np.max([np.nan_to_num(np.abs(x), posinf=0.0, neginf=0.0)
                       .max(axis=tuple(k for k in range(x.ndim) if k != 1)) for x in b], axis=0)
    wide = mags * RANGE_RATIO >= mags.max()
    worst = 1.0
    for part in ([wide, ~wide] if (~wide).any() else [wide]):
        pb = np.concatenate([x[:, part].ravel() for x in b])
        pc = np.concatenate([x[:, part].ravel() for x in c])
        if not (np.isfinite(pb).all() and np.isfinite(pc).all()):
            return 0.0
        nb, nc = np.linalg.norm(pb), np.linalg.norm(pc)
        cos = float(pb @ pc / (nb * nc)) if nb * nc > 0 else (1.0 if nb == nc == 0 else 0.0)
        worst = min(worst, cos)
    return worst


def agreement(baseline: list, candidate: list, parts: bool = False) -> dict[str, float]:
    """``parts``: the outputs have a fixed channel axis 1 to split by magnitude
    (``parts_cosine``), reported as ``cosine_parts``."""
    if len(baseline) != len(candidate) or not baseline:
        raise ValueError(f"cannot compare {len(candidate)} candidate batches with "
                         f"{len(baseline)} baseline batches")
    cos, argmax_same, n_argmax, max_abs, abs_sum, count = [], 0, 0, 0.0, 0.0, 0
    for b, c in zip(baseline, candidate):
        b = np.asarray(b, dtype=np.float64)
        c = np.asarray(c, dtype=np.float64)
        if b.shape != c.shape:
            raise ValueError(f"output shapes differ: baseline {b.shape}, candidate {c.shape}")
        flat_b, flat_c = b.reshape(len(b), -1), c.reshape(len(c), -1)
        # A row with NaN or inf (a kernel that overflowed) shares no direction with anything:
        # cosine 0, so the gate reads a number, not NaN, and numpy prints no warning
        finite = np.isfinite(flat_b).all(axis=1) & np.isfinite(flat_c).all(axis=1)
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            nb, nc = np.linalg.norm(flat_b, axis=1), np.linalg.norm(flat_c, axis=1)
            denom = nb * nc
            # Two zero vectors agree perfectly; one zero and one not share no direction.
            row = np.where(denom > 0, (flat_b * flat_c).sum(axis=1) / np.maximum(denom, 1e-300),
                           np.where((nb == 0) & (nc == 0), 1.0, 0.0))
        cos.extend(np.where(finite, row, 0.0))
        if b.ndim >= 2 and b.shape[-1] > 1:  # a class axis: compare the chosen class
            argmax_same += int((b.argmax(-1) == c.argmax(-1)).sum())
            n_argmax += int(np.prod(b.shape[:-1]))
        with np.errstate(invalid="ignore", over="ignore"):
            diff = np.abs(b - c)
        max_abs = max(max_abs, float(diff.max()) if diff.size else 0.0)
        abs_sum += float(diff.sum())
        count += diff.size
    cos = np.asarray(cos)
    out = {"cosine_mean": float(cos.mean()), "cosine_p1": float(np.percentile(cos, 1)),
           "max_abs_diff": max_abs, "mean_abs_diff": abs_sum / max(count, 1)}
    if n_argmax:
        out["argmax_agreement"] = 100.0 * argmax_same / n_argmax
    if parts:
        out["cosine_parts"] = parts_cosine(baseline, candidate)
    return out
