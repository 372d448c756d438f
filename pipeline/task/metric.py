"""What a metric is to the gate: a name, a direction, a unit, its scale and its default limit.

In: nothing. Out: ``MetricSpec`` and ``drop``, the one place that turns "the candidate against the
FP16 baseline" into a loss that is positive when the candidate is worse, whatever the direction.
The gate, the mixed-precision search and the runtime choice compare through it, so none of them
needs to know whether a metric is an accuracy in points or an error rate. Each metric declares
the scale its drop is read in (points of a percentage, a cosine, a rank correlation, the output's
own units) and the largest drop its default gate lets through in that scale: 0.3 points is
nothing for an accuracy and everything for a cosine, which lives in [-1, 1]
(``pipeline.metrics.limits`` applies them, and ``gate.max_accuracy_drop`` overrides them).
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class MetricSpec:
    name: str
    higher_is_better: bool
    unit: str = "%"          # "%" (points), "" (a plain number), "ms", ...
    needs_labels: bool = True
    # The default gate: the largest drop against FP16 that passes, in ``scale``; None: no default
    # (a difference in the output's own units, which only the user can size).
    limit: float | None = 0.3
    scale: str = "points"    # what a drop is measured in: points, cosine, rho, output units
    gated_with: tuple[str, ...] = ()  # metrics the gate judges too when this one is primary

    def drop(self, baseline: float, candidate: float) -> float:
        """How much worse the candidate is than the baseline, in the metric's unit (negative:
        better). NaN when either value is missing, which a gate must treat as a failure."""
        if baseline is None or candidate is None or not (math.isfinite(baseline)
                                                         and math.isfinite(candidate)):
            return math.nan
        return baseline - candidate if self.higher_is_better else candidate - baseline
