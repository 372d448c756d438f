"""What the tests of the INT8 sub-recipe and its searches share: stage metas as the stages write
them (every key: the recipes read them into typed records, which refuse a key they lack and
need every one they know), for fakes that stand in for the runner."""
from __future__ import annotations


def explain_meta(gains: dict, int8_total_ms: float, modules: dict | None = None,
                 op: str = "Conv") -> dict:
    """An ``explain`` stage's meta: one node per ``gains`` entry (node -> INT8 gain in ms)."""
    nodes = [{"node": n, "module": (modules or {}).get(n), "fp32_op": op, "int8_op": "QLinearConv",
              "precision": "int8-static", "fp32_ms": max(g, 0.0), "int8_ms": max(-g, 0.0),
              "gain_ms": g, "slower_in_int8": g < 0} for n, g in gains.items()]
    return {"batch_size": 8, "runs": 1, "fp32_total_ms": int8_total_ms + sum(gains.values()),
            "int8_total_ms": int8_total_ms, "qdq_overhead_ms": 0.0, "nodes": nodes,
            "slower_in_int8": [r["node"] for r in nodes if r["slower_in_int8"]],
            "unfused_quantize": 0, "unfused_dequantize": 0, "int8_kernels": ["QLinearConv"],
            "float_compute": []}


def compare_meta(median: float, low: float, high: float, ms_a: float = 1.0) -> dict:
    """A ``compare`` stage's meta: model a over model b."""
    return {"a_over_b_speedup": {"median": median, "ci95": [low, high]}, "ms_a": ms_a,
            "ms_b": ms_a * median, "noisy": False}
