"""The serving simulation: open-loop arrivals, the dynamic batcher, saturation, leak detection.

Every serve here runs on a ``VirtualClock``: the stand-in model "takes" its milliseconds by
sleeping on that clock, so the batcher's rules are checked on exact durations, in no time,
however busy the machine is.
"""
from __future__ import annotations

import numpy as np
import pytest

from pipeline.measure.clock import VirtualClock
from pipeline.measure.serving import serve
from pipeline.measure.load import leak, max_within, qps_steps, shape_key


def sleepy(clock, ms_fixed: float, ms_per_item: float):
    """A stand-in model whose batch costs a fixed part plus a per-item part."""
    def run(batch):
        clock.sleep((ms_fixed + ms_per_item * len(batch)) / 1000.0)
    return run


def stack(items):
    return list(items)


def _serve(model_ms: tuple[float, float], **kw) -> dict:
    clock = VirtualClock(start=100.0)
    return serve(sleepy(clock, *model_ms), list(range(10)), stack, clock=clock, **kw)


def test_light_load_meets_target_and_batches_little():
    r = _serve((1.0, 0.1), qps=50, seconds=1.0, max_batch=8, max_wait_ms=2.0)
    assert 30 <= r["requests"] <= 75  # Poisson around 50
    assert r["completed"] == r["requests"] and not r["saturated"]
    assert r["mean_batch"] < 1.2
    # a lone request waits its 2 ms for company, then runs alone (1.1 ms)
    assert r["p50_ms"] == pytest.approx(3.1)


def test_dynamic_batching_serves_a_rate_batch1_cannot():
    # 5 ms fixed cost per call: batch-1 serving tops out near 200 requests/s.
    heavy = dict(qps=400, seconds=1.0, max_wait_ms=3.0, drain_seconds=0.5)
    single = _serve((5.0, 0.1), max_batch=1, **heavy)
    dynamic = _serve((5.0, 0.1), max_batch=8, **heavy)
    assert single["saturated"] and not dynamic["saturated"]
    assert dynamic["p99_ms"] < single["p99_ms"] and dynamic["mean_batch"] > 1.5
    assert sum(int(k) * v for k, v in dynamic["batch_histogram"].items()) == dynamic["completed"]
    assert max(int(k) for k in dynamic["batch_histogram"]) <= 8
    # batch 1 completes what 5.1 ms a request allows in the 1.5 s the step and drain last
    assert single["completed"] == pytest.approx(1.5 / 0.0051, abs=2)


def test_batching_what_is_queued_waits_for_nobody():
    # max_wait 0: an idle server runs each request at once, a busy one batches the queue.
    light = _serve((1.0, 0.1), qps=50, seconds=1.0, max_batch=8, max_wait_ms=0.0)
    waiting = _serve((1.0, 0.1), qps=50, seconds=0.5, max_batch=8, max_wait_ms=20.0)
    assert light["mean_batch"] < 1.2 and light["p50_ms"] == pytest.approx(1.1)
    assert waiting["p50_ms"] > 20.0
    heavy = _serve((5.0, 0.1), qps=400, seconds=1.0, max_batch=8, max_wait_ms=0.0,
                   drain_seconds=0.5)
    assert not heavy["saturated"] and heavy["mean_batch"] > 1.5


def test_an_overloaded_step_drains_for_as_long_as_it_lasted_not_five_seconds():
    # 20 ms a request, one at a time (50 QPS at most), offered 2,000 QPS for half a second: a
    # thousand requests queue. The step is saturated; draining them all would take 20 s.
    clock = VirtualClock()
    r = serve(sleepy(clock, 20.0, 0.0), list(range(10)), stack, qps=2000, seconds=0.5,
              max_batch=1, max_wait_ms=0.0, clock=clock)
    assert r["saturated"] and r["backlog"] > 0.5 * r["requests"]
    # the step and a one-second drain, and the batch running when it ended: not five seconds
    assert 1.5 <= clock.now() <= 1.5 + 0.020
    assert r["completed"] == 75  # 1.5 s of 20 ms requests, the last one started before 1.5 s


def test_an_idle_server_sleeps_until_the_next_arrival():
    """Between requests the batcher sleeps to the next due time, never in a busy loop."""
    clock = VirtualClock()
    r = serve(sleepy(clock, 1.0, 0.0), list(range(10)), stack, qps=20, seconds=1.0,
              max_batch=8, max_wait_ms=0.0, clock=clock)
    assert r["completed"] == r["requests"]
    # one sleep to each arrival and one per batch run: nothing else
    assert len(clock.slept) <= 2 * r["requests"] + 1


def test_batches_keep_to_one_shape_class():
    clock = VirtualClock()
    seen = []

    def run(batch):
        seen.append(batch)
        clock.sleep(0.004)

    narrow, wide = np.zeros((1, 1, 32, 60)), np.zeros((1, 1, 32, 300))
    r = serve(run, [narrow, wide], list, qps=600, seconds=1.0, max_batch=8, max_wait_ms=0.0,
              key=shape_key(32), drain_seconds=1.0, clock=clock)
    assert r["completed"] == r["requests"] and r["mean_batch"] > 1.5
    assert all(len({x.shape for x in b}) == 1 for b in seen)  # never padded across classes
    assert any(b[0].shape == narrow.shape for b in seen) and any(b[0].shape == wide.shape for b in seen)
    assert shape_key(0) is None and shape_key(32)(narrow) != shape_key(32)(wide)


def test_on_the_real_clock_a_short_step_still_serves():
    """The default clock is the machine's: a short light step completes every request."""
    import time

    def run(batch):
        time.sleep(0.0005)

    r = serve(run, list(range(10)), stack, qps=100, seconds=0.2, max_batch=8, max_wait_ms=1.0,
              drain_seconds=0.2)
    assert r["completed"] == r["requests"] > 0 and r["p50_ms"] >= 0.5


def test_max_qps_is_bisected_between_the_last_pass_and_the_first_miss():
    capacity, seen = 700.0, []

    def step_at(qps, seed):
        seen.append(qps)
        return {"offered_qps": qps, "meets_slo": qps <= capacity}

    steps = max_within(step_at, [100.0, 200.0, 400.0, 800.0, 1600.0], refine=4)
    assert seen[:4] == [100.0, 200.0, 400.0, 800.0] and len(steps) == 8  # 1600 never run
    best = max(s["offered_qps"] for s in steps if s["meets_slo"])
    assert 650 < best <= capacity and all(s.get("refinement") for s in steps[4:])
    assert max_within(step_at, [100.0, 200.0], refine=3) == steps[:2]  # never missed: no bisection


def test_qps_steps_span_the_capacity():
    steps = qps_steps(ms_b1=2.0, ms_bmax=8.0, max_batch=8, n=6)
    assert steps[0] == 25.0 and np.isclose(steps[-1], 1500.0) and steps == sorted(steps)


def test_leak_detection():
    flat = [(t, 100.0 + 0.01 * np.sin(t)) for t in range(60)]
    growing = [(t, 100.0 + 0.2 * t) for t in range(60)]  # 12 MB/min
    assert not leak(flat, 2.0)["leak"]
    g = leak(growing, 2.0)
    assert g["leak"] and 11 < g["slope_mb_per_min"] < 13
