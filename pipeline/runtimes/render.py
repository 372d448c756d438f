"""The report's "Runtimes" section: one row per artifact, one column per runtime and precision.

In: the ``runtimes`` summary of a run (``runtimes.plan.Plan.decide``). Out: markdown lines. Each
cell holds the accuracy measured on that target and p50 per batch size, or the target's failure;
the chosen target is starred per batch size, with its numbers, and the kernels the deployed
candidate executed (the proof that an INT8 model ran as INT8).
"""
from __future__ import annotations

from pipeline.core import numbers

ROLES = (("export", "export"), ("fp32", "FP32"), ("fp16", "FP16"), ("candidate", "candidate"))


def _executed(ex: dict | None) -> str:
    if not ex or not ex.get("ops"):
        return "not read"
    parts = [f"{op} " + "+".join(f"{p}x{n}" for p, n in sorted(c.items()))
             for op, c in sorted(ex["ops"].items())]
    share = ex.get("conv_matmul_int8_share")
    shown = share is not None and "int8" in ex.get("precisions", [])
    return ", ".join(parts) + (f" (conv/matmul in INT8: {share:.0%})" if shown else "")


def _cell(cell: dict | None, metric: str, unit: str) -> str:
    if not cell:
        return "–"
    if "error" in cell and metric not in cell:
        return f"**failed**: {cell['error']}"
    out = []
    if cell.get(metric) is not None:
        out.append(numbers.in_unit(cell[metric], unit))
    for b, lat in (cell.get("latency_ms") or {}).items():
        out.append(f"b{b} {lat['p50']:.2f} ms")
    if "error" in cell:
        out.append(f"failed: {cell['error']}")
    return " · ".join(out) or "–"


def markdown(summary: dict | None, metric: str, unit: str = "%") -> list[str]:
    """``metric``: the primary metric's name; ``unit``: its unit ("%": points of a percentage;
    otherwise a plain number such as a cosine)."""
    if not summary:
        return []
    cols = summary["targets"]
    lines = ["## Runtimes", "",
             f"Mode: {summary['mode']}. Each cell: {metric.replace('_', ' ')} measured on that "
             "target, then p50 per batch size (timed side by side in one process; blocks of runs "
             "when runtimes mix).", "",
             "| artifact | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    chosen = {c["target"] for c in summary.get("choice", {}).values()}
    for role, title in ROLES:
        cells = summary["cells"].get(role, {})
        row = [title] + [("★ " if role == "candidate" and t in chosen else "")
                         + _cell(cells.get(t), metric, unit) for t in cols]
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    for b, c in summary.get("choice", {}).items():
        sp = c.get("speedup_vs_fastest_float") or {}
        lines.append(f"- batch {b}: **{c['target']}** — {metric.replace('_', ' ')} "
                     f"{numbers.in_unit(c[metric], unit)} (drop "
                     f"{numbers.drop_in_unit(c['accuracy_drop'], unit)} vs FP16), p50 "
                     f"{c['p50']:.2f} ms, p99 {c['p99']:.2f} ms"
                     + (f", {sp['median']:.2f}x vs the fastest float" if sp else "")
                     + ("" if c["passes_accuracy"] else " — **no target passed the accuracy gate**")
                     + (f" (of {len(c['considered'])} targets)" if len(c["considered"]) > 1 else ""))
    d = summary["deployed"]
    lines.append(f"- deployed: {d['runtime']} {d.get('version') or ''}, precision {d['precision']}, "
                 f"{d['intra_op_threads']} threads, hint {d['performance_hint']}; executed: "
                 f"{_executed(d.get('executed'))}")
    for key, reason in summary.get("failures", {}).items():
        lines.append(f"- failed: {key}: {reason}")
    for key, reason in summary.get("unavailable", {}).items():
        lines.append(f"- not available: {key}: {reason}")
    return lines
