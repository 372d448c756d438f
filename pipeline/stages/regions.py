"""regions: several INT8 models with different float regions, timed end to end side by side.

In: the INT8 model the trials start from (``parent``), the FP32 baseline (``fp32``) and one
``quantize`` artifact per trial (refs named ``t0``, ``t1``, ...). Out: per trial its p50 and
two ratios with bootstrap 95 % intervals, all from one interleaved run on the target's runtime:
over the starting INT8 model (> 1: keeping that region float paid) and over FP32 (> 1: this mix
beats the float model). One run for all of them, because ratios taken in separate runs on this
shared machine differ by more than the effects being judged.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

BASE, FP32 = "all-int8", "fp32"


@dataclass(frozen=True)
class RegionTrials:
    data: object           # DataSplit: the evaluation samples the batches are cut from
    batch_size: int
    hardware: object
    trials: tuple          # trial names, in the order of the refs t0, t1, ...
    min_rounds: int = 100
    max_seconds: float = 30.0
    name = "regions"
    version = 2
    hardware_dependent = True

    def run(self, parent, out_dir: Path, fp32, **refs) -> dict:
        from pipeline import runtimes
        from pipeline.measure import timing
        from pipeline.models import task

        from pipeline.data import real_batches

        t = task(self.data.task)
        b = self.batch_size
        inputs = real_batches.in_order(t, t.dataset(self.data), b)
        arts = {BASE: parent, FP32: fp32, **{name: refs[f"t{i}"] for i, name in enumerate(self.trials)}}
        fns = {role: runtimes.load(a.model, self.hardware).run for role, a in arts.items()}
        pairs = [(FP32, BASE)] + [(r, name) for name in self.trials for r in (BASE, FP32)]
        times, info = timing.head_to_head(fns, inputs, pairs, self.min_rounds, self.max_seconds,
                                          0.02)
        p50 = {role: float(timing.percentiles(v, b)["p50"]) for role, v in times.items()}
        rows = {name: {"p50_ms": p50[name],
                       "speedup_over_all_int8": timing.ratio_ci(times[BASE], times[name]),
                       "speedup_over_fp32": timing.ratio_ci(times[FP32], times[name]),
                       "ms_saved_vs_all_int8": p50[BASE] - p50[name]}
                for name in self.trials}
        return {"batch_size": b, "p50_ms": p50, "trials": rows,
                "all_int8_over_fp32": timing.ratio_ci(times[FP32], times[BASE]), **info}
