"""The accuracy gate's limits: which metrics are judged, and how far each may fall, in its own scale.

In: ``gate.max_accuracy_drop`` as the user set it (null: every metric's own default; a number: the
primary metric's limit, as the key meant before limits were per metric; a mapping metric -> limit:
those metrics, each in its own scale, on top of the defaults) and the task's metrics (a
``MetricsSpec``, or a lone primary ``MetricSpec``). Out: metric name -> limit, the primary first,
and each judged metric's drop against the FP16 baseline with its verdict. Judged by default: the
primary and what it is gated with (the mean cosine brings its 1st percentile). A limit for a
metric no task reports is refused when the config is made (``check_names``); one for a metric
the task at hand does not report, or a judged metric without a limit (a difference in the
output's own units), before any stage runs (``limits``), each in one line.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from pipeline.core.errors import ConfigError
from pipeline.metrics import SPECS
from pipeline.task.metric import MetricSpec

KEY = "gate.max_accuracy_drop"
TOPK = re.compile(r"top[1-9][0-9]*")  # classification's top-k is named after metric.top_k


def known(name: str) -> bool:
    return name in SPECS or bool(TOPK.fullmatch(name))


def check_names(setting) -> None:
    """Compose time: every metric a mapping names is one some task reports."""
    if isinstance(setting, dict):
        unknown = [str(k) for k in setting if not known(str(k))]
        if unknown:
            raise ConfigError(f"{KEY}: no metric is named {unknown[0]!r}; metrics: "
                              f"{', '.join(sorted(SPECS))}, top<k>")


def _parts(metrics) -> tuple[dict[str, MetricSpec], str]:
    if isinstance(metrics, MetricSpec):
        return {metrics.name: metrics}, metrics.name
    return {s.name: s for s in metrics.specs}, metrics.primary


def primary(metrics) -> MetricSpec:
    specs, name = _parts(metrics)
    return specs[name]


def limits(setting, metrics) -> dict[str, float]:
    """Metric name -> the largest drop against FP16 that passes, primary first."""
    specs, first = _parts(metrics)
    given = ({str(k): v for k, v in setting.items()} if isinstance(setting, dict)
             else {} if setting is None else {first: setting})
    wanted = [first, *(n for n in specs[first].gated_with if n in specs), *given]
    out = {}
    for name in dict.fromkeys(wanted):
        if name not in specs:
            raise ConfigError(f"{KEY}: a limit for {name}, which this model does not report "
                              f"(it reports {', '.join(specs)})")
        limit = given.get(name, specs[name].limit)
        if limit is None:
            raise ConfigError(f"{KEY}: {name} has no default limit (a difference in "
                              f"{specs[name].scale}, which only you can size); set one, e.g. "
                              f"{KEY}={{{name}: 0.01}}")
        out[name] = float(limit)
    return out


@dataclass(frozen=True)
class Judged:
    """One judged metric: the reference's value, the candidate's, the drop (positive: worse;
    NaN when either is missing, which fails), the limit in the metric's scale and the verdict."""
    metric: str
    reference: float
    candidate: float
    drop: float
    limit: float
    scale: str
    unit: str
    passed: bool


def judged(reference: dict, candidate: dict, setting, metrics) -> list[Judged]:
    """Each judged metric, the primary first."""
    specs, _ = _parts(metrics)
    rows = []
    for name, limit in limits(setting, metrics).items():
        s = specs[name]
        ref, cand = reference.get(name, math.nan), candidate.get(name, math.nan)
        drop = s.drop(ref, cand)
        rows.append(Judged(name, ref, cand, drop, limit, s.scale, s.unit,
                           math.isfinite(drop) and drop <= limit + 1e-9))
    return rows


def within(reference: dict, candidate: dict, setting, metrics) -> bool:
    """Every judged metric within its limit."""
    return all(r.passed for r in judged(reference, candidate, setting, metrics))
