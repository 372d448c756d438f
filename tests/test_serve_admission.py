"""Admission by the wait a request would have (``pipeline.serve.admission``): the estimate from
injected answer times, and the server's refusal order (the count, then the wait). The real
server refusing by the wait is in tests/test_serve.py's overload test."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from pipeline.core.errors import ConfigError
from pipeline.serve.admission import ALPHA, Backlog
from pipeline.serve.app import overloaded
from pipeline.serve.config import ServeConfig


def test_no_estimate_until_the_server_was_busy_from_one_answer_to_the_next():
    b = Backlog()
    assert b.wait_ms(100) is None
    b.answered(1.0, in_flight=0)   # idle after it: the gap to the next answer is not service
    b.answered(5.0, in_flight=0)
    assert b.wait_ms(100) is None
    b.answered(6.0, in_flight=3)
    assert b.wait_ms(100) is None   # busy from here on: the next answer gives the first gap
    b.answered(6.004, in_flight=2)
    assert b.wait_ms(10) == pytest.approx(40.0)


def test_a_batchs_answers_average_to_the_batchs_time_per_request():
    """A batcher answers 8 requests at once, then nothing for the next batch's 8 ms: the gaps
    average to 1 ms a request, what the server answers per second while it is saturated."""
    b = Backlog()
    now = 0.0
    b.answered(now, in_flight=50)
    for _ in range(400):
        now += 0.008
        for k in range(8):
            b.answered(now, in_flight=50)
    assert b.wait_ms(100) == pytest.approx(100.0, rel=0.15)


def test_one_slow_gap_moves_the_estimate_by_its_weight_only():
    b = Backlog()
    now = 0.0
    b.answered(now, in_flight=5)
    for _ in range(300):
        now += 0.001
        b.answered(now, in_flight=5)
    b.answered(now + 0.101, in_flight=5)
    assert b.wait_ms(1) == pytest.approx(1.0 + ALPHA * 100.0)


def server(admitted: int, per_request_ms: float | None) -> SimpleNamespace:
    backlog = Backlog()
    if per_request_ms is not None:
        backlog.answered(0.0, in_flight=1)
        backlog.answered(per_request_ms / 1000.0, in_flight=1)
    return SimpleNamespace(admitted=admitted, backlog=backlog)


def test_the_count_refuses_first_then_the_wait_and_zero_turns_the_wait_off():
    cfg = ServeConfig(queue_limit=8, max_queue_ms=100.0)
    assert "--queue-limit" in overloaded(server(8, 1.0), cfg)
    assert overloaded(server(7, 10.0), cfg) is None          # 70 ms ahead
    why = overloaded(server(7, 20.0), cfg)                  # 140 ms ahead
    assert "140 ms" in why and "--max-queue-ms" in why
    assert overloaded(server(7, None), cfg) is None          # no estimate yet
    assert overloaded(server(7, 20.0), ServeConfig(queue_limit=8, max_queue_ms=0.0)) is None


def test_the_longest_wait_is_the_target_the_gate_judged_unless_given():
    assert ServeConfig().resolved(target_ms=250.0).max_queue_ms == 250.0
    assert ServeConfig().resolved().max_queue_ms == 0.0      # no target judged: off
    assert ServeConfig(max_queue_ms=40.0).resolved(target_ms=250.0).max_queue_ms == 40.0
    assert ServeConfig(max_queue_ms=0.0).resolved(target_ms=250.0).max_queue_ms == 0.0
    with pytest.raises(ConfigError, match="--max-queue-ms"):
        ServeConfig(max_queue_ms=-1.0)


def test_a_swap_takes_the_new_versions_target_only_where_the_limit_was_a_target():
    """``Server.swap`` (a server following its alias): the longest wait the first version's p99
    target gave becomes the new version's; one given with --max-queue-ms stays."""
    from pipeline.serve.app import Server

    def swapped(cfg: ServeConfig, target_ms):
        here = SimpleNamespace(cfg=cfg, current=None, metrics=SimpleNamespace(serving=lambda served: None))
        Server.swap(here, SimpleNamespace(target_ms=target_ms), model=None)
        return here.cfg.max_queue_ms

    derived = ServeConfig().resolved(target_ms=250.0)
    assert swapped(derived, 80.0) == 80.0
    assert swapped(derived, None) == 0.0                    # judged none: no such limit
    assert swapped(ServeConfig().resolved(), 80.0) == 80.0  # none at first, one now
    assert swapped(ServeConfig(max_queue_ms=40.0).resolved(target_ms=250.0), 80.0) == 40.0
    assert swapped(ServeConfig(max_queue_ms=0.0).resolved(target_ms=250.0), 80.0) == 0.0


def test_an_artifact_gives_its_server_the_target_its_gate_judged_and_no_other(tmp_path):
    from pipeline.models import task
    from pipeline.serve.artifact import _served

    def served(gate: dict):
        config = {"model": {"source": "ocr", "name": "ocr"}, "slo": {"p99_ms": 150.0},
                  "gate": gate}
        return _served("run", tmp_path / "model.onnx", config,
                       task("ocr").serving_spec().to_dict(), None, None, {}, None)

    assert served({"check_slo_p99": True}).target_ms == 150.0
    assert served({"check_slo_p99": False}).target_ms is None
