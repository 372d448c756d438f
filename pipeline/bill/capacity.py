"""The capacity plan: how many instances serve the peak at the p99 target, and what a request costs.

In: measured latency per batch size (p99 in ms and throughput in items/s, from the pipeline's
benchmark or the command line), an ``SloConfig`` (p99 target, peak QPS, daily volume, planned
utilization) and a price per instance-hour (optional). Out: one row per batch size (instances
needed, the p99 a request would see, whether it meets the target) and the cheapest row that
meets it, with cost per million requests. Plain arithmetic:

- an instance is planned at ``utilization`` of its measured throughput: a server kept 100 % busy
  queues without bound, so the measured p99 only holds with headroom;
- instances = ceil(peak QPS / (throughput x utilization));
- a request served in a batch of b waits for the other b - 1 to arrive: at the peak, each instance
  receives peak QPS / instances requests per second, so p99 ~ measured p99 + (b - 1) / that rate;
- cost per million requests = instances x 24 h x price / requests per day x 1e6 when the fleet is
  sized for the peak all day; the floor for perfect autoscaling sizes it for the daily average.

Deliberately not handled: queueing theory beyond the utilization factor, cold starts, multi-model
packing on one instance, and the latency of inputs larger than those measured (flagged instead).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from pipeline.core.json_record import omitted


@dataclass(frozen=True)
class SloTarget:
    """The service level the plan was made for (``slo.*``)."""
    p99_ms: float
    peak_qps: float
    requests_per_day: int
    utilization: float
    max_input: int | None


@dataclass(frozen=True)
class CapacityRow:
    """One batch size: what was measured, how many instances the peak needs, the p99 a request
    would see with the wait for its batch to fill, and whether that meets the target."""
    batch: int
    measured_p99_ms: float
    throughput: float              # items/s, measured
    planned_throughput: float      # items/s an instance is planned at (x utilization)
    instances: int
    batch_fill_ms: float
    p99_estimate_ms: float
    meets_p99: bool


@dataclass(frozen=True)
class CapacityPlan:
    """Every batch size's row, the cheapest that meets the target (None: none does), and the
    cost of serving with it where the hardware has a price."""
    slo: SloTarget
    options: tuple[CapacityRow, ...]
    choice: CapacityRow | None
    price_per_hour: float | None
    measured_max_input: int | None  # the widest input the latency was measured on
    verdict: str
    instances_for_average: int | None = omitted()  # the fleet for the daily average
    cost_per_day: float | None = omitted()
    cost_per_million: float | None = omitted()
    cost_per_million_autoscaled_floor: float | None = omitted()
    warning: str | None = omitted()


def plan(measured: dict[int, dict], slo, price_per_hour: float | None = None,
         measured_max_input: int | None = None) -> CapacityPlan:
    rows = []
    for batch, m in sorted(measured.items()):
        per_instance = m["throughput"] * slo.utilization
        instances = max(1, math.ceil(slo.peak_qps / per_instance - 1e-9))
        arrival = slo.peak_qps / instances
        wait_ms = 1e3 * (batch - 1) / arrival
        p99 = m["p99_ms"] + wait_ms
        rows.append(CapacityRow(int(batch), m["p99_ms"], m["throughput"], per_instance,
                                instances, wait_ms, p99, p99 <= slo.p99_ms))
    ok = [r for r in rows if r.meets_p99]
    best = min(ok, key=lambda r: (r.instances, r.p99_estimate_ms)) if ok else None
    target = SloTarget(slo.p99_ms, slo.peak_qps, slo.requests_per_day, slo.utilization,
                       slo.max_input)
    warning = (f"latency was measured on inputs up to {measured_max_input}; "
               f"slo.max_input={slo.max_input} is larger, so this plan is optimistic") \
        if measured_max_input is not None and measured_max_input < slo.max_input else None
    common = dict(slo=target, options=tuple(rows), choice=best, price_per_hour=price_per_hour,
                  measured_max_input=measured_max_input, warning=warning)
    if best is None:
        return CapacityPlan(**common, verdict=(
            f"no measured batch size meets p99 <= {slo.p99_ms:g} ms at {slo.peak_qps:g} QPS: "
            "faster hardware or a smaller model is needed"))
    verdict = (f"{best.instances} instance(s) at batch {best.batch}: p99 ~ "
               f"{best.p99_estimate_ms:.1f} ms <= {slo.p99_ms:g} ms at {slo.peak_qps:g} QPS")
    average = max(1, math.ceil(slo.requests_per_day / 86400 / best.planned_throughput - 1e-9))
    if price_per_hour is None:
        return CapacityPlan(**common, verdict=verdict, instances_for_average=average)
    per_day = best.instances * 24 * price_per_hour
    return CapacityPlan(**common, verdict=verdict, instances_for_average=average,
                        cost_per_day=per_day,
                        cost_per_million=per_day / slo.requests_per_day * 1e6,
                        cost_per_million_autoscaled_floor=(
                            average * 24 * price_per_hour / slo.requests_per_day * 1e6))
