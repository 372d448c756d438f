"""benchmark: latency of the candidate and the float baselines, timed side by side.

In: the candidate artifact and the baselines by role (``fp32``, ``fp16``, ``export``). Out:
``latency.json`` with, per batch size: p50/p90/p99/p999, mean and throughput per model; the
candidate's speedup over each baseline and over the fastest float baseline (median of per-round
ratios, bootstrap 95 % interval); the A/A check; per-shape latencies with outliers flagged; the
input contract (the shapes that were measured); and cold-start times per model.

How it is timed, and why: all sessions live in one child process pinned to ``hardware.affinity``
and share one global thread pool (per-session pools make identical models read 0.67x on 2 cores).
Each model warms up until its timings stabilise. Rounds then run every model on the same real
batch in a rotated order (``pipeline.timing``), cycling through batches drawn from each width
bucket of the evaluation set, so the numbers describe the input distribution, not one shape.
The ``fp32`` model is loaded twice: the ratio between the copies (the A/A check) must read
1.00 +- ``aa_tolerance`` or the timing is not trusted. Rounds continue while the intervals are
wider than ``rel_ci``, up to ``max_seconds``; a result still wide then is flagged noisy.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline import timing

FLOAT_ROLES = ("fp32", "fp16")
AA_ROLE = "fp32 (A/A copy)"
OUTLIER_FACTOR = 1.5  # an input 1.5x slower than its shape predicts is flagged


def width_buckets(widths: np.ndarray, n: int) -> list[np.ndarray]:
    """Indices of the evaluation lines split into ``n`` buckets of equal count by width."""
    order = np.argsort(widths, kind="stable")
    return [b for b in np.array_split(order, n) if b.size]


def shape_outliers(per_width: dict) -> list[dict]:
    """Inputs whose latency jumps out of line with the others': more than ``OUTLIER_FACTOR``
    times what a straight line through (width, p50) of all of that model's inputs predicts.
    A runtime falling back to a slow kernel for one shape shows up this way."""
    flagged = []
    for role, rows in per_width.items():
        if len(rows) < 3:
            continue
        w = np.array([r["width"] for r in rows], dtype=float)
        y = np.array([r["p50"] for r in rows])
        slope, intercept = np.polyfit(w, y, 1)
        for r, expected in zip(rows, intercept + slope * w):
            if expected > 0 and r["p50"] > OUTLIER_FACTOR * expected:
                flagged.append({"model": role, "width": r["width"], "p50": r["p50"],
                                "expected_p50": float(expected)})
    return flagged


@dataclass(frozen=True)
class Benchmark:
    task: str
    bench: object          # BenchConfig
    eval_samples: int
    data_dir: str
    hardware: object
    name = "benchmark"
    version = 3
    hardware_dependent = True

    def run(self, parent, out_dir: Path, **baselines) -> dict:
        from pipeline import coldstart, ort
        from pipeline.env import environment
        from pipeline.models import task

        cfg, hw = self.bench, self.hardware
        if hw.affinity:
            os.sched_setaffinity(0, hw.affinity)
        t = task(self.task)
        ds, _ = t.dataset("evaluation", self.eval_samples, self.data_dir)
        models = {"candidate": parent.model, **{r: a.model for r, a in baselines.items()}}
        models[AA_ROLE] = baselines["fp32"].model
        sessions = {role: ort.session(path, hw) for role, path in models.items()}
        fns = {role: (lambda x, s=s: ort.run(s, x)) for role, s in sessions.items()}
        buckets = width_buckets(np.asarray(ds["width"]), cfg.width_buckets)
        rng = np.random.default_rng(0)
        result: dict = {"batches": {}, "affinity": sorted(os.sched_getaffinity(0))}
        shapes, raw = [], {}
        for b in cfg.batch_sizes:
            inputs, bucket_of = [], []
            for k, idx in enumerate(buckets):
                for _ in range(cfg.batches_per_bucket):
                    pick = [int(i) for i in rng.choice(idx, size=min(b, idx.size), replace=False)]
                    inputs.append(next(t.batches(ds.select(pick), b))[1])
                    bucket_of.append(k)
            shapes += [x.shape for x in inputs]
            warm = {role: timing.warm_up(fn, inputs, cfg.warmup_window, cfg.warmup_tolerance,
                                         cfg.warmup_max_runs) for role, fn in fns.items()}
            floats = [r for r in FLOAT_ROLES if r in fns]
            pairs = [(f, "candidate") for f in floats] + [("fp32", AA_ROLE)]
            times, run_info = timing.interleaved(fns, inputs, pairs, cfg.min_rounds,
                                                 cfg.max_seconds, cfg.rel_ci, cfg.block)
            stats = {role: timing.percentiles(v, b) for role, v in times.items()}
            raw[str(b)] = {role: [round(float(ms), 4) for ms in v] for role, v in times.items()}
            fastest = min(floats, key=lambda r: stats[r]["p50"])
            used = np.arange(run_info["rounds"]) % len(inputs)
            per_width = {role: sorted(({"width": int(x.shape[-1]), "bucket": bucket_of[i],
                                        "p50": float(np.median(v[used == i]))}
                                       for i, x in enumerate(inputs) if np.any(used == i)),
                                      key=lambda r: r["width"])
                         for role, v in times.items()}
            aa = timing.ratio_ci(times["fp32"], times[AA_ROLE])
            result["batches"][str(b)] = {
                "latency_ms": stats,
                "speedup": {role: timing.ratio_ci(times[role], times["candidate"])
                            for role in times if role != "candidate"},
                "fastest_float": fastest,
                "speedup_vs_fastest_float": timing.ratio_ci(times[fastest], times["candidate"]),
                "aa_check": {**aa, "tolerance": cfg.aa_tolerance,
                             "ok": abs(aa["median"] - 1.0) <= cfg.aa_tolerance},
                "warmup_runs": warm, **run_info,
                "per_width": per_width, "shape_outliers": shape_outliers(per_width),
            }
        result["input_contract"] = contract(t, shapes)
        result["environment"] = environment(hw)
        if cfg.cold_start_repeats:
            result["cold_start_ms"] = {role: coldstart.measure(path, hw, cfg.cold_start_repeats,
                                                                 t.example_input(1).shape)
                                       for role, path in models.items() if role != AA_ROLE}
        (out_dir / "latency.json").write_text(json.dumps(result, indent=2))
        (out_dir / "times.json").write_text(json.dumps(raw))  # per-round ms, for the CDF plot
        return result


def contract(t, shapes: list[tuple]) -> dict:
    """What was measured, so a server can refuse inputs that never were."""
    dims = list(zip(*shapes))
    return {"input": t.INPUT_NAME, "dtype": "float32",
            "shape": [{"min": int(min(d)), "max": int(max(d))} for d in dims],
            "note": "dimension ranges measured by the benchmark; inputs outside them are untested"}
