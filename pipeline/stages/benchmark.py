"""benchmark: latency of the candidate and the float baselines, timed side by side.

In: the candidate artifact and the baselines by role (``fp32``, ``fp16``, ``export``). Out:
``latency.json`` with p50/p90/p99/p999, mean and throughput per model and batch size, and the
candidate's speedup over each baseline and over the fastest float baseline, as the median of
per-round ratios with a bootstrap 95 % interval.

How it is timed, and why: all sessions live in one child process and share one global thread pool
(per-session pools make identical models read 0.67x on 2 cores). Each round runs every model once
on the same real batch, in a rotated order, so slow drift of the machine hits all models alike. The
``fp32`` model is loaded twice; the ratio between the two copies (the A/A check) must read about
1.00, otherwise the machine was too noisy for the other numbers to mean anything.
Deliberately simple for now: fixed warm-up count, one shape distribution (random evaluation lines).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

FLOAT_ROLES = ("fp32", "fp16")
AA_ROLE = "fp32 (A/A copy)"


def percentiles(ms: np.ndarray, batch: int) -> dict:
    return {"p50": float(np.percentile(ms, 50)), "p90": float(np.percentile(ms, 90)),
            "p99": float(np.percentile(ms, 99)), "p999": float(np.percentile(ms, 99.9)),
            "mean": float(ms.mean()), "throughput": float(batch * 1000.0 / ms.mean()),
            "runs": int(ms.size)}


def ratio_ci(num: np.ndarray, den: np.ndarray, seed: int = 0, resamples: int = 2000) -> dict:
    """Median of per-round ratios num/den with a bootstrap 95 % confidence interval."""
    ratios = num / den
    rng = np.random.default_rng(seed)
    boots = np.median(rng.choice(ratios, size=(resamples, ratios.size)), axis=1)
    return {"median": float(np.median(ratios)), "ci95": [float(np.percentile(boots, 2.5)),
                                                          float(np.percentile(boots, 97.5))]}


@dataclass(frozen=True)
class Benchmark:
    task: str
    batch_sizes: tuple[int, ...]
    warmup_runs: int
    runs: int
    eval_samples: int
    data_dir: str
    hardware: object
    name = "benchmark"
    version = 1
    hardware_dependent = True

    def run(self, parent, out_dir: Path, **baselines) -> dict:
        from pipeline import ort
        from pipeline.models import task

        t = task(self.task)
        ds, _ = t.dataset("evaluation", self.eval_samples, self.data_dir)
        models = {"candidate": parent.model, **{r: a.model for r, a in baselines.items()}}
        models[AA_ROLE] = baselines["fp32"].model
        sessions = {role: ort.session(path, self.hardware) for role, path in models.items()}
        roles = list(sessions)
        rng = np.random.default_rng(0)
        result = {"batches": {}}
        for b in self.batch_sizes:
            inputs = []
            for _ in range(8):  # a few real batches, cycled, identical for every model
                pick = [int(i) for i in rng.choice(len(ds), size=min(b, len(ds)), replace=False)]
                inputs.append(next(t.batches(ds.select(pick), b))[1])
            for role in roles:
                for k in range(self.warmup_runs):
                    ort.run(sessions[role], inputs[k % len(inputs)])
            times = {role: np.empty(self.runs) for role in roles}
            for r in range(self.runs):
                x = inputs[r % len(inputs)]
                shift = r % len(roles)
                for role in roles[shift:] + roles[:shift]:
                    t0 = time.perf_counter_ns()
                    ort.run(sessions[role], x)
                    times[role][r] = (time.perf_counter_ns() - t0) / 1e6
            stats = {role: percentiles(times[role], b) for role in roles}
            floats = [r for r in FLOAT_ROLES if r in times]
            fastest = min(floats, key=lambda r: stats[r]["p50"])
            result["batches"][str(b)] = {
                "latency_ms": stats,
                "speedup": {role: ratio_ci(times[role], times["candidate"])
                            for role in roles if role != "candidate"},
                "fastest_float": fastest,
                "speedup_vs_fastest_float": ratio_ci(times[fastest], times["candidate"]),
                "aa_check": ratio_ci(times["fp32"], times[AA_ROLE]),
                "input_widths": sorted({int(x.shape[-1]) for x in inputs}),
            }
        (out_dir / "latency.json").write_text(json.dumps(result, indent=2))
        return result
