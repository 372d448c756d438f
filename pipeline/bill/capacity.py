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


def plan(measured: dict[int, dict], slo, price_per_hour: float | None = None,
         measured_max_input: int | None = None) -> dict:
    rows = []
    for batch, m in sorted(measured.items()):
        per_instance = m["throughput"] * slo.utilization
        instances = max(1, math.ceil(slo.peak_qps / per_instance - 1e-9))
        arrival = slo.peak_qps / instances
        wait_ms = 1e3 * (batch - 1) / arrival
        p99 = m["p99_ms"] + wait_ms
        rows.append({"batch": int(batch), "measured_p99_ms": m["p99_ms"],
                     "throughput": m["throughput"], "planned_throughput": per_instance,
                     "instances": instances, "batch_fill_ms": wait_ms, "p99_estimate_ms": p99,
                     "meets_p99": p99 <= slo.p99_ms})
    ok = [r for r in rows if r["meets_p99"]]
    best = min(ok, key=lambda r: (r["instances"], r["p99_estimate_ms"])) if ok else None
    out = {"slo": {"p99_ms": slo.p99_ms, "peak_qps": slo.peak_qps,
                   "requests_per_day": slo.requests_per_day, "utilization": slo.utilization,
                   "max_input": slo.max_input},
           "options": rows, "choice": best, "price_per_hour": price_per_hour,
           "measured_max_input": measured_max_input}
    if best is None:
        out["verdict"] = (f"no measured batch size meets p99 <= {slo.p99_ms:g} ms at "
                          f"{slo.peak_qps:g} QPS: faster hardware or a smaller model is needed")
    else:
        out["verdict"] = (f"{best['instances']} instance(s) at batch {best['batch']}: "
                          f"p99 ~ {best['p99_estimate_ms']:.1f} ms <= {slo.p99_ms:g} ms at "
                          f"{slo.peak_qps:g} QPS")
        average_qps = slo.requests_per_day / 86400
        out["instances_for_average"] = max(1, math.ceil(
            average_qps / best["planned_throughput"] - 1e-9))
        if price_per_hour is not None:
            per_day = best["instances"] * 24 * price_per_hour
            floor = out["instances_for_average"] * 24 * price_per_hour
            out["cost_per_day"] = per_day
            out["cost_per_million"] = per_day / slo.requests_per_day * 1e6
            out["cost_per_million_autoscaled_floor"] = floor / slo.requests_per_day * 1e6
    if measured_max_input is not None and measured_max_input < slo.max_input:
        out["warning"] = (f"latency was measured on inputs up to {measured_max_input}; "
                          f"slo.max_input={slo.max_input} is larger, so this plan is optimistic")
    return out
