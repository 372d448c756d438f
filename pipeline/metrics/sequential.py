"""Sequential scoring: a candidate scored a few sequences at a time, stopped once its verdict is clear.

In: the per-sequence sums of a candidate against the reference (``generation.row_sums``: positions,
the candidate's and the reference's NLL, agreeing positions, KL), the gate's limits (metric ->
largest drop that passes) and a floor on the sequences scored. Out: each judged metric's drop
against FP32 with a confidence interval, and whether to stop: when every interval lies wholly
inside its limit (the candidate passes) or one lies wholly outside (it fails); otherwise the next
sequences are scored, up to all of them (a borderline candidate runs to the end, and its verdict
is the full text's point estimate, as without this module).

Each metric is a ratio of sums over sequences (sum of NLL differences over sum of positions, say),
and the sequences are the sampled units: the interval is the ratio estimator's, with its
linearized variance (sum of (a_i - R n_i)^2 / (m (m - 1)) over the mean positions squared) and a
Student t quantile. The perplexity rise is a monotone function of the mean NLL difference (paired:
each sequence's candidate NLL minus the reference's on the same tokens, so most of the variation
between sequences cancels), so its interval is that of the difference, transformed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

# The verdict is looked at after every chunk, so a 95 % interval would stop on noise more often
# than 1 in 20 over a run's many looks; 99 % keeps the chance of a stop on the wrong side small.
CONFIDENCE = 0.99


def t_quantile(p: float, dof: int) -> float:
    """Student t's ``p`` quantile (Cornish-Fisher from the normal's; within 1e-3 from 5 degrees
    of freedom up, which the floor on sequences keeps us above)."""
    z = NormalDist().inv_cdf(p)
    v = max(dof, 1)
    return (z + (z ** 3 + z) / (4 * v) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * v ** 2)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * v ** 3))


@dataclass(frozen=True)
class Interval:
    drop: float   # the point estimate, in the gate's scale (positive: worse than FP32)
    low: float
    high: float


def _ratio(a: np.ndarray, n: np.ndarray, confidence: float) -> tuple[float, float]:
    """sum(a) / sum(n) and its interval's half-width (0 with fewer than two sequences)."""
    r = float(a.sum() / n.sum())
    m = len(a)
    if m < 2:
        return r, math.inf
    var = float(((a - r * n) ** 2).sum()) / (m * (m - 1)) / float(n.mean()) ** 2
    return r, t_quantile(0.5 + confidence / 2, m - 1) * math.sqrt(var)


def intervals(rows: np.ndarray, confidence: float = CONFIDENCE) -> dict[str, Interval]:
    """Each gated metric's drop against FP32 with its interval, from ``row_sums`` rows."""
    rows = rows[rows[:, 0] > 0]
    n = rows[:, 0]
    d, hd = _ratio(rows[:, 1] - rows[:, 2], n, confidence)
    g, hg = _ratio(rows[:, 3], n, confidence)
    k, hk = _ratio(rows[:, 4], n, confidence)

    def rise(x):
        return 100.0 * (math.exp(min(x, 700.0)) - 1.0)

    return {"perplexity_rise": Interval(rise(d), rise(d - hd), rise(d + hd)),
            "top1_agreement": Interval(100.0 * (1 - g), 100.0 * (1 - g - hg),
                                       100.0 * (1 - g + hg)),
            "kl_mean": Interval(k, k - hk, k + hk)}


def decide(rows: np.ndarray, limits: dict[str, float], min_sequences: int,
           confidence: float = CONFIDENCE) -> str | None:
    """``"inside"`` (every judged interval within its limit), ``"outside"`` (one wholly past
    its limit), or None: score more. Never before ``min_sequences`` sequences are in."""
    if int((rows[:, 0] > 0).sum()) < max(min_sequences, 2):
        return None
    got = intervals(rows, confidence)
    if any(got[m].low > limit + 1e-9 for m, limit in limits.items()):
        return "outside"
    if all(got[m].high <= limit + 1e-9 for m, limit in limits.items()):
        return "inside"
    return None
