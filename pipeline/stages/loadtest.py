"""loadtest: the highest request rate each model serves within the p99 target, and soak.

In: the candidate and the FP32 baseline. Out: ``load.json``. ``bench.mode=load``: for each
model, open-loop Poisson arrivals at increasing QPS through the dynamic batcher
(``pipeline.measure.serving``), once with dynamic batching (``bench.load.max_batch``) and once serving
batch 1; per step p50/p99/p999 (queueing included), achieved QPS and the batch-size histogram, and
the highest offered QPS whose p99 meets ``slo.p99_ms``. ``bench.mode=soak``: the candidate at a
fixed rate for ``bench.load.soak_seconds``, RSS and p99 sampled every second; a steady RSS climb is
reported as a leak.

The QPS steps are derived from each model's own measured service time (batch 1 and max batch), so
a slow model is not flooded and a fast one is pushed to its limit; steps stop after the first one
that misses the target or saturates, and the rate is then refined by bisection between the
last step that met it and the first that did not. Models run on ``hardware``'s runtime and settings: with
``runtime=auto``, the target chosen for the gate's batch size (``pipeline.runtimes.plan``).
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.measure.serving import rss_mb, serve


def qps_steps(ms_b1: float, ms_bmax: float, max_batch: int, n: int) -> list[float]:
    """Geometric steps from 5 % of batch-1 capacity to 1.5x max-batch capacity. The low start
    matters: a Python batcher's own wake-ups already cost a millisecond or more on a VM."""
    low = 0.05 * 1000.0 / ms_b1
    high = 1.5 * max_batch * 1000.0 / ms_bmax
    return [float(q) for q in np.geomspace(low, max(high, 2 * low), n)]


def shape_key(bucket: int):
    """A request's shape class: every dimension but the batch, of every input, rounded up to
    ``bucket``."""
    if not bucket:
        return None

    def key(feeds):
        arrays = feeds.values() if isinstance(feeds, dict) else [feeds]
        return tuple(-(-d // bucket) for a in arrays for d in a.shape[1:])

    return key


def max_within(step_at, grid: list[float], refine: int) -> list[dict]:
    """Walk up the QPS grid until a step misses the target, then bisect (geometrically) between
    the last rate that met it and the first that did not, ``refine`` times. The coarse grid alone
    reads the capacity to within a grid factor (about 1.8x): too coarse to tell two serving
    policies apart. Returns every step run, in order; each has ``meets_slo``."""
    steps: list[dict] = []
    for qps in grid:
        steps.append(step_at(qps, len(steps)))
        if not steps[-1]["meets_slo"]:
            break
    if len(steps) < 2 or steps[-1]["meets_slo"]:
        return steps
    lo, hi = steps[-2]["offered_qps"], steps[-1]["offered_qps"]
    for _ in range(refine):
        step = step_at(float(np.sqrt(lo * hi)), len(steps))
        step["refinement"] = True
        steps.append(step)
        lo, hi = (step["offered_qps"], hi) if step["meets_slo"] else (lo, step["offered_qps"])
    return steps


def leak(samples: list[tuple[float, float]], mb_per_min: float) -> dict:
    """Slope of RSS over time after the first fifth (allocators settle first)."""
    t = np.array([s[0] for s in samples])
    rss = np.array([s[1] for s in samples])
    keep = t >= t.max() / 5 if t.size else t
    if keep.sum() < 3:
        return {"slope_mb_per_min": None, "leak": False, "note": "too few samples"}
    slope = float(np.polyfit(t[keep], rss[keep], 1)[0] * 60.0)
    return {"slope_mb_per_min": slope, "threshold": mb_per_min, "leak": slope > mb_per_min,
            "rss_start_mb": float(rss[keep][0]), "rss_end_mb": float(rss[-1])}


@dataclass(frozen=True)
class LoadTest:
    data: object           # DataSplit: the evaluation samples the requests are drawn from
    mode: str              # "load" or "soak"
    load: object           # LoadConfig
    slo_p99_ms: float
    hardware: object
    nonce: str = ""        # a new value forces a fresh measurement
    name = "loadtest"
    version = 4
    hardware_dependent = True

    def run(self, parent, out_dir: Path, fp32) -> dict:
        import os

        from pipeline import runtimes
        from pipeline.measure import timing
        from pipeline.models import task

        cfg, hw = self.load, self.hardware
        if hw.affinity:
            os.sched_setaffinity(0, hw.affinity)
        from pipeline.data import real_batches

        t = task(self.data.task)
        pool = real_batches.singles(t, t.dataset(self.data))
        result: dict = {"slo_p99_ms": self.slo_p99_ms, "mode": self.mode, "models": {}}
        models = {"candidate": parent.model} if self.mode == "soak" else \
            {"candidate": parent.model, "fp32": fp32.model}
        for role, path in models.items():
            # On the deployed target: the candidate at its precision, the FP32 baseline in fp32.
            run = runtimes.load(path, hw if role == "candidate" else
                                dataclasses.replace(hw, precision="fp32")).run
            # pool is sorted by width: the max batch is of the median width, as the batcher forms them
            full = t.stack([pool[len(pool) // 2]] * cfg.max_batch)
            timing.warm_up(run, [pool[0], full])
            ms_b1 = float(np.median([timing.clock_ms(run, pool[k]) for k in range(20)]))
            ms_bmax = float(np.median([timing.clock_ms(run, full) for _ in range(10)]))
            entry = {"service_ms": {"1": ms_b1, str(cfg.max_batch): ms_bmax}}
            if self.mode == "soak":
                entry["soak"] = self._soak(run, pool, t, ms_b1)
            else:
                for policy, max_batch in (("dynamic", cfg.max_batch), ("batch1", 1)):
                    def step_at(qps, seed):
                        step = serve(run, pool, t.stack, qps, cfg.step_seconds, max_batch,
                                     cfg.max_wait_ms, seed=seed, key=shape_key(cfg.shape_bucket))
                        step["meets_slo"] = (not step["saturated"]) and step["p99_ms"] <= self.slo_p99_ms
                        return step

                    steps = max_within(step_at, qps_steps(ms_b1, ms_bmax, cfg.max_batch, cfg.steps),
                                       cfg.refine_steps)
                    ok = [s for s in steps if s["meets_slo"]]
                    entry[policy] = {"steps": steps,
                                     "max_qps_within_slo": max((s["offered_qps"] for s in ok), default=0.0),
                                     "throughput_at_max": max((s["achieved_qps"] for s in ok), default=0.0)}
            result["models"][role] = entry
        (out_dir / "load.json").write_text(json.dumps(result, indent=2))
        return result

    def _soak(self, run, pool, t, ms_b1: float) -> dict:
        cfg = self.load
        qps = cfg.soak_qps or 0.5 * 1000.0 / ms_b1
        samples: list[tuple[float, float]] = []
        p99s: list[tuple[float, float]] = []

        def tick(now, latencies):
            samples.append((now, rss_mb()))
            recent = latencies[-max(1, int(qps)):]
            p99s.append((now, float(np.percentile(recent, 99))))

        step = serve(run, pool, t.stack, qps, cfg.soak_seconds, cfg.max_batch,
                     cfg.max_wait_ms, on_tick=tick, key=shape_key(cfg.shape_bucket))
        return {"qps": qps, "seconds": cfg.soak_seconds, "summary": step,
                "rss_mb": samples, "p99_ms_per_second": p99s,
                "memory": leak(samples, cfg.leak_mb_per_min)}
