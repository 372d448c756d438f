"""Mixed precision under an accuracy budget: ranked by module blocks, searched on the full set,
within a time budget.

In: the ``Quantizer`` (its runner, stages and ranking subset), the calibration method, the nodes
already kept float, and the all-INT8 model. Out: the chosen model, a per-node sensitivity table
and the search trace with a machine-readable verdict (trials counted, time spent, whether the
time budget stopped it).

How, and why this way: one trial per node (what the slow tuners do, and what this search did)
costs N quantizations and N rankings: 270 of each on a real recognizer, over an hour on 2 cores.
Instead:
1. Units are module blocks (``quant/groups.py``): trials grow with the blocks, not the nodes.
   ``quant.search_groups=nodes`` ranks node by node (the exhaustive search, for comparison).
2. Cheap signals first. Each unit's output SQNR (``stages/sqnr.py``) and INT8 time gain (the
   ``explain`` profile) are known already. A unit whose every node keeps its output within
   ``CLEAN_DB`` of the float model's gets no trial: floating it cannot recover a measurable
   error. A unit worth less than ``CHEAP_SHARE`` of the INT8 profile gets no trial either: it is
   cheap to keep float, so it is floated early, most suspicious (lowest SQNR) first. Only where the
   two disagree (a unit with a visible error that costs time to keep float) is a trial spent.
3. A trial is the all-INT8 model with that unit float, made by editing its QDQ graph
   (``stages/float_nodes.py``: a load and a save, no re-quantization), scored on the ranking
   subset (the hardest lines). Units are ranked by accuracy recovered per millisecond given up.
4. Keeping the top-k units float is monotone enough to search k on the full evaluation set:
   1, 2, 4, ... units, then a bisection (``quant/prefix.py``): about 2·log2(k) evaluations, few
   when the ranking put the units that matter first. Then the chosen units' costly nodes (above ``CHEAP_SHARE``) are
   ranked by what handing each back to INT8 costs on the subset, and the number handed back is
   bisected the same way: about log2 more. Every model evaluated on the full set is quantized
   for real (``quantize_static`` with those nodes excluded), so what ships is what was measured.
5. ``quant.search_budget_s`` bounds the wall time: ranking stops at half of it (the rest of the
   units ordered by their cheap signals), the hand-back at three quarters, evaluations at all of
   it; the best model so far (fastest within the accuracy budget, else the smallest drop) is
   returned and the verdict says the budget stopped the search. Every trial is a cached stage,
   so a search stopped by the budget or by Ctrl-C resumes where it was on the next run.
Progress: each phase shows what runs, k of n, elapsed and time left (``pipeline.core.progress``).
"""
from __future__ import annotations

import math
import sys
import time

from pipeline.core.progress import Progress, hms
from pipeline.quant.groups import units as make_units
from pipeline.quant.prefix import limit as prefix_limit, smallest_passing
from pipeline.stages.sqnr import Sqnr

CLEAN_DB = 40.0       # output SQNR above this: error below 1e-4 of the signal, nothing to recover
CHEAP_SHARE = 0.005   # a unit worth less than 0.5 % of the INT8 profile is cheap to keep float
DEFAULT_BUDGET_S = 1800.0


class Budget:
    """Wall time since the search started, against ``quant.search_budget_s``."""

    def __init__(self, seconds: float, clock):
        self.seconds, self.clock, self.t0 = seconds, clock, clock()
        self.stopped: str | None = None  # the phase the budget stopped

    def elapsed(self) -> float:
        return self.clock() - self.t0

    def over(self, share: float, phase: str) -> bool:
        if self.elapsed() >= share * self.seconds:
            self.stopped = self.stopped or phase
            return True
        return False


