"""What a metric is to the gate: a name, a direction and a unit.

In: nothing. Out: ``MetricSpec`` and ``drop``, the one place that turns "the candidate against the
FP16 baseline" into a loss that is positive when the candidate is worse, whatever the direction.
The gate, the mixed-precision search and the runtime choice compare through it, so none of them
needs to know whether a metric is an accuracy in points or an error rate.
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

    def drop(self, baseline: float, candidate: float) -> float:
        """How much worse the candidate is than the baseline, in the metric's unit (negative:
        better). NaN when either value is missing, which a gate must treat as a failure."""
        if baseline is None or candidate is None or not (math.isfinite(baseline)
                                                         and math.isfinite(candidate)):
            return math.nan
        return baseline - candidate if self.higher_is_better else candidate - baseline
