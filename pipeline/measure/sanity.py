"""Numbers no measurement can produce: what the gate refuses to judge from a benchmark.

In: one batch size's entry of a benchmark's metadata (``meta["batches"][b]``). Out: a list of
problems, each a short phrase; empty when the numbers are possible. A confidence interval whose
low end lies above its high end, or that does not hold its own median, a latency that is not a
positive finite number, or percentiles out of order (p50 above p99) cannot come out of
``pipeline.measure.timing``: such an entry was edited or damaged, and the gate then fails closed
(``pipeline.gate``). A missing number is not a problem here: the gate fails that check already.
"""
from __future__ import annotations

import math

PERCENTILES = ("p50", "p90", "p99", "p999")


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _ratio(name: str, r) -> list[str]:
    """A ratio with its 95 % interval (``timing.ratio_ci``): positive, finite, in order."""
    if not isinstance(r, dict):
        return []
    out = []
    ci, median = r.get("ci95"), r.get("median")
    if median is not None and not (_number(median) and math.isfinite(median) and median > 0):
        out.append(f"{name} median {median!r} is not a positive number")
    if ci is None:
        return out
    if not (isinstance(ci, list) and len(ci) == 2
            and all(_number(v) and math.isfinite(v) and v > 0 for v in ci)):
        return out + [f"{name} CI {ci!r} is not two positive numbers"]
    lo, hi = ci
    if lo > hi:
        out.append(f"{name} CI {lo:.2f}-{hi:.2f} has its bounds out of order")
    elif not out and median is not None and not lo * (1 - 1e-9) <= median <= hi * (1 + 1e-9):
        out.append(f"{name} median {median:.2f} lies outside its CI {lo:.2f}-{hi:.2f}")
    return out


def problems(at: dict) -> list[str]:
    """What is impossible in one batch size's benchmark entry (``at``)."""
    if not isinstance(at, dict):
        return []
    out = _ratio("speedup", at.get("speedup_vs_fastest_float"))
    core, aa = at.get("core_state"), at.get("aa_check")
    worst = core.get("worst") if isinstance(core, dict) else None
    if isinstance(worst, dict):
        out += _ratio("worst core state's speedup", worst.get("speedup_vs_fastest_float"))
    out += _ratio("A/A check", aa)
    tol = aa.get("tolerance") if isinstance(aa, dict) else None
    if tol is not None and not (_number(tol) and math.isfinite(tol) and tol >= 0):
        out.append(f"A/A tolerance {tol!r} is not a number >= 0")
    lat = at.get("latency_ms")
    for role, row in (lat.items() if isinstance(lat, dict) else ()):
        if not isinstance(row, dict):
            continue
        given = [(p, row[p]) for p in PERCENTILES if row.get(p) is not None]
        bad = [f"{p} {v!r}" for p, v in given if not (_number(v) and math.isfinite(v) and v > 0)]
        if bad:
            out.append(f"{role} latency {', '.join(bad)} ms is not a positive number")
        elif any(a[1] > b[1] for a, b in zip(given, given[1:])):
            out.append(f"{role} latency percentiles out of order "
                       f"({', '.join(f'{p} {v:.2f}' for p, v in given)} ms)")
    return out