def search(qz, method: str, exclude: set, all_int8, clock=time.monotonic, stream=None):
    cfg = qz.cfg
    q = cfg.quant
    budget = q.max_accuracy_drop
    if budget is None:  # a third of what the gate lets the primary metric lose, in its own scale
        from pipeline.metrics.limits import limits

        budget = round(limits(cfg.gate.max_accuracy_drop, qz.metric)[qz.metric.name] / 3, 9)
    clock_budget = Budget(float(getattr(q, "search_budget_s", DEFAULT_BUDGET_S)), clock)
    by = str(getattr(getattr(q, "search_groups", "blocks"), "value",
                     getattr(q, "search_groups", "blocks")))
    ref = qz.fp16_eval.meta["metrics"][qz.metric.name]
    expl = qz.explain(all_int8).meta
    gains = {r["node"]: r["gain_ms"] for r in expl["nodes"]}
    ops = {r["node"]: r["fp32_op"] for r in expl["nodes"]}
    modules = {r["node"]: r.get("module") for r in expl["nodes"] if r.get("module")}
    precision = all_int8.meta["precision"]
    nodes, together, op_types = _candidates(all_int8, precision, exclude)
    for n, op in op_types.items():
        ops.setdefault(n, op)

    def spread(names) -> tuple:
        """``names`` with what floats together with each (the data movement feeding a
        LayerNormalization), in order, once each."""
        return tuple(dict.fromkeys(m for n in names for m in together.get(n, (n,))))
    sqnr = qz.runner.run(Sqnr(qz.evaluation, qz.subset, qz.hw), all_int8,
                         fp32=qz.fp32).meta["sqnr_db"]
    int8_ms = expl["int8_total_ms"]
    cheap_ms = CHEAP_SHARE * int8_ms
    counts = {"ranking_trials": 0, "hand_back_trials": 0, "edited": 0, "requantized": 0,
              "full_evaluations": 0}
    log = getattr(qz.runner, "log", None)

    def variant(floated, label):
        """The all-INT8 model with ``floated`` float: edited where no node is dynamic INT8,
        else quantized again (the dynamic LSTM)."""
        floated = spread(floated)
        if not any(precision.get(n, "").startswith("int8-dynamic") for n in floated) \
                and hasattr(qz, "edit"):
            counts["edited"] += 1
            return qz.edit(all_int8, floated, label=f"edit[{label}]")
        counts["requantized"] += 1
        return qz.quantize(method, exclude | set(floated), label=f"quantize[{label}]")

    def rank(art, label, phase="ranking_trials") -> float:
        counts[phase] += 1
        return qz.score(art, f"rank[{label}]")

    base = qz.score(all_int8, "rank[all-int8]")
    units = make_units(nodes, modules, by)
    for u in units:
        u["gain_ms"] = sum(gains.get(n, 0.0) for n in u["nodes"])
        known = [sqnr[n] for n in u["nodes"] if sqnr.get(n) is not None]
        u["sqnr_db"] = min(known) if known else None
        exact = all(n in sqnr and sqnr[n] is None for n in u["nodes"])  # no error at all
        clean = exact or (u["sqnr_db"] is not None and u["sqnr_db"] >= CLEAN_DB)
        u["signal"] = ("clean" if by == "blocks" and clean else
                       "cheap" if by == "blocks" and u["gain_ms"] < cheap_ms else "trial")
        u["effect"], u["can_float"], u["stuck"] = None, True, []

    # -- rank the units where the cheap signals disagree --------------------------------------
    trials = [u for u in units if u["signal"] == "trial"]
    trials.sort(key=lambda u: (u["sqnr_db"] if u["sqnr_db"] is not None else math.inf))
    bar = Progress(len(trials), f"mixed search: ranking {by}", stream, clock=clock,
                   unit="trials")
    kinds = {k: sum(u["signal"] == k for u in units) for k in ("clean", "cheap", "trial")}
    (stream or sys.stdout).write(
        f"  mixed search: {len(nodes)} INT8 nodes in {len(units)} {by}: {kinds['trial']} to rank, "
        f"{kinds['clean']} clean (SQNR >= {CLEAN_DB:g} dB), {kinds['cheap']} cheap (< "
        f"{100 * CHEAP_SHARE:g} % of the INT8 profile each), time budget "
        f"{hms(clock_budget.seconds)}\n")
    if log is not None:
        qz.runner.log = bar.around(log)
    try:
        for k, u in enumerate(trials):
            if clock_budget.over(0.5, "ranking"):
                break
            bar.update(k, u["name"])
            art = variant(u["nodes"], f"float {u['name']}")
            u["stuck"] = list(art.meta.get("exclusion_ignored", ()))
            if set(u["stuck"]) >= set(u["nodes"]) - set(exclude):
                # Nothing of it can be handed back to float (a MaxPool between INT8 neighbours):
                # no choice for the search.
                u["can_float"] = False
                continue
            # How much better floating this unit makes the model (positive: helps), in the
            # metric's unit whatever its direction.
            u["effect"] = qz.metric.drop(rank(art, f"float {u['name']}"), base)
        if trials and not clock_budget.stopped:
            bar.update(len(trials))
        bar.done()
    finally:
        if log is not None:
            qz.runner.log = log

    def order_key(u):
        s = u["sqnr_db"] if u["sqnr_db"] is not None else math.inf
        if u["effect"] is not None:  # measured: recovered per ms given up, helpful first
            return (0 if u["effect"] > 0 else 3, -u["effect"] / max(u["gain_ms"], 0.01), s)
        if u["signal"] == "cheap" or u["signal"] == "trial":  # untried: by its SQNR
            return (1 if u["signal"] == "cheap" else 2, s, 0.0)
        return (4, s, 0.0)  # clean: last

    ranked = sorted((u for u in units if u["can_float"]), key=order_key)
    order = [u["name"] for u in ranked]
    members = {u["name"]: [n for n in u["nodes"] if n not in u["stuck"]] for u in ranked}

    trace = []
    steps = Progress(prefix_limit(len(ranked)) + math.ceil(math.log2(len(ranked) + 1)) + 2,
                     "mixed search: full evaluations", stream, clock=clock, unit="evaluations")

    def evaluate(floated: tuple, why: str) -> dict:
        floated = spread(floated)
        steps.update(min(counts["full_evaluations"], steps.total - 1), why)
        art = qz.quantize(method, exclude | set(floated), label=f"quantize[mixed {len(floated)}]")
        counts["requantized"] += 1
        counts["full_evaluations"] += 1
        acc = qz.score(art, f"evaluate[mixed {len(floated)} float]", subset=False)
        est = int8_ms + sum(gains.get(n, 0.0) for n in floated)  # a float node gives its gain back
        drop = qz.metric.drop(ref, acc)
        row = {"float_nodes": list(floated), "accuracy": acc, "drop": drop,
               "within_budget": drop <= budget + 1e-9, "estimated_ms": est, "artifact": art,
               "step": why}
        trace.append(row)
        return row

    def nodes_of(k: int) -> tuple:
        return tuple(n for name in order[:k] for n in members[name])

    if log is not None:
        qz.runner.log = steps.around(log)
    try:
        best = evaluate((), "all INT8")
        handback = []
        if not best["within_budget"]:
            rows = {}

            def passes(k: int) -> bool:
                rows[k] = evaluate(nodes_of(k), f"top {k} of {len(order)} {by} float")
                return rows[k]["within_budget"]

            hi = smallest_passing(len(order), passes, lambda: clock_budget.over(1.0, "bisection"))
            hi_row = rows.get(hi)
            if hi_row is not None and hi_row["within_budget"]:
                handback = _hand_back(qz, hi_row, gains, cheap_ms, variant,
                                      lambda a, lab: rank(a, lab, "hand_back_trials"), evaluate,
                                      clock_budget, max(8, math.ceil(math.sqrt(len(nodes)))))
    finally:
        steps.done()
        if log is not None:
            qz.runner.log = log

    within = [r for r in trace if r["within_budget"]]
    best = min(within, key=lambda r: r["estimated_ms"]) if within else min(trace, key=lambda r: r["drop"])
    n_c = len(handback)
    limit = prefix_limit(len(order)) + math.ceil(math.log2(n_c + 1)) + 2
    spent = clock_budget.elapsed()
    stopped = (f"; stopped by quant.search_budget_s={clock_budget.seconds:g} during the "
               f"{clock_budget.stopped} after {hms(spent)} with the best model so far"
               if clock_budget.stopped else "")
    verdict = {"budget_points": budget, "met": bool(within), "chosen_float_nodes": best["float_nodes"],
               "drop": best["drop"], "full_evaluations": counts["full_evaluations"],
               "evaluation_limit": limit, "within_limit": counts["full_evaluations"] <= limit,
               "quantizable_nodes": sum(len(members[n]) for n in order), "units": len(order),
               "ranked_by": by, "trials": dict(counts), "seconds": round(spent, 3),
               "time_budget_s": clock_budget.seconds, "stopped_by_budget": clock_budget.stopped,
               "summary": (f"kept {len(best['float_nodes'])} of {sum(len(members[n]) for n in order)} "
                           f"nodes float: drop {best['drop']:.2f} points (budget {budget}) after "
                           f"{counts['full_evaluations']} full evaluations and "
                           f"{counts['ranking_trials'] + counts['hand_back_trials']} ranking "
                           f"trials over {len(order)} {by}"
                           if within else
                           f"budget {budget} not met; best drop {best['drop']:.2f} points with "
                           f"{len(best['float_nodes'])} nodes float") + stopped}
    table = []
    unit_of = {n: u for u in units for n in u["nodes"]}
    for n in nodes:
        u = unit_of[n]
        floatable = u["can_float"] and n not in u["stuck"]
        table.append({"node": n, "op": ops.get(n, "?"), "group": u["name"],
                      "sqnr_db": sqnr.get(n), "latency_gain_ms": gains.get(n, 0.0),
                      "metric_effect": u["effect"] if floatable else None,
                      "score": (u["effect"] / max(u["gain_ms"], 0.01)
                                if floatable and u["effect"] is not None else None),
                      "signal": u["signal"], "can_float": floatable})
    rank_of = {name: k for k, name in enumerate(order)}
    table.sort(key=lambda r: (not r["can_float"], rank_of.get(r["group"], len(order)), r["node"]))
    rows = [{k: v for k, v in r.items() if k != "artifact"} for r in trace]
    groups = [{"name": u["name"], "nodes": len(u["nodes"]), "gain_ms": u["gain_ms"],
               "sqnr_db": u["sqnr_db"], "signal": u["signal"], "effect": u["effect"],
               "can_float": u["can_float"]} for u in units]
    return best["artifact"], table, {"verdict": verdict, "trace": rows, "order": order,
                                     "groups": groups, "hand_back": handback}


