"""A serving engine in miniature: open-loop Poisson arrivals through a dynamic batcher.

In: a function that runs one batch, a pool of single-request inputs, a ``stack`` function that
pads and joins requests into a batch, a target QPS, a duration and the batching policy (max batch
size, max queue wait). Out: per-request end-to-end latency (queueing included), achieved
throughput, the batch-size histogram, and the backlog left when the step ended.

Why open-loop: a closed loop (send the next request when the last one returns) slows its own
arrivals when the server slows, hiding queueing; real users do not wait. Arrivals are drawn up
front from an exponential distribution with a fixed seed; a request arrives at its due time,
whatever the server does, and its latency counts from then. Between batches the batcher sleeps
until the next due time (or its wait ends), so no thread of its own competes with the model for
the cores, and on a ``VirtualClock`` (``pipeline.measure.clock``) the whole simulation runs on
exact, simulated time. The batcher takes the oldest request, then waits for more until
the batch is full or the oldest has waited ``max_wait_ms``, as Triton's dynamic batcher does.
With ``key`` (a request's shape class, e.g. its width bucket), a batch only takes requests of
the oldest one's class, as engines bucket sequence lengths: padding a narrow text line to the
widest one in a batch costs more than batching saves (measured on the OCR model: 0.68 ms per line
in random-width batches of 8, 0.42 in same-width ones, 0.5-0.7 alone).
Deliberately not handled: several model instances, priorities, request cancellation.
"""
from __future__ import annotations

import os
from typing import Callable, Sequence

import numpy as np

from pipeline.measure.clock import REAL, Clock


def rss_mb() -> float:
    """Resident memory of this process, from /proc (Linux)."""
    with open(f"/proc/{os.getpid()}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def serve(run_batch: Callable, pool: Sequence, stack: Callable, qps: float, seconds: float,
          max_batch: int, max_wait_ms: float, seed: int = 0, drain_seconds: float | None = None,
          on_tick: Callable | None = None, key: Callable | None = None,
          clock: Clock = REAL) -> dict:
    # After the last arrival the queue drains for as long as the step lasted (1 to 5 s): a server
    # that needs more than twice the step to finish its requests served under half the offered
    # rate, saturated whatever a longer drain would show, so a longer one only burns time on
    # overloaded steps (a 0.5 s step offered 20k QPS drained for 5 s).
    if drain_seconds is None:
        drain_seconds = min(5.0, max(1.0, seconds))
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / qps, size=int(qps * seconds * 1.5) + 16)
    due = np.cumsum(gaps)
    due = due[due < seconds]
    picks = rng.integers(0, len(pool), size=due.size)
    t0 = clock.now()
    arrive = t0 + due    # when each request is sent, whatever the server is doing
    arrived = 0          # requests sent so far (they arrive in order)
    latencies, sizes, done = [], [], 0
    pending: list[tuple[float, int]] = []   # arrived, not yet batched; oldest first
    shapes = [key(x) for x in pool] if key else [None] * len(pool)
    stop_at = t0 + seconds + drain_seconds
    next_tick = t0 + 1.0

    def admit() -> None:
        """Everything sent by now joins the queue, stamped with the time it was sent."""
        nonlocal arrived
        now = clock.now()
        while arrived < arrive.size and arrive[arrived] <= now:
            pending.append((float(arrive[arrived]), int(picks[arrived])))
            arrived += 1

    def wait_for_arrival(until: float) -> bool:
        """Sleep until the next request arrives or until ``until``, whichever comes first;
        True when one came."""
        before = len(pending)
        wake = min(float(arrive[arrived]), until) if arrived < arrive.size else until
        clock.sleep(wake - clock.now())
        admit()
        return len(pending) > before

    while done < due.size and clock.now() < stop_at:
        # Everything that arrived while the model was busy joins the queue first (without this,
        # a non-empty queue would hide later arrivals and batches would stay small).
        admit()
        if not pending:
            wait_for_arrival(stop_at)
            continue
        # The oldest request, and queued ones of its shape class; the others keep their place.
        first = pending[0]
        deadline = first[0] + max_wait_ms / 1000.0
        shape = shapes[first[1]]
        while True:
            batch = [r for r in pending if shapes[r[1]] == shape][:max_batch]
            if len(batch) == max_batch or deadline - clock.now() <= 0:
                break
            if not wait_for_arrival(deadline):  # waited the whole delay: nobody came
                break
        taken = set(map(id, batch))
        pending[:] = [r for r in pending if id(r) not in taken]
        run_batch(stack([pool[k] for _, k in batch]))
        end = clock.now()
        latencies += [(end - sent) * 1000.0 for sent, _ in batch]
        sizes.append(len(batch))
        done += len(batch)
        if on_tick is not None and end >= next_tick:
            on_tick(end - t0, latencies)
            next_tick += 1.0
    elapsed = clock.now() - t0
    lat = np.asarray(latencies) if latencies else np.asarray([np.inf])
    hist = np.bincount(np.asarray(sizes, dtype=int), minlength=max_batch + 1)[1:] if sizes else []
    backlog = int(due.size - done)
    achieved = done / max(elapsed, seconds)
    # Saturated: requests were still queued at the end, or the server fell clearly behind the
    # offered rate (it only caught up while no new requests came).
    saturated = backlog > 0.01 * max(due.size, 1) or achieved < 0.9 * due.size / seconds
    return {"offered_qps": qps, "requests": int(due.size), "completed": done,
            "backlog": backlog, "saturated": bool(saturated), "achieved_qps": achieved,
            "p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99)),
            "p999_ms": float(np.percentile(lat, 99.9)), "mean_batch": float(np.mean(sizes)) if sizes else 0.0,
            "batch_histogram": {str(i + 1): int(c) for i, c in enumerate(hist) if c}}
