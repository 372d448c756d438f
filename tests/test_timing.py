"""The interleaved timing loop's stopping rules and probe cadence, on cheap callables."""
from __future__ import annotations

import time

from pipeline.measure import timing


def _fns():
    return {"a": lambda x: sum(range(200)), "b": lambda x: sum(range(400))}


def test_min_seconds_spreads_the_rounds_over_time():
    t0 = time.monotonic()
    _, info = timing.interleaved(_fns(), [0], [("b", "a")], min_rounds=10, max_seconds=5,
                                 rel_ci=10.0, check_every=10, min_seconds=0.3)
    assert time.monotonic() - t0 >= 0.3 and info["seconds"] >= 0.3
    # Without it the same wide-open CI bound stops at the first check.
    _, quick = timing.interleaved(_fns(), [0], [("b", "a")], min_rounds=10, max_seconds=5,
                                  rel_ci=10.0, check_every=10)
    assert quick["rounds"] == 10


def test_max_seconds_caps_min_seconds():
    t0 = time.monotonic()
    timing.interleaved(_fns(), [0], [("b", "a")], min_rounds=10, max_seconds=0.2, rel_ci=10.0,
                       check_every=10, min_seconds=30)
    assert time.monotonic() - t0 < 5


def test_probe_runs_at_start_on_its_cadence_and_at_the_end():
    calls = []

    def probe():
        calls.append(time.monotonic())
        return 300.0

    _, info = timing.interleaved(_fns(), [0], [("b", "a")], min_rounds=10, max_seconds=5,
                                 rel_ci=10.0, check_every=10, probe=probe, probe_every_s=0.1,
                                 min_seconds=0.45)
    rounds = [r for r, _ in info["probes"]]
    assert rounds[0] == 0 and rounds[-1] == info["rounds"] and rounds == sorted(rounds)
    # Never sooner than every 0.1 s (the closing reading excepted), at least once between the
    # first and the last over >= 0.45 s. How many fit depends on how fast the machine is today.
    gaps = [b - a for a, b in zip(calls, calls[1:-1])]
    assert len(calls) >= 3 and gaps and min(gaps) >= 0.1, calls
