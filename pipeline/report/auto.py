"""The report's ``quant=auto`` section: every candidate on every runtime, the winner and why.

In: the ``AutoResult`` of a run (``pipeline.recipes.auto_result``), or report.json's ``auto``
section, which is read into one first; for the float regions, a ``FloatRegions`` record
(``pipeline.recipes.regions_record``) or its JSON. Out: markdown lines: the table (candidate,
runtime, accuracy, p50 per batch size, speedup over the fastest float baseline with its 95 % CI,
the gate's verdict and the checks that failed), why the winner won, and the float regions the
INT8 candidate tried with what each cost or saved end to end.
"""
from __future__ import annotations

from pipeline.core import numbers
from pipeline.core.json_record import to_json
from pipeline.recipes.auto_result import AutoResult
from pipeline.recipes.regions_record import FloatRegions
from pipeline.stages.regions import BASE, FP32


def _ci(sp) -> str:
    """A ``Speedup`` with its interval, or the missing mark."""
    return numbers.ratio(sp.median, [sp.low, sp.high]) if sp else numbers.NONE


def regions_markdown(regions) -> list[str]:
    """``regions``: a ``FloatRegions`` (or its JSON, or None: nothing to say)."""
    reg = FloatRegions.of(regions)
    if not reg:
        return []
    lines = ["", "### Float regions (INT8 candidate)", "", f"{reg.summary}", ""]
    if reg.trials:
        base_ms, fp32_ms = reg.p50_ms[BASE], reg.p50_ms[FP32]  # the starting INT8 model, FP32
        lines += [f"Timed end to end together at batch {reg.batch_size} "
                  f"({reg.rounds} interleaved rounds, at most {reg.limit} trials); the "
                  f"starting INT8 model ran {_ci(reg.all_int8_over_fp32)} FP32 (p50 "
                  f"{base_ms:.2f} ms, FP32 {fp32_ms:.2f} ms).", "",
                  "| trial (float) | regions | float nodes | p50 ms | saved vs INT8 ms | "
                  "vs INT8 (95 % CI) | vs FP32 (95 % CI) |", "|---|---|---|---|---|---|---|"]
        for t in reg.trials:
            lines.append(f"| {t.name}{' ★' if t.name == reg.kept else ''} | "
                         f"{', '.join(t.regions)} | {len(t.float_nodes)} | "
                         f"{t.p50_ms:.2f} | {t.ms_saved_vs_all_int8:+.2f} | "
                         f"{_ci(t.speedup_over_all_int8)} | {_ci(t.speedup_over_fp32)} |")
    if reg.regions:
        lines += ["", "Regions (module path, graph order) and their profiled INT8 gain: " + "; ".join(
            f"{r.name} ({r.nodes} nodes, {r.profile_gain_ms:+.3f} ms)" for r in reg.regions)]
    return lines


def markdown(auto, metric: str, unit: str = "%") -> list[str]:
    """``auto``: the run's ``AutoResult`` (or report.json's ``auto`` section); ``metric``: the
    primary metric's name; ``unit``: its unit (``numbers.in_unit``)."""
    auto = AutoResult.of(auto)
    w = auto.winner
    batches = sorted({b for r in auto.table for b in r.latency_ms}, key=int)
    lines = ["", "## quant=auto: every candidate on every runtime", "",
             f"**Winner: {w.candidate} on {w.target}.**", ""]
    lines += [f"- {s}" for s in auto.why]
    lines += ["", f"Each row: the candidate on that runtime, accuracy measured there, p50 per batch "
              f"size from one side-by-side benchmark, speedup over the fastest float baseline at "
              f"batch {auto.gate_batch} (median of per-round ratios, 95 % CI) and the gate's "
              "verdict on it as if it shipped.", "",
              f"| candidate | runtime | {metric.replace('_', ' ')} | drop | agree fp16 | "
              + " | ".join(f"p50 b{b} ms" for b in batches)
              + f" | speedup b{auto.gate_batch} | verdict |",
              "|---|---|---|---|---|" + "---|" * len(batches) + "---|---|"]
    for r in auto.table:
        acc = numbers.in_unit(r.accuracy if r.metric == metric else None, unit)
        drop = numbers.drop_in_unit(r.accuracy_drop, unit)
        lat = [f"{r.latency_ms[b].p50:.2f}" if b in r.latency_ms else "–" for b in batches]
        verdict = "pass" if r.passed else "fail: " + ", ".join(r.failed)
        star = " ★" if r.label == w.label else ""
        agree = numbers.percent(r.agreement_with_fp16, fraction=True)  # output_agreement's value
        lines.append(f"| {r.candidate}{star} | {r.target} | {acc} | {drop} | {agree} | "
                     + " | ".join(lat) + f" | {_ci(r.speedup_vs_fastest_float)} | {verdict} |")
    for k, v in to_json(auto.notes).items():
        lines.append(f"- {k}: {v}")
    for k, v in auto.unavailable.items():
        lines.append(f"- not available: {k}: {v}")
    for k, v in auto.failures.items():
        lines.append(f"- failed: {k}: {v}")
    int8 = auto.int8
    trial = int8.latency_trial if int8 else None
    if trial:
        lines.append(f"- INT8 latency-aware node trial: {len(trial.float_nodes)} nodes float, "
                     f"{_ci(trial.speedup_over_all_int8)} the all-INT8 model"
                     + (" (kept)" if int8.latency_exclusions else " (not kept)"))
    lines += regions_markdown(int8.regions if int8 else None)
    return lines
