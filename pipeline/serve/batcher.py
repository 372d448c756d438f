"""The dynamic batcher: requests of one shape class grouped into a batch, run on threads of its
own.

In: prepared requests (feeds of a batch of one and their size class) and a function that runs a
list of them as one batch and returns one answer per request. Out: a future per request,
resolved with (answer, timings) or the exception the batch raised: an asyncio future of ``loop``
when the batcher is given one (the server: a batch's answers reach the event loop in one
hand-over, not one wake-up per request), else a ``concurrent.futures.Future``.

The policy is the load test's (``pipeline.measure.serving``), now on real threads: take the
oldest request, then wait for more of its shape class until the batch is full or the oldest has
waited ``max_wait_ms``; requests of other classes keep their place. A shape class is the size
axis rounded up to ``bucket`` (0: the exact size), so a batch pads little or nothing: padding a
narrow text line to the widest in a batch costs more than batching saves, and with exact classes
a line's outputs are the ones it would get alone. The model runs on ``consumers`` threads, each
taking the next batch when it is free (one, the default for an image model: its batches run one
after another with the runtime's intra-op threads under them; several for a text model, whose
requests then run side by side, each on a core of its own). The queue is bounded by the
caller's admission (``app``): past its limit a request is refused before it reaches here.
"""
from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class Job:
    feeds: dict
    size: int
    hold: bool = True  # False: run as soon as the thread is free, without waiting for company
    arrived: float = field(default_factory=time.perf_counter)
    future: Future | asyncio.Future = field(default_factory=Future)


def shape_class(size: int, bucket: int) -> int:
    return size if bucket <= 0 else -(-size // bucket) * bucket


class Batcher:
    def __init__(self, run_batch: Callable[[list[Job]], list], max_batch: int, max_wait_ms: float,
                 bucket: int = 0, on_batch: Callable[[int], None] | None = None,
                 loop: asyncio.AbstractEventLoop | None = None, consumers: int = 1):
        self.run_batch, self.max_batch, self.loop = run_batch, max_batch, loop
        self.max_wait, self.bucket, self.on_batch = max_wait_ms / 1000.0, bucket, on_batch
        self.pending: list[Job] = []
        self.cond = threading.Condition()
        self.stopping = False
        self.threads = [threading.Thread(target=self._loop, name=f"inference-{k}", daemon=True)
                        for k in range(max(1, consumers))]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def submit(self, feeds: dict, size: int, hold: bool = True) -> Future | asyncio.Future:
        """Queue one request (from the loop's own thread when the batcher has a loop).
        ``hold=False`` (the server's warm-up) is not held for company: a warm-up run that waited
        ``max_wait_ms`` for requests that cannot come yet would only delay readiness by that much
        per run."""
        job = Job(feeds, size, hold)
        if self.loop is not None:
            job.future = self.loop.create_future()
        with self.cond:
            if self.stopping:
                raise RuntimeError("the batcher has stopped")
            self.pending.append(job)
            self.cond.notify()
        return job.future

    def stop(self) -> None:
        """Answer everything queued, then end the threads."""
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        for thread in self.threads:
            thread.join()

    def _take(self) -> list[Job] | None:
        with self.cond:
            while True:
                while not self.pending:
                    if self.stopping:
                        return None
                    self.cond.wait()
                first = self.pending[0]
                cls = shape_class(first.size, self.bucket)
                deadline = first.arrived + (self.max_wait if first.hold else 0.0)
                while True:
                    batch = [j for j in self.pending
                             if shape_class(j.size, self.bucket) == cls][:self.max_batch]
                    left = deadline - time.perf_counter()
                    if len(batch) == self.max_batch or left <= 0 or self.stopping:
                        break
                    self.cond.wait(left)
                if batch:
                    taken = set(map(id, batch))
                    self.pending[:] = [j for j in self.pending if id(j) not in taken]
                    return batch
                # another consumer took this class while this one waited for company: start over

    def _loop(self) -> None:
        while True:
            batch = self._take()
            if batch is None:
                return
            if self.on_batch is not None:
                self.on_batch(len(batch))
            started = time.perf_counter()
            try:
                answers = self.run_batch(batch)
                outcomes = []
                for job, (answer, timings) in zip(batch, answers):
                    timings["queue"] = (started - job.arrived) * 1000.0
                    outcomes.append((job, (answer, timings), None))
            except BaseException as e:  # noqa: BLE001 - every waiting request gets the error
                outcomes = [(job, None, e) for job in batch]
            if self.loop is not None:
                self.loop.call_soon_threadsafe(_settle, outcomes)
            else:
                _settle(outcomes)


def _settle(outcomes: list) -> None:
    """Each job's future gets its answer or error; one given up on (cancelled) is left alone."""
    for job, result, error in outcomes:
        if job.future.done():
            continue
        if error is not None:
            job.future.set_exception(error)
        else:
            job.future.set_result(result)
