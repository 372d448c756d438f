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

from pipeline.measure.load import leak, max_within, qps_steps, shape_key
from pipeline.measure.serving import rss_mb, serve


@dataclass(frozen=True)
class LoadTest:
    data: object           # DataSplit: the evaluation samples the requests are drawn from
    mode: str              # "load" or "soak"
    load: object           # LoadConfig
    slo_p99_ms: float
    hardware: object
    nonce: str = ""        # a new value forces a fresh measurement
    name = "loadtest"
    version = 5  # 5: a step drains for as long as it lasted (1-5 s), not always 5 s
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
            # pool is sorted by size: the max batch is of the median size, as the batcher forms them
            full = t.stack([pool[len(pool) // 2]] * cfg.max_batch)
            timing.warm_up(run, [pool[0], full])
            # 20 single requests, cycling through the pool (an evaluation set may hold fewer)
            ms_b1 = float(np.median([timing.clock_ms(run, pool[k % len(pool)]) for k in range(20)]))
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
