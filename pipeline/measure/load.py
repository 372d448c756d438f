"""The load test's arithmetic: where to put the QPS steps, the highest rate within the p99 target,
a request's shape class, and the RSS slope of a soak.

In: measured service times, a function that runs one QPS step, RSS samples. Out: the QPS grid,
every step run (walked up, then bisected), the batcher's shape key, and the leak verdict. Used by
``stages/loadtest.py``; the serving itself (Poisson arrivals, the batcher) is ``serving``.
"""
from __future__ import annotations

import numpy as np


def qps_steps(ms_b1: float, ms_bmax: float, max_batch: int, n: int) -> list[float]:
    """Geometric steps from 5 % of batch-1 capacity to 1.5x max-batch capacity. The low start
    matters: a Python batcher's own wake-ups already cost a millisecond or more on a VM."""
    low = 0.05 * 1000.0 / ms_b1
    high = 1.5 * max_batch * 1000.0 / ms_bmax
    return [float(q) for q in np.geomspace(low, max(high, 2 * low), n)]


def shape_key(bucket: int):
    """A request's shape class: every dimension but the batch, of every input, rounded up to
    ``bucket``."""
    if not bucket:
        return None

    def key(feeds):
        arrays = feeds.values() if isinstance(feeds, dict) else [feeds]
        return tuple(-(-d // bucket) for a in arrays for d in a.shape[1:])

    return key


def max_within(step_at, grid: list[float], refine: int) -> list[dict]:
    """Walk up the QPS grid until a step misses the target, then bisect (geometrically) between
    the last rate that met it and the first that did not, ``refine`` times. The coarse grid alone
    reads the capacity to within a grid factor (about 1.8x): too coarse to tell two serving
    policies apart. Returns every step run, in order; each has ``meets_slo``."""
    steps: list[dict] = []
    for qps in grid:
        steps.append(step_at(qps, len(steps)))
        if not steps[-1]["meets_slo"]:
            break
    if len(steps) < 2 or steps[-1]["meets_slo"]:
        return steps
    lo, hi = steps[-2]["offered_qps"], steps[-1]["offered_qps"]
    for _ in range(refine):
        step = step_at(float(np.sqrt(lo * hi)), len(steps))
        step["refinement"] = True
        steps.append(step)
        lo, hi = (step["offered_qps"], hi) if step["meets_slo"] else (lo, step["offered_qps"])
    return steps


def leak(samples: list[tuple[float, float]], mb_per_min: float) -> dict:
    """Slope of RSS over time after the first fifth (allocators settle first)."""
    t = np.array([s[0] for s in samples])
    rss = np.array([s[1] for s in samples])
    keep = t >= t.max() / 5 if t.size else t
    if keep.sum() < 3:
        return {"slope_mb_per_min": None, "leak": False, "note": "too few samples"}
    slope = float(np.polyfit(t[keep], rss[keep], 1)[0] * 60.0)
    return {"slope_mb_per_min": slope, "threshold": mb_per_min, "leak": slope > mb_per_min,
            "rss_start_mb": float(rss[keep][0]), "rss_end_mb": float(rss[-1])}
