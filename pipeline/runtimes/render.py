"""The report's "Runtimes" section: one row per artifact, one column per runtime and precision.

In: a run's ``RuntimePlan`` (``runtimes.record``, made by ``runtimes.plan.Plan.decide``). Out:
markdown lines. Each cell holds the accuracy measured on that target and p50 per batch size, or
the target's failure; the chosen target is starred per batch size, with its numbers, and the
kernels the deployed candidate executed (the proof that an INT8 model ran as INT8).
"""
from __future__ import annotations

from pipeline.core import numbers
from pipeline.runtimes.record import Cell, RuntimePlan

ROLES = (("export", "export"), ("fp32", "FP32"), ("fp16", "FP16"), ("candidate", "candidate"))


def _executed(ex: dict | None) -> str:
    if not ex or not ex.get("ops"):
        return "not read"
    parts = [f"{op} " + "+".join(f"{p}x{n}" for p, n in sorted(c.items()))
             for op, c in sorted(ex["ops"].items())]
    share = ex.get("conv_matmul_int8_share")
    shown = share is not None and "int8" in ex.get("precisions", [])
    return ", ".join(parts) + (f" (conv/matmul in INT8: {share:.0%})" if shown else "")


def _cell(cell: Cell | None, metric: str, unit: str) -> str:
    if cell is None:
        return "–"
    value = cell.metrics.get(metric)
    if cell.error is not None and metric not in cell.metrics:
        return f"**failed**: {cell.error}"
    out = [numbers.in_unit(value, unit)] if value is not None else []
    out += [f"b{b} {lat['p50']:.2f} ms" for b, lat in (cell.latency_ms or {}).items()]
    if cell.error is not None:
        out.append(f"failed: {cell.error}")
    return " · ".join(out) or "–"


def markdown(plan: RuntimePlan | None, metric: str, unit: str = "%") -> list[str]:
    """``metric``: the primary metric's name; ``unit``: its unit ("%": points of a percentage;
    otherwise a plain number such as a cosine)."""
    if not plan:
        return []
    cols = plan.targets
    lines = ["## Runtimes", "",
             f"Mode: {plan.mode}. Each cell: {metric.replace('_', ' ')} measured on that "
             "target, then p50 per batch size (timed side by side in one process; blocks of runs "
             "when runtimes mix).", "",
             "| artifact | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    chosen = {c.target for c in plan.choice.values()}
    for role, title in ROLES:
        cells = plan.cells.get(role, {})
        row = [title] + [("★ " if role == "candidate" and t in chosen else "")
                         + _cell(cells.get(t), metric, unit) for t in cols]
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    for b, c in plan.choice.items():
        sp = c.speedup_vs_fastest_float or {}
        lines.append(f"- batch {b}: **{c.target}** — {metric.replace('_', ' ')} "
                     f"{numbers.in_unit(c.accuracy(metric), unit)} (drop "
                     f"{numbers.drop_in_unit(c.accuracy_drop, unit)} vs FP16), p50 "
                     f"{c.p50:.2f} ms, p99 {c.p99:.2f} ms"
                     + (f", {sp['median']:.2f}x vs the fastest float" if sp else "")
                     + ("" if c.passes_accuracy else " — **no target passed the accuracy gate**")
                     + (f" (of {len(c.considered)} targets)" if len(c.considered) > 1 else ""))
    d = plan.deployed
    lines.append(f"- deployed: {d.runtime} {d.version or ''}, precision {d.precision}, "
                 f"{d.intra_op_threads} threads, hint {d.performance_hint}; executed: "
                 f"{_executed(d.executed)}")
    for key, reason in plan.failures.items():
        lines.append(f"- failed: {key}: {reason}")
    for key, reason in plan.unavailable.items():
        lines.append(f"- not available: {key}: {reason}")
    return lines
