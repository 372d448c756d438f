"""The gate: may this candidate ship? Accuracy against the FP16 baseline, speed against the
fastest float baseline. In: evaluate artifacts by role, the benchmark artifact, ``GateConfig``.
Out: a machine-readable verdict with one entry per check. It fails closed: a missing or
non-finite measurement is a failed check, never a pass. Cheap and uncached, so changing a
threshold re-judges cached measurements without re-running them."""
from __future__ import annotations

import math

from pipeline.stages.evaluate import agreement


def _check(name, value, limit, ok, detail) -> dict:
    finite = isinstance(value, (int, float)) and math.isfinite(value)
    return {"check": name, "value": value, "limit": limit, "passed": bool(finite and ok(value)),
            "detail": detail if finite else f"{detail}: no valid measurement (fails closed)"}


def judge(evals: dict, bench, gate, primary_metric: str) -> dict:
    checks = []
    try:
        ref = evals["fp16"].meta["metrics"][primary_metric]
        cand = evals["candidate"].meta["metrics"][primary_metric]
        drop = ref - cand
    except (KeyError, TypeError):
        ref = cand = drop = float("nan")
    checks.append(_check("accuracy_drop", drop, gate.max_accuracy_drop,
                         lambda v: v <= gate.max_accuracy_drop + 1e-9,
                         f"{primary_metric} {cand:.2f} vs FP16 baseline {ref:.2f}: drop of "
                         f"{drop:.2f} points (max {gate.max_accuracy_drop})"))
    try:
        at = bench.meta["batches"][str(gate.speedup_batch_size)]
        sp = at["speedup_vs_fastest_float"]
        speed, ci, fastest = sp["median"], sp["ci95"], at["fastest_float"]
    except (KeyError, TypeError, AttributeError):
        speed, ci, fastest = float("nan"), [float("nan")] * 2, "?"
    checks.append(_check("speedup", speed, gate.min_speedup, lambda v: v >= gate.min_speedup,
                         f"{speed:.2f}x (95% CI {ci[0]:.2f}-{ci[1]:.2f}) vs the fastest float "
                         f"baseline ({fastest}) at batch {gate.speedup_batch_size} "
                         f"(min {gate.min_speedup}x)"))
    info = {}
    try:
        info["agreement_with_fp16"] = agreement(evals["candidate"], evals["fp16"])
        info["aa_check"] = bench.meta["batches"][str(gate.speedup_batch_size)]["aa_check"]
    except (KeyError, OSError, ValueError):
        pass
    passed = all(c["passed"] for c in checks)
    failed = [c["detail"] for c in checks if not c["passed"]]
    return {"passed": passed, "checks": checks, **info,
            "summary": "PASS" if passed else "FAIL: " + "; ".join(failed)}
