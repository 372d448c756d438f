"""Mixed precision under an accuracy budget, in a logarithmic number of full evaluations.

In: the ``Quantizer`` (its runner, stages and ranking subset), the calibration method, the nodes
already kept float, and the all-INT8 model. Out: the chosen model, a per-node sensitivity table
and the search trace with a machine-readable verdict.

How, and why this way: one full evaluation per node (what the slow tuners do) costs N passes over
the evaluation set. Instead, each quantized node gets
- its output SQNR (one pass over a few batches, ``stages/sqnr.py``),
- its *effect*: sequence accuracy recovered on the ranking subset (the hardest lines) when only
  that node is kept float, with everything else INT8 (cheap: a small subset),
- its *gain*: the INT8 time saved on that node, from the profile of ``explain``.
Nodes are ranked by effect per millisecond of gain (most harm for the least speed first). Keeping
the top-k float is monotone enough to bisect k on the full evaluation set: about log2(N)
evaluations, then a greedy repair that tries to hand back to INT8 the cheapest float nodes (at
most three more). The best model so far (fastest within budget, else the smallest drop) is always
kept, so a search that cannot meet the budget still returns something and says so.
"""
from __future__ import annotations

import math

from pipeline.stages.sqnr import Sqnr

REPAIR_TRIES = 3


def search(qz, method: str, exclude: set, all_int8):
    cfg = qz.cfg
    budget = cfg.quant.max_accuracy_drop
    if budget is None:  # a third of what the gate lets the primary metric lose, in its own scale
        from pipeline.metrics.limits import limits

        budget = round(limits(cfg.gate.max_accuracy_drop, qz.metric)[qz.metric.name] / 3, 9)
    ref = qz.fp16_eval.meta["metrics"][qz.metric.name]
    expl = qz.explain(all_int8).meta
    gains = {r["node"]: r["gain_ms"] for r in expl["nodes"]}
    ops = {r["node"]: r["fp32_op"] for r in expl["nodes"]}
    nodes = [n for n, p in all_int8.meta["precision"].items() if p.startswith("int8")]
    sqnr = qz.runner.run(Sqnr(qz.evaluation, qz.subset, qz.hw), all_int8,
                         fp32=qz.fp32).meta["sqnr_db"]
    base = qz.score(all_int8, "rank[all-int8]")
    table = []
    for node in nodes:
        alone = qz.quantize(method, exclude | {node}, label=f"quantize[float {node}]")
        gain = gains.get(node, 0.0)
        row = {"node": node, "op": ops.get(node, "?"), "sqnr_db": sqnr.get(node),
               "latency_gain_ms": gain}
        if node in alone.meta.get("exclusion_ignored", ()):
            # A node the quantizer cannot hand back to float on its own (a MaxPool between INT8
            # neighbours) is no choice for the search: it stays INT8 whatever is excluded.
            table.append({**row, "metric_effect": None, "score": None, "can_float": False})
            continue
        # How much better floating this node makes the model (positive: helps), in the metric's
        # unit whatever its direction.
        effect = qz.metric.drop(qz.score(alone, f"rank[float {node}]"), base)
        table.append({**row, "metric_effect": effect, "score": effect / max(gain, 0.01),
                      "can_float": True})
    table.sort(key=lambda r: (not r["can_float"], -(r["score"] or 0.0), r["node"]))
    order = [r["node"] for r in table if r["can_float"]]
    int8_ms = expl["int8_total_ms"]

    trace, evaluations = [], 0

    def evaluate(floated: tuple) -> dict:
        nonlocal evaluations
        art = qz.quantize(method, exclude | set(floated), label=f"quantize[mixed {len(floated)}]")
        evaluations += 1
        acc = qz.score(art, f"evaluate[mixed {len(floated)} float]", subset=False)
        est = int8_ms + sum(gains.get(n, 0.0) for n in floated)  # a float node gives its gain back
        drop = qz.metric.drop(ref, acc)
        row = {"float_nodes": list(floated), "accuracy": acc, "drop": drop,
               "within_budget": drop <= budget + 1e-9, "estimated_ms": est,
               "artifact": art}
        trace.append(row)
        return row

    lo_row = evaluate(())
    if lo_row["within_budget"]:
        best = lo_row
    else:
        lo, hi = 0, len(order)
        hi_row = None
        while hi - lo > 1:
            mid = (lo + hi) // 2
            row = evaluate(tuple(order[:mid]))
            if row["within_budget"]:
                hi, hi_row = mid, row
            else:
                lo = mid
        if hi_row is None:
            hi_row = evaluate(tuple(order[:hi]))
        best = hi_row
        if best["within_budget"]:
            # Repair: hand back to INT8 the float nodes with the largest gain, one at a time.
            kept = list(best["float_nodes"])
            for node in sorted(kept, key=lambda n: -gains.get(n, 0.0))[:REPAIR_TRIES]:
                if len(kept) <= 1:
                    break
                row = evaluate(tuple(n for n in kept if n != node))
                if row["within_budget"]:
                    kept.remove(node)
                    best = row
    within = [r for r in trace if r["within_budget"]]
    best = min(within, key=lambda r: r["estimated_ms"]) if within else min(trace, key=lambda r: r["drop"])
    limit = 2 * math.log2(max(len(order), 1)) + 3
    verdict = {"budget_points": budget, "met": bool(within), "chosen_float_nodes": best["float_nodes"],
               "drop": best["drop"], "full_evaluations": evaluations,
               "evaluation_limit": limit, "within_limit": evaluations <= limit,
               "quantizable_nodes": len(order),
               "summary": (f"kept {len(best['float_nodes'])} of {len(order)} nodes float: drop "
                           f"{best['drop']:.2f} points (budget {budget}) after {evaluations} full "
                           "evaluations" if within else
                           f"budget {budget} not met; best drop {best['drop']:.2f} points with "
                           f"{len(best['float_nodes'])} nodes float")}
    steps = [{k: v for k, v in r.items() if k != "artifact"} for r in trace]
    return best["artifact"], table, {"verdict": verdict, "trace": steps, "order": order}

