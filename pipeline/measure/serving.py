"""A serving engine in miniature: open-loop Poisson arrivals through a dynamic batcher.

In: a function that runs one batch, a pool of single-request inputs, a ``stack`` function that
pads and joins requests into a batch, a target QPS, a duration and the batching policy (max batch
size, max queue wait). Out: per-request end-to-end latency (queueing included), achieved
throughput, the batch-size histogram, and the backlog left when the step ended.

Why open-loop: a closed loop (send the next request when the last one returns) slows its own
arrivals when the server slows, hiding queueing; real users do not wait. Arrivals are drawn up
front from an exponential distribution with a fixed seed and released by a thread at their due
times, whatever the server does. The batcher takes the oldest request, then waits for more until
the batch is full or the oldest has waited ``max_wait_ms``, as Triton's dynamic batcher does.
With ``key`` (a request's shape class, e.g. its width bucket), a batch only takes requests of
the oldest one's class, as engines bucket sequence lengths: padding a narrow text line to the
widest one in a batch costs more than batching saves (measured on the OCR model: 0.68 ms per line
in random-width batches of 8, 0.42 in same-width ones, 0.5-0.7 alone).
Deliberately not handled: several model instances, priorities, request cancellation.
"""
from __future__ import annotations

import os
import queue
import threading
import time
from typing import Callable, Sequence

import numpy as np


def rss_mb() -> float:
    """Resident memory of this process, from /proc (Linux)."""
    with open(f"/proc/{os.getpid()}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def serve(run_batch: Callable, pool: Sequence, stack: Callable, qps: float, seconds: float,
          max_batch: int, max_wait_ms: float, seed: int = 0, drain_seconds: float | None = None,
          on_tick: Callable | None = None, key: Callable | None = None) -> dict:
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
    inbox: queue.Queue = queue.Queue()
    t0 = time.perf_counter()

    def release():
        for when, k in zip(due, picks):
            delay = t0 + when - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            inbox.put((time.perf_counter(), int(k)))

    producer = threading.Thread(target=release, daemon=True)
    producer.start()
    latencies, sizes, done = [], [], 0
    pending: list[tuple[float, int]] = []   # arrived, not yet batched; oldest first
    shapes = [key(x) for x in pool] if key else [None] * len(pool)
    stop_at = t0 + seconds + drain_seconds
    next_tick = t0 + 1.0

    def collect(timeout: float) -> None:
        try:
            pending.append(inbox.get(timeout=timeout) if timeout > 0 else inbox.get_nowait())
            while True:
                pending.append(inbox.get_nowait())
        except queue.Empty:
            pass

    while done < due.size and time.perf_counter() < stop_at:
        # Everything that arrived while the model was busy joins the queue first (without this,
        # a non-empty queue would hide later arrivals and batches would stay small).
        collect(0.05 if not pending else 0.0)
        if not pending:
            continue
        # The oldest request, and queued ones of its shape class; the others keep their place.
        first = pending[0]
        deadline = first[0] + max_wait_ms / 1000.0
        shape = shapes[first[1]]
        while True:
            batch = [r for r in pending if shapes[r[1]] == shape][:max_batch]
            left = deadline - time.perf_counter()
            if len(batch) == max_batch or left <= 0:
                break
            before = len(pending)
            collect(left)
            if len(pending) == before:  # waited the whole delay: nobody came
                break
        taken = set(map(id, batch))
        pending[:] = [r for r in pending if id(r) not in taken]
        run_batch(stack([pool[k] for _, k in batch]))
        end = time.perf_counter()
        latencies += [(end - arrived) * 1000.0 for arrived, _ in batch]
        sizes.append(len(batch))
        done += len(batch)
        if on_tick is not None and end >= next_tick:
            on_tick(end - t0, latencies)
            next_tick += 1.0
    elapsed = time.perf_counter() - t0
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