def _candidates(all_int8, precision: dict, exclude) -> tuple[list, dict, dict]:
    """The nodes the search may float, in graph order; what floats together with each; the op
    types of those the profile does not name. Besides the nodes reported INT8, every node the
    quantizer wrapped in Q/DQ pairs (a LayerNormalization, a Concat): on a 258-node network a
    LayerNorm's rounded input cost 2 points that no mix of the reported nodes gave back."""
    import onnx

    from pipeline.stages.float_nodes import handback_candidates

    path = getattr(all_int8, "model", None)
    reported = [n for n, p in precision.items() if p.startswith("int8")]
    if path is None:  # no graph to read (a model of known sensitivities, in the tests)
        return reported, {}, {}
    graph = onnx.load(str(path), load_external_data=False).graph
    excluded = set(exclude) | set(all_int8.meta.get("excluded", ()))
    order, together = handback_candidates(graph, precision, excluded)
    order += [n for n in reported if n not in set(order)]  # (a name the graph spells otherwise)
    return order, together, {n.name: n.op_type for n in graph.node if n.name in together}


def _hand_back(qz, row, gains, cheap_ms, variant, rank, evaluate, clock_budget, most) -> list:
    """The chosen units' costly nodes back to INT8, where accuracy allows: each ranked by what
    handing it back costs on the ranking subset (one edited trial each), then the number handed
    back bisected on the full set. Cheap nodes stay float: they never get a trial of their own;
    nor do more than ``most`` (about sqrt(N)) of the costly ones, the largest gains first."""
    floated = list(row["float_nodes"])
    costly = sorted((n for n in floated if gains.get(n, 0.0) >= cheap_ms),
                    key=lambda n: -gains.get(n, 0.0))[:most]
    if len(floated) < 2 or not costly or clock_budget.over(0.75, "hand-back"):
        return []
    start = rank(variant(floated, f"{len(floated)} float"), f"{len(floated)} float")
    harm = {}
    for n in costly:
        if clock_budget.over(0.75, "hand-back"):
            break
        rest = [m for m in floated if m != n]
        harm[n] = qz.metric.drop(start, rank(variant(rest, f"{len(floated)} float less {n}"),
                                            f"{len(floated)} float less {n}"))
    # Cheapest to hand back first: least accuracy lost per ms won back.
    back = sorted(harm, key=lambda n: (max(harm[n], 0.0) / max(gains.get(n, 0.0), 0.01), n))
    lo, hi = 0, len(back)  # lo: known to stay within budget
    while hi - lo > 0 and not clock_budget.over(1.0, "hand-back"):
        mid = (lo + hi + 1) // 2
        keep = tuple(m for m in floated if m not in back[:mid])
        if evaluate(keep, f"{mid} of {len(back)} costly nodes back to INT8")["within_budget"]:
            lo = mid
        else:
            hi = mid - 1
    return [{"node": n, "gain_ms": gains.get(n, 0.0), "harm": harm[n],
             "handed_back": k < lo} for k, n in enumerate(back)]
