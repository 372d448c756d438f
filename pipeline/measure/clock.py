"""The clock that timing and serving read: the real one, or a virtual one that only moves when
something sleeps on it.

In: nothing. Out: ``now()`` in seconds (monotonic, arbitrary origin) and ``sleep(seconds)``.
``REAL`` is what every run uses (``time.perf_counter`` and ``time.sleep``). ``VirtualClock``
makes a simulation exact and instant: a stand-in model that "takes" 5 ms calls ``sleep(0.005)``
and the clock moves by exactly that, so the batcher's and the timing loop's rules are checked
on known durations, however fast or busy the machine is.
"""
from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class RealClock:
    """The machine's monotonic high-resolution clock."""

    now = staticmethod(time.perf_counter)  # no wrapper: timing calls it around every run

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class VirtualClock:
    """Time that passes only through ``sleep`` (single-threaded use: what serving and timing
    do). ``slept`` records every sleep, in order."""

    def __init__(self, start: float = 0.0):
        self.t = start
        self.slept: list[float] = []

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self.t += seconds
            self.slept.append(seconds)


REAL: Clock = RealClock()
