"""How far apart the two CPUs we time on are right now: a core-to-core round trip, in ns.

Why this exists (measured on these 2-vCPU KVM guests, 2026-11-30): the host moves our two vCPUs
between cores that share a cache (a round trip of about 220-250 ns through the probe below) and
cores that do not (about 500-540 ns; once also about 400 ns), and a state lasts from seconds to
minutes. Single-thread speed barely moves with it (a fixed loop: 1.12 ms near, 1.28 ms far). A
2-thread inference at batch 1 moves a lot: the INT8 OCR model
reads 0.50 ms in the near state and 0.74 ms in the far one, barely faster than one thread
(0.77 ms), because every parallel section waits for the other vCPU. Its speedup over FP32 moves
from 2.5x to 2.2x with nothing changed on our side, so a benchmark that does not know the state
reports whichever state it landed in, and two runs disagree by 16 %.

So the benchmark probes the state while it times (``Probe``), splits its rounds by state
(``states``), and reports the speedup per state; results are compared like with like, state by
state. The probe is two processes pinned to two CPUs passing a counter through shared memory:
a plain Python spin loop, whose own overhead is the same in both states, so the difference is the
cache line's trip between the cores.
"""
from __future__ import annotations

import os
import time

import numpy as np

SPLIT_RATIO = 1.25  # neighbouring readings this far apart (ratio) are different states
TRIPS = 400         # round trips per chunk: ~0.15-0.3 ms
CHUNKS = 3          # the fastest chunk is kept: an interrupt inflates one chunk, not the state
GIVE_UP_S = 2.0     # a trip this slow means the helper is gone: the probe turns itself off


def _pong(counter, cpu: int, conn) -> None:
    """Helper process: on each request for n trips, answer every odd value with the next even one."""
    os.sched_setaffinity(0, {cpu})
    while True:
        job = conn.recv()    # blocks, so the helper costs nothing between probes
        if job is None:
            return
        base, n = job
        for i in range(n):
            want = base + 2 * i + 1
            while counter[0] != want:
                pass
            counter[0] = want + 1


class Probe:
    """``with Probe(cpus) as p: p.measure()`` -> ns per round trip between the first two CPUs.

    Unavailable (``measure`` returns None) with fewer than two CPUs. The calling thread is pinned
    to the first CPU during a measurement and its affinity restored after, so threads of a
    runtime in the same process keep their placement."""

    def __init__(self, cpus):
        cpus = sorted(cpus)
        self.cpus = cpus[:2] if len(cpus) >= 2 else None
        self._proc = None

    def __enter__(self):
        if self.cpus is None:
            return self
        from pipeline.core import isolate

        ctx = isolate.context()
        self._counter = ctx.RawArray("q", 8)  # one cache line, shared with the helper
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_pong, args=(self._counter, self.cpus[1], child),
                                 daemon=True)
        self._proc.start()
        child.close()
        return self

    def __exit__(self, *exc):
        if self._proc is not None:
            try:
                self._conn.send(None)
            except OSError:
                pass
            self._proc.join(timeout=0.5)  # a helper stuck in its spin loop never reads the None
            if self._proc.is_alive():
                self._proc.kill()
            self._proc = None
        return False

    def measure(self, trips: int = TRIPS, chunks: int = CHUNKS) -> float | None:
        """ns per round trip; None when unavailable, or when the helper stopped answering (it is
        then killed, and the benchmark goes on without core states rather than hanging)."""
        if self._proc is None:
            return None
        saved = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {self.cpus[0]})
        try:
            best = float("inf")
            c = self._counter
            for _ in range(chunks):
                base = c[0]
                self._conn.send((base, trips))
                t0 = time.perf_counter_ns()
                for i in range(trips):
                    c[0] = base + 2 * i + 1
                    spins = 0
                    while c[0] != base + 2 * i + 2:
                        spins += 1  # the same cost in every state; the clock only now and then
                        if spins % 1_000_000 == 0 and time.perf_counter_ns() - t0 > GIVE_UP_S * 1e9:
                            self.__exit__()
                            return None
                best = min(best, (time.perf_counter_ns() - t0) / trips)
            return best
        except OSError:  # the pipe to a dead helper
            self.__exit__()
            return None
        finally:
            os.sched_setaffinity(0, saved)


def states(values) -> np.ndarray:
    """Label each probe with its state: 0 for the nearest, 1 for the next, and so on.

    Sorted readings are cut wherever two neighbours differ by more than ``SPLIT_RATIO``; one
    state's probes vary by 10-20 %, while the placements seen here read about 225, 400 and
    520 ns."""
    v = np.asarray(list(values), dtype=float)
    if v.size < 2:
        return np.zeros(v.size, dtype=int)
    order = np.argsort(v)
    cuts = np.concatenate([[0], np.cumsum(np.diff(np.log(v[order])) > np.log(SPLIT_RATIO))])
    labels = np.empty(v.size, dtype=int)
    labels[order] = cuts
    return labels


def split(probes: list, rounds: int) -> list[dict]:
    """The timed rounds grouped by core state, from the probes ``timing.interleaved`` took.

    A round belongs to a state when the probes before and after it agree; rounds where the state
    changed in between are left out. One odd probe between two that agree is taken as a blip.
    Returns, nearest state first: {"round_trip_ns": median of its probes, "mask": bool per
    round}; [] when the probe was unavailable."""
    readings = [(int(r), float(v)) for r, v in probes if v is not None]
    if len(readings) < 2:
        return []
    at = [r for r, _ in readings]
    ns = np.array([v for _, v in readings])
    labels = states(ns)
    for k in range(1, len(labels) - 1):
        if labels[k - 1] == labels[k + 1] != labels[k]:
            labels[k] = labels[k - 1]
    per_round = np.full(rounds, -1, dtype=int)
    for k in range(len(at) - 1):
        if labels[k] == labels[k + 1]:
            per_round[at[k]:at[k + 1]] = labels[k]
    return [{"round_trip_ns": float(np.median(ns[labels == lab])), "mask": per_round == lab}
            for lab in sorted(set(labels.tolist())) if np.any(per_round == lab)]


def same_state(a_ns: float, b_ns: float) -> bool:
    """Two states from different runs are the same when their round trips read alike."""
    return max(a_ns, b_ns) / min(a_ns, b_ns) < SPLIT_RATIO
