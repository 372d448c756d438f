"""The interleaved timing loop's stopping rules and probe cadence, on a virtual clock: the models
"take" known milliseconds by sleeping on it, so the rules are checked on exact times, instantly."""
from __future__ import annotations

import numpy as np
import pytest

from pipeline.measure import timing
from pipeline.measure.clock import REAL, VirtualClock


def _fns(clock):
    # b takes twice as long as a: 1 ms and 2 ms a run
    return {"a": lambda x: clock.sleep(0.001), "b": lambda x: clock.sleep(0.002)}


def test_the_models_are_timed_on_the_clock_given():
    clock = VirtualClock()
    times, info = timing.interleaved(_fns(clock), [0], [("b", "a")], min_rounds=10,
                                     max_seconds=5, rel_ci=10.0, check_every=10, clock=clock)
    assert times["a"] == pytest.approx([1.0] * 10) and times["b"] == pytest.approx([2.0] * 10)
    assert info["rounds"] == 10 and info["seconds"] == pytest.approx(0.03)
    assert timing.ratio_ci(times["b"], times["a"])["median"] == pytest.approx(2.0)


def test_the_first_check_is_at_min_rounds_not_at_a_multiple_of_check_every():
    clock = VirtualClock()
    _, info = timing.interleaved(_fns(clock), [0], [("b", "a")], min_rounds=20, max_seconds=0.01,
                                 rel_ci=10.0, check_every=50, clock=clock)
    assert info["rounds"] == 20  # not 50: past max_seconds, with a wide-enough interval
    _, info = timing.interleaved(_fns(clock), [0], [("b", "a")], min_rounds=20, max_seconds=0.1,
                                 rel_ci=10.0, check_every=50, min_seconds=0.1, clock=clock)
    assert info["rounds"] == 70  # 20 rounds (60 ms) too short; the next check 50 rounds on


def test_min_seconds_spreads_the_rounds_over_time():
    clock = VirtualClock()
    _, info = timing.interleaved(_fns(clock), [0], [("b", "a")], min_rounds=10, max_seconds=5,
                                 rel_ci=10.0, check_every=10, min_seconds=0.3, clock=clock)
    # rounds of 3 ms, checked every 10 rounds (30 ms): the first check past 0.3 s
    assert info["seconds"] >= 0.3 and info["rounds"] == 100 and clock.now() == pytest.approx(0.3)
    # Without it the same wide-open CI bound stops at the first check.
    _, quick = timing.interleaved(_fns(clock), [0], [("b", "a")], min_rounds=10, max_seconds=5,
                                  rel_ci=10.0, check_every=10, clock=clock)
    assert quick["rounds"] == 10


def test_max_seconds_caps_min_seconds():
    clock = VirtualClock()
    _, info = timing.interleaved(_fns(clock), [0], [("b", "a")], min_rounds=10, max_seconds=0.2,
                                 rel_ci=10.0, check_every=10, min_seconds=30, clock=clock)
    assert 0.2 <= clock.now() <= 0.2 + 0.03 and info["rounds"] == 70


def test_an_interval_never_narrow_enough_stops_at_max_seconds_and_says_noisy():
    clock = VirtualClock()
    rng = np.random.default_rng(0)
    fns = {"a": lambda x: clock.sleep(0.001 * rng.uniform(1, 3)), "b": lambda x: clock.sleep(0.002)}
    _, info = timing.interleaved(fns, [0], [("b", "a")], min_rounds=10, max_seconds=0.5,
                                 rel_ci=1e-6, check_every=10, clock=clock)
    assert info["noisy"] and 0.5 < info["seconds"] <= 0.5 + 0.05


def test_probe_runs_at_start_on_its_cadence_and_at_the_end():
    clock = VirtualClock()
    calls = []

    def probe():
        calls.append(clock.now())
        return 300.0

    _, info = timing.interleaved(_fns(clock), [0], [("b", "a")], min_rounds=10, max_seconds=5,
                                 rel_ci=10.0, check_every=10, probe=probe, probe_every_s=0.1,
                                 min_seconds=0.45, clock=clock)
    rounds = [r for r, _ in info["probes"]]
    assert rounds[0] == 0 and rounds[-1] == info["rounds"] and rounds == sorted(rounds)
    # Never sooner than every 0.1 s (the closing reading excepted): at 3 ms a round, a probe
    # every 34 rounds, at 0, 0.102, 0.204, 0.306, 0.408 s, then the closing one.
    gaps = [b - a for a, b in zip(calls, calls[1:-1])]
    assert min(gaps) >= 0.1 and len(calls) == 6, calls
    assert rounds[:-1] == [0, 34, 68, 102, 136]


def test_warm_up_ends_when_two_windows_agree():
    clock = VirtualClock()
    slow_start = iter([0.010] * 10 + [0.002] * 1000)
    runs = timing.warm_up(lambda x: clock.sleep(next(slow_start)), [0], window=10, clock=clock)
    assert runs == 30  # 10 slow, then two windows of 2 ms that agree


def test_the_real_clock_times_real_work():
    ms = timing.clock_ms(lambda x: REAL.sleep(0.002), None)
    assert ms >= 2.0


def test_every_input_is_timed_in_every_order():
    # 4 models and 8 inputs: turning the order every round put each input behind the same
    # model every time, so a position effect (a cold cache after a big model) biased the ratios
    clock = VirtualClock()
    calls = []
    fns = {r: (lambda r: lambda x: (calls.append((x, r)), clock.sleep(0.001)))(r) for r in "abcd"}
    _, info = timing.interleaved(fns, list(range(8)), [("b", "a")], min_rounds=64, max_seconds=5,
                                 rel_ci=10.0, check_every=64, clock=clock)
    assert info["rounds"] == 64
    firsts = {}
    for k in range(0, len(calls), 4):  # one round: four calls on one input
        (x, first), *rest = calls[k:k + 4]
        assert {y for y, _ in rest} == {x}
        firsts.setdefault(x, set()).add(first)
    assert all(f == set("abcd") for f in firsts.values()), firsts


def test_runtimes_mixed_alternate_in_blocks_of_20_unless_bench_block_says_how_many():
    """One engine's spinning threads slow the next one's first runs: across runtimes each model
    runs in blocks (20 at ``bench.block=1``), and the rounds are counted so that each model
    still gets about ``min_rounds`` runs, never fewer than 10 rounds of blocks."""
    from pipeline.config.bench import TimingConfig
    from pipeline.measure.latency import blocking

    one, two = {"onnxruntime"}, {"onnxruntime", "openvino"}
    assert blocking(TimingConfig(min_rounds=200), one) == (1, 200, 50)
    assert blocking(TimingConfig(min_rounds=200, block=3), one) == (3, 67, 10)
    assert blocking(TimingConfig(min_rounds=200), two) == (20, 10, 10)
    assert blocking(TimingConfig(min_rounds=400), two) == (20, 20, 10)
    assert blocking(TimingConfig(min_rounds=200, block=4), two) == (4, 50, 10)
    assert blocking(TimingConfig(min_rounds=20, block=4), two) == (4, 10, 10)
