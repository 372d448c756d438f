"""The clock timing and serving read: the real one moves with the machine, the virtual one only
when something sleeps on it, by exactly that much."""
from __future__ import annotations

from pipeline.measure.clock import REAL, Clock, VirtualClock


def test_virtual_time_moves_only_by_what_is_slept():
    clock = VirtualClock(start=5.0)
    assert clock.now() == clock.now() == 5.0
    clock.sleep(0.25)
    clock.sleep(0.0)
    clock.sleep(-1.0)  # a deadline already past: no sleep, time never goes back
    assert clock.now() == 5.25 and clock.slept == [0.25]


def test_the_real_clock_is_monotonic_and_sleeps():
    t0 = REAL.now()
    REAL.sleep(0.01)
    REAL.sleep(-1.0)
    assert REAL.now() - t0 >= 0.01


def test_both_meet_the_protocol():
    for clock in (REAL, VirtualClock()):
        assert isinstance(clock.now(), float) and callable(clock.sleep)
    assert {"now", "sleep"} <= set(dir(Clock))
