"""What a benchmark's timings say beyond their percentiles: the candidate's speedups split by core
state, inputs whose latency is out of line with their shape, how runs alternate when several
runtimes are timed together, and the input contract that was measured.

In: per-round times per model, the core-state probes, per-size medians, the shapes timed. Out:
plain dicts for ``latency.json`` (``stages/benchmark.py``). Core states are read by
``corestate``; the interleaving and ratio CIs are ``timing``.
"""
from __future__ import annotations

import math

import numpy as np

from pipeline.measure import timing

OUTLIER_FACTOR = 1.5  # an input 1.5x slower than its shape predicts is flagged
MIXED_BLOCK = 20      # runs per model per round when the timed set mixes runtimes (bench.block=1)
MIN_BLOCK_ROUNDS = 10  # rounds of blocks before the CI may stop the timing
MIN_STATE_ROUNDS = 20  # rounds a core state needs before its own speedup is reported


def shape_outliers(per_size: dict) -> list[dict]:
    """Inputs whose latency jumps out of line with the others': more than ``OUTLIER_FACTOR``
    times what a straight line through (size, p50) of all of that model's inputs predicts.
    A runtime falling back to a slow kernel for one shape shows up this way."""
    flagged = []
    for role, rows in per_size.items():
        if len(rows) < 3 or len({r["size"] for r in rows}) < 2:
            continue
        w = np.array([r["size"] for r in rows], dtype=float)
        y = np.array([r["p50"] for r in rows])
        slope, intercept = np.polyfit(w, y, 1)
        for r, expected in zip(rows, intercept + slope * w):
            if expected > 0 and r["p50"] > OUTLIER_FACTOR * expected:
                flagged.append({"model": role, "size": r["size"], "p50": r["p50"],
                                "expected_p50": float(expected)})
    return flagged


def core_states(probes: list, times: dict, fastest: str, rel_ci: float) -> dict:
    """The candidate's speedups split by the state of the cores they were timed in.

    ``changed``: the host moved the vCPUs while we timed and the candidate's speedup differs
    between the states by more than ``rel_ci``; ``worst`` is then the state the candidate fared
    worst in, which the gate judges (it may meet that state again in production)."""
    from pipeline.measure import corestate

    rounds = len(times["candidate"])
    groups = corestate.split(probes, rounds)
    rows = []
    for g in groups:
        m = g["mask"]
        if m.sum() < MIN_STATE_ROUNDS:
            continue
        rows.append({"round_trip_ns": round(g["round_trip_ns"], 1), "rounds": int(m.sum()),
                     "share": round(float(m.mean()), 3),
                     # per-round medians: how fast each model ran in this state (a busier host
                     # slows the baseline too, which tells two runs' states apart)
                     "p50_ms": {lab: float(np.median(v[m])) for lab, v in times.items()},
                     "speedup": {lab: timing.ratio_ci(times[lab][m], times["candidate"][m])
                                 for lab in times if lab != "candidate"},
                     "speedup_vs_fastest_float": timing.ratio_ci(times[fastest][m],
                                                                 times["candidate"][m])})
    readings = [v for _, v in probes if v is not None]
    medians = [r["speedup_vs_fastest_float"]["median"] for r in rows]
    changed = len(rows) > 1 and (max(medians) - min(medians)) / min(medians) > rel_ci
    worst = min(rows, key=lambda r: r["speedup_vs_fastest_float"]["ci95"][0]) if rows else None
    return {"probe": "core-to-core round trip, ns (pipeline.measure.corestate)",
            "available": bool(readings), "probes": len(readings),
            "probe_ns_range": [round(min(readings), 1), round(max(readings), 1)] if readings else None,
            "states": rows, "changed": changed, "worst": worst if changed else None}


def blocking(cfg, runtimes_timed: set) -> tuple[int, int, int]:
    """(block, min rounds, rounds between CI checks). Across runtimes, one engine's spinning
    workers slow the next one's first runs: alternate in blocks, of ``bench.block`` runs where
    it is set above 1 and of MIXED_BLOCK where it is left at 1, and count rounds so that each
    model still gets about ``min_rounds`` runs (at least MIN_BLOCK_ROUNDS rounds)."""
    mixed = len(runtimes_timed) > 1
    block = MIXED_BLOCK if mixed and cfg.block == 1 else cfg.block
    if block == 1:
        return 1, cfg.min_rounds, 50
    return block, max(MIN_BLOCK_ROUNDS, math.ceil(cfg.min_rounds / block)), MIN_BLOCK_ROUNDS


def contract(t, timed: list[dict]) -> dict:
    """What was measured, per input, so a server can refuse inputs that never were. The first
    input's entry stays at the top level (``input``, ``dtype``, ``shape``) as before."""
    per_input = []
    for spec in t.inputs:
        dims = list(zip(*(feeds[spec.name].shape for feeds in timed)))
        per_input.append({"input": spec.name, "dtype": str(timed[0][spec.name].dtype),
                          "shape": [{"min": int(min(d)), "max": int(max(d))} for d in dims]})
    return {**per_input[0], "inputs": per_input,
            "note": "dimension ranges measured by the benchmark; inputs outside them are untested"}


def speedups(times: dict, stats: dict, floats: list, candidates: list, probes: list, cfg,
             aa_role: str, by_label: bool) -> dict:
    """One batch size's verdict on speed: the candidate's ratio over every other model and over
    the fastest float baseline (each ``contender``'s too), the A/A check of ``fp32`` against its
    copy ``aa_role``, and the speedups per core state (``by_label``: each contender's as well)."""
    fastest = min(floats, key=lambda r: stats[r]["p50"])
    aa = timing.ratio_ci(times["fp32"], times[aa_role])
    out = {
        "speedup": {lab: timing.ratio_ci(times[lab], times["candidate"])
                    for lab in times if lab != "candidate"},
        "fastest_float": fastest,
        "speedup_vs_fastest_float": timing.ratio_ci(times[fastest], times["candidate"]),
        "speedup_vs_fastest_float_by_label": {
            lab: timing.ratio_ci(times[fastest], times[lab]) for lab in candidates},
        "aa_check": {**aa, "tolerance": cfg.aa_tolerance,
                     "ok": abs(aa["median"] - 1.0) <= cfg.aa_tolerance},
        "core_state": core_states(probes, times, fastest, cfg.rel_ci),
    }
    if by_label:
        out["core_state_by_label"] = {
            lab: core_states(probes, {**times, "candidate": times[lab]}, fastest, cfg.rel_ci)
            for lab in candidates}
    return out
