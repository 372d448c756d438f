"""The capacity plan: instances for the peak at the p99 target, and cost per million requests."""
from __future__ import annotations

import math

import pytest

from pipeline.bill.capacity import plan
from pipeline.config import SloConfig
from pipeline.core.errors import ConfigError

MEASURED = {1: {"p99_ms": 10.0, "throughput": 100.0}, 8: {"p99_ms": 40.0, "throughput": 400.0}}


def test_low_peak_is_served_by_one_instance_without_batching_delay():
    slo = SloConfig(p99_ms=200, peak_qps=50, requests_per_day=1_000_000, utilization=0.7)
    cap = plan(MEASURED, slo, price_per_hour=2.0)
    b1, b8 = cap.options
    assert b1.instances == math.ceil(50 / (100 * 0.7)) == 1 and b1.batch_fill_ms == 0
    # At batch 8 a request waits for 7 more arrivals at 50/s before the batch runs.
    assert b8.p99_estimate_ms == pytest.approx(40 + 1e3 * 7 / 50)
    assert cap.choice.batch == 1  # same instance count, lower latency
    assert cap.cost_per_day == pytest.approx(1 * 24 * 2.0)
    assert cap.cost_per_million == pytest.approx(24 * 2.0 / 1_000_000 * 1e6)


def test_high_peak_prefers_batching_and_costs_scale_with_instances():
    slo = SloConfig(p99_ms=200, peak_qps=500, requests_per_day=20_000_000, utilization=0.7)
    cap = plan(MEASURED, slo, price_per_hour=1.5)
    b1, b8 = cap.options
    assert b1.instances == math.ceil(500 / 70) == 8
    assert b8.instances == math.ceil(500 / 280) == 2
    assert b8.p99_estimate_ms == pytest.approx(40 + 1e3 * 7 / (500 / 2))
    assert cap.choice.batch == 8 and cap.choice.instances == 2
    assert cap.cost_per_million == pytest.approx(2 * 24 * 1.5 / 20_000_000 * 1e6)
    average = 20_000_000 / 86400
    assert cap.instances_for_average == math.ceil(average / 280)
    assert cap.cost_per_million_autoscaled_floor <= cap.cost_per_million


def test_unreachable_target_says_so_and_has_no_cost():
    slo = SloConfig(p99_ms=5, peak_qps=50)
    cap = plan(MEASURED, slo, price_per_hour=1.0)
    assert cap.choice is None and "no measured batch size meets" in cap.verdict
    assert cap.cost_per_million is None
    # and its JSON, as the report and `pipeline.bill capacity --json` write it, has no cost keys
    from pipeline.core.json_record import to_json

    data = to_json(cap)
    assert data["choice"] is None and not {k for k in data if k.startswith("cost")}


def test_inputs_larger_than_measured_are_flagged():
    slo = SloConfig(max_input=512)
    assert "optimistic" in plan(MEASURED, slo, measured_max_input=340).warning
    assert plan(MEASURED, slo, measured_max_input=512).warning is None


@pytest.mark.parametrize("kwargs, message", [
    ({"peak_qps": 0}, "slo.peak_qps=0"),
    ({"utilization": 1.5}, "slo.utilization=1.5"),
    ({"peak_qps": 10, "requests_per_day": 10_000_000}, "above slo.peak_qps=10"),
])
def test_bad_slo_values(kwargs, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        SloConfig(**kwargs)
