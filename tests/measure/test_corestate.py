"""The core-state probe and the benchmark's split of its rounds by state."""
from __future__ import annotations

import os

import numpy as np
import pytest

from pipeline.measure import corestate
from benchmarks.run import like_with_like
from pipeline.measure.latency import core_states


def test_states_split_only_at_a_wide_gap():
    assert corestate.states([330, 350, 310, 345]).tolist() == [0, 0, 0, 0]
    assert corestate.states([330, 680, 350, 700]).tolist() == [0, 1, 0, 1]
    assert corestate.states([500]).tolist() == [0]
    # Three placements in one run: three states, nearest first.
    assert corestate.states([520, 225, 400, 230, 510]).tolist() == [2, 0, 1, 0, 2]


def test_split_assigns_rounds_between_agreeing_probes_and_ignores_a_blip():
    # Probes every 10 rounds: near, near, far, far, near; one blip (900) inside the far run.
    probes = [[0, 220], [10, 230], [20, 510], [30, 900], [40, 520], [50, 225], [60, 222]]
    groups = corestate.split(probes, 60)
    assert [round(g["round_trip_ns"]) for g in groups] == [224, 520]
    near, far = (g["mask"] for g in groups)
    assert near[:10].all() and near[50:].all() and not near[10:50].any()
    assert far[20:40].all() and not far[:20].any()
    # Rounds 10-19 and 40-49 sit between probes that disagree: neither state claims them.
    assert not (near[10:20] | far[10:20]).any() and not (near[40:50] | far[40:50]).any()
    assert corestate.split([[0, None], [10, None]], 10) == []


def test_core_states_reports_each_state_and_the_worst():
    rng = np.random.default_rng(0)
    n = 200
    fp32 = 1.3 + rng.normal(0, 0.01, n)
    cand = np.where(np.arange(n) < 100, 1.3 / 2.5, 1.3 / 2.0) + rng.normal(0, 0.002, n)
    probes = [[r, 220.0 if r < 100 else 510.0] for r in range(0, n + 1, 10)]
    out = core_states(probes, {"candidate": cand, "fp32": fp32}, "fp32", rel_ci=0.03)
    assert out["changed"] and len(out["states"]) == 2
    near, far = out["states"]
    assert near["speedup_vs_fastest_float"]["median"] == pytest.approx(2.5, rel=0.02)
    assert far["speedup_vs_fastest_float"]["median"] == pytest.approx(2.0, rel=0.02)
    assert out["worst"]["round_trip_ns"] == far["round_trip_ns"]
    # One state throughout: nothing changed, no worst state to judge separately.
    same = core_states([[r, 220.0] for r in range(0, n + 1, 10)],
                       {"candidate": cand, "fp32": fp32}, "fp32", rel_ci=0.03)
    assert not same["changed"] and same["worst"] is None and len(same["states"]) == 1


def test_like_with_like_compares_only_matching_states():
    def st(ns, speedup, fp32_ms=1.30):
        return {"round_trip_ns": ns, "speedup": {"fp32": {"median": speedup}},
                "p50_ms": {"fp32": fp32_ms}}
    a = {"states": [st(225, 2.30), st(510, 1.95)]}
    b = {"states": [st(240, 2.28)]}
    rows = like_with_like(a, b)
    assert len(rows) == 1 and rows[0]["speedup_vs_fp32"] == [2.30, 2.28]
    assert rows[0]["same_machine_speed"]
    assert like_with_like({"states": [st(510, 1.95)]}, b) == []
    # Same placement, but the baseline itself ran 6 % slower: a busier host, not like with like.
    busy = like_with_like({"states": [st(222, 2.20, fp32_ms=1.39)]}, b)
    assert len(busy) == 1 and not busy[0]["same_machine_speed"]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_probe_measures_a_round_trip_and_restores_affinity():
    before = os.sched_getaffinity(0)
    with corestate.Probe(before) as p:
        values = [p.measure(trips=100, chunks=2) for _ in range(3)]
        gave_up = p._proc is None
    assert os.sched_getaffinity(0) == before  # whatever the probe read, affinity is restored
    # On a machine whose other core is taken by other work, the helper may not answer within
    # GIVE_UP_S: the probe then turns itself off (None from then on) instead of hanging.
    measured = [v for v in values if v is not None]
    # A trip the other core answered: more than a few ns, and less than the give-up time (on a
    # loaded host a trip waits for the scheduler: milliseconds, not the idle ~300 ns).
    assert all(10 < v < corestate.GIVE_UP_S * 1e9 for v in measured)
    assert values == measured + [None] * (len(values) - len(measured))
    assert gave_up == (len(measured) < len(values))
    if not measured:
        pytest.skip("the other core was too busy for a single round trip within GIVE_UP_S")
    with corestate.Probe({min(before)}) as single:
        assert single.measure() is None


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_a_dead_helper_turns_the_probe_off_instead_of_hanging():
    import time

    with corestate.Probe(os.sched_getaffinity(0)) as p:
        p._proc.kill()
        p._proc.join()
        t0 = time.monotonic()
        assert p.measure() is None and p.measure() is None
        assert time.monotonic() - t0 < corestate.GIVE_UP_S + 2


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
@pytest.mark.slow  # seconds: out of make test-fast's edit loop
def test_a_stuck_helper_is_given_up_on_after_a_bound():
    import signal
    import time

    with corestate.Probe(os.sched_getaffinity(0)) as p:
        proc = p._proc
        os.kill(proc.pid, signal.SIGSTOP)  # alive, but never answers
        t0 = time.monotonic()
        assert p.measure() is None
        assert corestate.GIVE_UP_S <= time.monotonic() - t0 < corestate.GIVE_UP_S + 3
    proc.join(timeout=5)
    assert not proc.is_alive()
