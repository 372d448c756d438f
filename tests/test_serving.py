"""The serving simulation: open-loop arrivals, the dynamic batcher, saturation, leak detection."""
from __future__ import annotations

import time

import numpy as np

from pipeline.serving import serve
from pipeline.stages.loadtest import leak, qps_steps


def sleepy(ms_fixed: float, ms_per_item: float):
    """A stand-in model whose batch costs a fixed part plus a per-item part."""
    def run(batch):
        time.sleep((ms_fixed + ms_per_item * len(batch)) / 1000.0)
    return run


def stack(items):
    return list(items)


def test_light_load_meets_target_and_batches_little():
    r = serve(sleepy(1.0, 0.1), list(range(10)), stack, qps=50, seconds=1.0, max_batch=8,
              max_wait_ms=2.0)
    assert 30 <= r["requests"] <= 75  # Poisson around 50
    assert r["completed"] == r["requests"] and not r["saturated"]
    assert r["p50_ms"] >= 1.0 and r["mean_batch"] < 2


def test_dynamic_batching_serves_a_rate_batch1_cannot():
    # 5 ms fixed cost per call: batch-1 serving tops out near 200 requests/s.
    heavy = dict(qps=400, seconds=1.0, max_wait_ms=3.0, drain_seconds=0.5)
    single = serve(sleepy(5.0, 0.1), list(range(10)), stack, max_batch=1, **heavy)
    dynamic = serve(sleepy(5.0, 0.1), list(range(10)), stack, max_batch=8, **heavy)
    assert single["saturated"] and not dynamic["saturated"]
    assert dynamic["p99_ms"] < single["p99_ms"] and dynamic["mean_batch"] > 1.5
    assert sum(int(k) * v for k, v in dynamic["batch_histogram"].items()) == dynamic["completed"]
    assert max(int(k) for k in dynamic["batch_histogram"]) <= 8


def test_qps_steps_span_the_capacity():
    steps = qps_steps(ms_b1=2.0, ms_bmax=8.0, max_batch=8, n=6)
    assert steps[0] == 25.0 and np.isclose(steps[-1], 1500.0) and steps == sorted(steps)


def test_leak_detection():
    flat = [(t, 100.0 + 0.01 * np.sin(t)) for t in range(60)]
    growing = [(t, 100.0 + 0.2 * t) for t in range(60)]  # 12 MB/min
    assert not leak(flat, 2.0)["leak"]
    g = leak(growing, 2.0)
    assert g["leak"] and 11 < g["slope_mb_per_min"] < 13
