"""The server's dynamic batcher (``pipeline.serve.batcher``) on real threads: batches never mix
shape classes nor exceed their size, every request gets its own answer, a failing batch fails
only its own requests, and stopping answers what is queued. Nothing here depends on how fast
anything runs: only on which requests ended up together."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from pipeline.serve.batcher import Batcher, shape_class


def _echo(seen: list):
    def run(jobs):
        seen.append([j.size for j in jobs])
        return [(float(j.feeds["x"][0]), {}) for j in jobs]
    return run


def test_batches_hold_one_shape_class_and_answers_go_to_their_request():
    seen: list = []
    b = Batcher(_echo(seen), max_batch=4, max_wait_ms=30, bucket=0)
    b.start()
    sizes = [64, 68, 64, 72, 64, 68, 64, 64, 72, 68] * 3
    futures = [b.submit({"x": np.array([k])}, s) for k, s in enumerate(sizes)]
    answers = [f.result(timeout=60)[0] for f in futures]
    b.stop()
    assert answers == [float(k) for k in range(len(sizes))]
    assert all(len(set(batch)) == 1 and len(batch) <= 4 for batch in seen), seen
    assert sum(len(batch) for batch in seen) == len(sizes)
    assert all("queue" in f.result()[1] for f in futures)


def test_buckets_round_sizes_up():
    assert [shape_class(s, 32) for s in (1, 32, 33, 64)] == [32, 32, 64, 64]
    assert shape_class(37, 0) == 37


def test_a_failing_batch_fails_its_requests_and_the_batcher_goes_on():
    def run(jobs):
        if any(j.size == 13 for j in jobs):
            raise RuntimeError("boom")
        return [("ok", {}) for _ in jobs]

    b = Batcher(run, max_batch=2, max_wait_ms=0, bucket=0)
    b.start()
    bad = b.submit({}, 13)
    with pytest.raises(RuntimeError, match="boom"):
        bad.result(timeout=60)
    assert b.submit({}, 8).result(timeout=60)[0] == "ok"
    b.stop()


def test_stop_answers_what_is_queued():
    release = threading.Event()
    seen: list = []

    def run(jobs):
        release.wait(60)  # the first batch holds the thread while more are queued
        return _echo(seen)(jobs)

    b = Batcher(run, max_batch=1, max_wait_ms=0, bucket=0)
    b.start()
    futures = [b.submit({"x": np.array([k])}, 8) for k in range(5)]
    stopper = threading.Thread(target=b.stop)
    stopper.start()
    release.set()
    stopper.join(60)
    assert [f.result(timeout=0)[0] for f in futures] == [0.0, 1.0, 2.0, 3.0, 4.0]
    with pytest.raises(RuntimeError):
        b.submit({}, 8)


def test_a_request_not_held_runs_without_waiting_for_company():
    """The server's warm-up (``hold=False``): with a wait of ten minutes for company, a held lone
    request would still be queued when the test gives up; the one not held is answered at once,
    and a held one behind it still waits for its batch."""
    seen: list = []
    b = Batcher(_echo(seen), max_batch=4, max_wait_ms=600_000, bucket=0)
    b.start()
    assert b.submit({"x": np.array([1])}, 8, hold=False).result(timeout=60)[0] == 1.0
    held = b.submit({"x": np.array([2])}, 8)
    assert not held.done()
    b.stop()  # stopping answers what is queued
    assert held.result(timeout=60)[0] == 2.0 and seen == [[8], [8]]


def test_a_request_given_up_on_is_skipped_and_the_batcher_goes_on():
    """A request whose waiter gave up (its future cancelled while queued) is skipped when its
    batch is answered; the thread goes on answering the others (it used to die on setting a
    cancelled future's result, and every later request waited forever)."""
    release = threading.Event()

    def run(jobs):
        release.wait(60)
        return [(float(j.feeds["x"][0]), {}) for j in jobs]

    b = Batcher(run, max_batch=2, max_wait_ms=0, bucket=0)
    b.start()
    first = b.submit({"x": np.array([1])}, 8)
    gone = b.submit({"x": np.array([2])}, 8)
    assert gone.cancel()
    release.set()
    assert first.result(timeout=60)[0] == 1.0
    assert b.submit({"x": np.array([3])}, 8).result(timeout=60)[0] == 3.0
    b.stop()


def test_with_a_loop_a_batch_is_answered_on_the_loop():
    """The server's way: futures of its event loop, resolved on the loop's own thread."""
    import asyncio

    async def main():
        b = Batcher(_echo([]), max_batch=4, max_wait_ms=50, bucket=0,
                    loop=asyncio.get_running_loop())
        b.start()
        futures = [b.submit({"x": np.array([k])}, 8) for k in range(4)]
        assert all(isinstance(f, asyncio.Future) for f in futures)
        answers = await asyncio.wait_for(asyncio.gather(*futures), 60)
        await asyncio.to_thread(b.stop)
        return [a for a, _ in answers]

    assert asyncio.run(main()) == [0.0, 1.0, 2.0, 3.0]


def test_consumers_run_batches_side_by_side():
    """Two consumers: two batches (two shape classes) are in the model at once. Each run waits
    for the other at a barrier; one consumer would leave the first waiting alone until it broke."""
    meet = threading.Barrier(2, timeout=60)

    def run(jobs):
        meet.wait()
        return [(j.size, {}) for j in jobs]

    b = Batcher(run, max_batch=4, max_wait_ms=0, bucket=0, consumers=2)
    b.start()
    first, second = b.submit({}, 8), b.submit({}, 16)
    assert (first.result(timeout=60)[0], second.result(timeout=60)[0]) == (8, 16)
    b.stop()
    assert not any(t.is_alive() for t in b.threads)


def test_a_text_model_runs_on_every_core_and_an_image_model_keeps_the_split(monkeypatch):
    from pipeline.serve import config
    from pipeline.serve.config import ServeConfig

    monkeypatch.setattr(config, "usable_cores", lambda: 6)
    text = ServeConfig().resolved(text=True)
    assert (text.workers, text.consumers, text.intra_op_threads) == (1, 6, 1)
    image = ServeConfig().resolved()
    assert (image.workers, image.consumers, image.intra_op_threads) == (2, 1, 4)
    mine = ServeConfig(workers=2, consumers=3, intra_op_threads=2).resolved(text=True)
    assert (mine.workers, mine.consumers, mine.intra_op_threads) == (2, 3, 2)
    inline = ServeConfig(mode="inline").resolved(text=True)
    assert (inline.workers, inline.intra_op_threads) == (0, 6)


def test_an_image_models_cores_are_shared_as_a_requests_cpu_time(monkeypatch):
    """Given the costs (preprocessing ms, the model's CPU-ms per request), the workers get the
    preprocessing's share of the cores; under half a core, for a model slower than 10 ms, one
    worker beside the model's threads on every core. Counts the user gives are kept; a graph of batch 1 caps the batcher."""
    from pipeline.serve import config
    from pipeline.serve.config import ServeConfig, cost_split

    assert cost_split(2, 38.0, 1708.0, 2) == (1, 2)   # a detector: 1.7 s a page on 2 threads
    assert cost_split(2, 0.14, 0.27, 2) == (1, 1)     # the OCR model: too fast to share a core
    assert cost_split(2, 0.4, 0.3) == (1, 1)          # both sides matter
    assert cost_split(16, 0.4, 0.04) == (15, 1)       # preprocessing is nearly all of it
    assert cost_split(16, 2.0, 20.0, 2) == (1, 15)    # 0.76 of a core: rounds to one worker
    assert cost_split(16, 10.0, 15.0, 2) == (4, 12)
    assert cost_split(1, 5.0, 5.0) == (1, 1)
    monkeypatch.setattr(config, "usable_cores", lambda: 2)
    heavy = ServeConfig().resolved(costs=(38.0, 1708.0, 2), max_batch=1)
    assert (heavy.workers, heavy.consumers, heavy.intra_op_threads, heavy.max_batch) == \
        (1, 1, 2, 1)
    mine = ServeConfig(intra_op_threads=1, max_batch=4).resolved(costs=(38.0, 1708.0, 2))
    assert (mine.workers, mine.intra_op_threads, mine.max_batch) == (1, 1, 4)
    text = ServeConfig().resolved(text=True, costs=(38.0, 1708.0, 2))  # text: its own rule
    assert (text.workers, text.consumers, text.intra_op_threads) == (1, 2, 1)


def test_the_models_time_per_request_is_read_from_its_record():
    from pipeline.serve.artifact import per_sample

    assert per_sample({"1": {"p50": 12.5}, "8": {"p50": 40.0}}) == 12.5
    assert per_sample({"8": {"p50": 40.0}, "4": {"p50": 24.0}}) == 6.0  # the smallest batch
    for nothing in (None, {}, {"1": {}}, {"1": {"p50": 0}}, {"x": {"p50": 1}}, []):
        assert per_sample(nothing) is None


def test_consumers_never_run_an_empty_batch():
    """Two consumers may wait for company for the same request; the one that finds it taken
    starts over rather than running nothing. Requests from four threads, two shape classes."""
    import random

    seen: list = []
    b = Batcher(_echo(seen), max_batch=4, max_wait_ms=3, bucket=0, consumers=2)
    b.start()

    def client(k: int) -> list:
        rng = random.Random(k)
        futures = []
        for n in range(50):
            futures.append(b.submit({"x": np.array([k * 100 + n])}, 8 if n % 3 else 16))
            time.sleep(rng.random() / 1000)
        return [f.result(timeout=60)[0] for f in futures]

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(client, range(4)))
    b.stop()
    assert answers == [[float(k * 100 + n) for n in range(50)] for k in range(4)]
    assert all(seen) and sum(map(len, seen)) == 200, [len(s) for s in seen if not s]
