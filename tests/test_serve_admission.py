"""Admission by the wait a request would have (``pipeline.serve.admission``): the estimate from
injected stage timings, and the server's refusal order (the count, then the wait). The real
server refusing by the wait is in tests/test_serve.py's overload test."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from pipeline.core.errors import ConfigError
from pipeline.serve.admission import ALPHA, Backlog
from pipeline.serve.app import overloaded
from pipeline.serve.config import ServeConfig


def answered(prepare_ms: float, model_ms: float, batch: int) -> dict:
    """One request's timings as the server reports them: the model's are its batch's."""
    return {"decode": prepare_ms / 2, "preprocess": prepare_ms / 2, "queue": 50.0,
            "inference": model_ms * 0.75, "postprocess": model_ms * 0.25, "batch": batch}


def test_no_estimate_before_a_request_is_answered():
    assert Backlog.for_mode("pipeline", 1, 1, 2).wait_ms(100) is None


def test_the_wait_is_the_slowest_lane_per_request_times_the_requests_ahead():
    # the model: 8 ms a batch of 4, 2 ms a request, one consumer; preparing: 3 ms a request
    one = Backlog.for_mode("pipeline", workers=1, consumers=1, cores=2)
    one.observe(answered(3.0, 8.0, 4))
    assert one.wait_ms(10) == pytest.approx(30.0)  # the one worker is the slower lane
    two = Backlog.for_mode("pipeline", workers=2, consumers=1, cores=2)
    two.observe(answered(3.0, 8.0, 4))
    assert two.wait_ms(10) == pytest.approx(20.0)  # two workers: 1.5 ms, the model's 2 ms
    # inline: the whole request in a handler, as many at once as there are cores; the queue's
    # time is never a service time
    inline = Backlog.for_mode("inline", workers=0, consumers=0, cores=2)
    inline.observe(answered(3.0, 8.0, 1))
    assert inline.wait_ms(10) == pytest.approx(55.0)


def test_one_slow_request_moves_the_estimate_by_its_weight_only():
    b = Backlog.for_mode("pipeline", 1, 1, 2)
    for _ in range(200):
        b.observe(answered(1.0, 1.0, 1))
    b.observe(answered(1.0, 101.0, 1))
    assert b.wait_ms(1) == pytest.approx(1.0 + ALPHA * 100.0)


def server(admitted: int, per_request_ms: float | None) -> SimpleNamespace:
    backlog = Backlog.for_mode("pipeline", 1, 1, 2)
    if per_request_ms is not None:
        backlog.observe(answered(0.0, per_request_ms, 1))
    return SimpleNamespace(admitted=admitted, backlog=backlog)


def test_the_count_refuses_first_then_the_wait_and_zero_turns_the_wait_off():
    cfg = ServeConfig(queue_limit=8, max_queue_ms=100.0)
    assert "--queue-limit" in overloaded(server(8, 1.0), cfg)
    assert overloaded(server(7, 10.0), cfg) is None          # 70 ms ahead
    why = overloaded(server(7, 20.0), cfg)                  # 140 ms ahead
    assert "140 ms" in why and "--max-queue-ms" in why
    assert overloaded(server(7, None), cfg) is None          # nothing answered yet: no estimate
    assert overloaded(server(7, 20.0), ServeConfig(queue_limit=8, max_queue_ms=0.0)) is None


def test_the_longest_wait_is_the_artifacts_target_unless_given():
    assert ServeConfig().resolved(target_ms=250.0).max_queue_ms == 250.0
    assert ServeConfig().resolved().max_queue_ms == 0.0      # no target recorded: off
    assert ServeConfig(max_queue_ms=40.0).resolved(target_ms=250.0).max_queue_ms == 40.0
    assert ServeConfig(max_queue_ms=0.0).resolved(target_ms=250.0).max_queue_ms == 0.0
    with pytest.raises(ConfigError, match="--max-queue-ms"):
        ServeConfig(max_queue_ms=-1.0)
