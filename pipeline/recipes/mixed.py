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
from dataclasses import dataclass, field, replace

from pipeline.core.progress import Progress, hms
from pipeline.measure.results import Evaluation
from pipeline.quant.explanation import Explanation
from pipeline.quant.groups import units as make_units
from pipeline.quant.prefix import limit as prefix_limit, smallest_passing
from pipeline.quant.quantized import Quantized
from pipeline.quant.search_record import (HandBack, NodeSensitivity, SearchRecord,
                                          SearchVerdict, TraceRow, TrialCounts, UnitRow)
from pipeline.stages.sqnr import Sqnr

CLEAN_DB = 40.0       # output SQNR above this: error below 1e-4 of the signal, nothing to recover
CHEAP_SHARE = 0.005   # a unit worth less than 0.5 % of the INT8 profile is cheap to keep float
DEFAULT_BUDGET_S = 1800.0


@dataclass
class Unit:
    """What the search floats or keeps INT8 as one: a block of modules, or one node."""
    name: str
    nodes: list
    gain_ms: float = 0.0          # the INT8 time it gives back when float (the profile's gains)
    sqnr_db: float | None = None  # its worst node's output SQNR in INT8
    signal: str = "trial"         # clean | cheap | trial: whether the cheap signals settle it
    effect: float | None = None   # measured: how much floating it helps (metric's unit)
    can_float: bool = True
    stuck: list = field(default_factory=list)  # nodes the quantizer cannot make float

    def row(self) -> UnitRow:
        return UnitRow(self.name, len(self.nodes), self.gain_ms, self.sqnr_db, self.signal,
                       self.effect, self.can_float)


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
    """The mixed search, phase by phase (the module's docstring says why each): the units and
    their cheap signals, a ranking trial for each unit the signals cannot settle, the order,
    the full evaluations (bisection over the order's prefixes, then costly nodes handed back),
    and the record. Returns the chosen artifact, the per-node table (``NodeSensitivity``
    rows) and the ``SearchRecord``."""
    s = _Search(qz, method, exclude, all_int8, clock, stream)
    units = s.units()
    s.rank(units)
    ranked = sorted((u for u in units if u.can_float), key=_order_key)
    order = [u.name for u in ranked]
    members = {u.name: [n for n in u.nodes if n not in u.stuck] for u in ranked}
    handback = s.full_evaluations(order, members)
    within = [k for k, r in enumerate(s.trace) if r.within_budget]
    best = (min(within, key=lambda k: s.trace[k].estimated_ms) if within
            else min(range(len(s.trace)), key=lambda k: s.trace[k].drop))
    verdict = s.verdict(s.trace[best], bool(within), order, members, len(handback))
    return s.models[best], s.table(units, order), SearchRecord(
        verdict, tuple(s.trace), tuple(order), tuple(u.row() for u in units), tuple(handback))


def _order_key(u):
    """Measured units by recovered accuracy per ms given up (helpful first), then the untried
    by their SQNR (cheap before trial), clean ones last."""
    s = u.sqnr_db if u.sqnr_db is not None else math.inf
    if u.effect is not None:
        return (0 if u.effect > 0 else 3, -u.effect / max(u.gain_ms, 0.01), s)
    if u.signal == "cheap" or u.signal == "trial":
        return (1 if u.signal == "cheap" else 2, s, 0.0)
    return (4, s, 0.0)


class _Search:
    """One search's shared state: the all-INT8 model's profile and SQNR, the budgets, the
    counts of trials and evaluations, and the trace of full evaluations."""

    def __init__(self, qz, method: str, exclude: set, all_int8, clock, stream):
        job = qz.job
        q = job.quant
        self.qz, self.method, self.exclude, self.all_int8 = qz, method, exclude, all_int8
        self.clock, self.stream = clock, stream
        budget = q.max_accuracy_drop
        if budget is None:  # a third of what the gate lets the primary lose, in its own scale
            from pipeline.metrics.limits import limits

            budget = round(limits(job.gate.max_accuracy_drop, qz.metric)[qz.metric.name] / 3, 9)
        self.budget = budget
        self.clock_budget = Budget(float(getattr(q, "search_budget_s", DEFAULT_BUDGET_S)), clock)
        self.by = str(getattr(getattr(q, "search_groups", "blocks"), "value",
                              getattr(q, "search_groups", "blocks")))
        self.ref = Evaluation.of(qz.fp16_eval).metrics[qz.metric.name]
        expl = Explanation.of(qz.explain(all_int8))
        self.gains = expl.gains()
        self.ops = {r.node: r.fp32_op for r in expl.nodes}
        self.modules = {r.node: r.module for r in expl.nodes if r.module}
        model = Quantized.of(all_int8)
        self.precision = model.precision
        self.nodes, self.together, op_types = _candidates(all_int8, model, exclude)
        for n, op in op_types.items():
            self.ops.setdefault(n, op)
        self.sqnr = qz.runner.run(Sqnr(qz.evaluation, qz.subset, qz.hw), all_int8,
                                  fp32=qz.fp32).meta["sqnr_db"]
        self.int8_ms = expl.int8_total_ms
        self.cheap_ms = CHEAP_SHARE * self.int8_ms
        self.counts = TrialCounts()  # a tally until the verdict freezes a copy
        self.log = getattr(qz.runner, "log", None)
        self.trace: list[TraceRow] = []
        self.models: list = []       # the artifact of each trace row
        self.steps = None

    def spread(self, names) -> tuple:
        """``names`` with what floats together with each (the data movement feeding a
        LayerNormalization), in order, once each."""
        return tuple(dict.fromkeys(m for n in names for m in self.together.get(n, (n,))))

    def variant(self, floated, label):
        """The all-INT8 model with ``floated`` float: edited where no node is dynamic INT8,
        else quantized again (the dynamic LSTM)."""
        qz, floated = self.qz, self.spread(floated)
        if not any(self.precision.get(n, "").startswith("int8-dynamic") for n in floated) \
                and hasattr(qz, "edit"):
            self.counts.edited += 1
            return qz.edit(self.all_int8, floated, label=f"edit[{label}]")
        self.counts.requantized += 1
        return qz.quantize(self.method, self.exclude | set(floated), label=f"quantize[{label}]")

    def trial(self, art, label, hand_back: bool = False) -> float:
        """A score on the ranking subset: a ranking trial, or (``hand_back``) a hand-back one."""
        if hand_back:
            self.counts.hand_back_trials += 1
        else:
            self.counts.ranking_trials += 1
        return self.qz.score(art, f"rank[{label}]")

    def units(self) -> list[Unit]:
        """The units (``quant.search_groups``) with their cheap signals: the INT8 time each
        gives back when float, its worst SQNR, and whether that settles it (clean, cheap)."""
        by, sqnr = self.by, self.sqnr
        units = [Unit(u["name"], u["nodes"]) for u in make_units(self.nodes, self.modules, by)]
        for u in units:
            u.gain_ms = sum(self.gains.get(n, 0.0) for n in u.nodes)
            known = [sqnr[n] for n in u.nodes if sqnr.get(n) is not None]
            u.sqnr_db = min(known) if known else None
            exact = all(n in sqnr and sqnr[n] is None for n in u.nodes)  # no error at all
            clean = exact or (u.sqnr_db is not None and u.sqnr_db >= CLEAN_DB)
            u.signal = ("clean" if by == "blocks" and clean else
                           "cheap" if by == "blocks" and u.gain_ms < self.cheap_ms else "trial")
        return units

    def rank(self, units: list[Unit]) -> None:
        """One edited trial per unit where the cheap signals disagree, on the ranking subset,
        worst SQNR first, within half the time budget: its ``effect`` (positive: floating it
        helps), or ``can_float`` False when nothing of it can be handed back to float."""
        qz, by, clock = self.qz, self.by, self.clock
        base = qz.score(self.all_int8, "rank[all-int8]")
        trials = [u for u in units if u.signal == "trial"]
        trials.sort(key=lambda u: (u.sqnr_db if u.sqnr_db is not None else math.inf))
        bar = Progress(len(trials), f"mixed search: ranking {by}", self.stream, clock=clock,
                       unit="trials")
        clean, cheap = (sum(u.signal == k for u in units) for k in ("clean", "cheap"))
        (self.stream or sys.stdout).write(
            f"  mixed search: {len(self.nodes)} INT8 nodes in {len(units)} {by}: "
            f"{len(trials)} to rank, {clean} clean (SQNR >= {CLEAN_DB:g} dB), "
            f"{cheap} cheap (< {100 * CHEAP_SHARE:g} % of the INT8 profile each), "
            f"time budget {hms(self.clock_budget.seconds)}\n")
        if self.log is not None:
            qz.runner.log = bar.around(self.log)
        try:
            for k, u in enumerate(trials):
                if self.clock_budget.over(0.5, "ranking"):
                    break
                bar.update(k, u.name)
                art = self.variant(u.nodes, f"float {u.name}")
                u.stuck = list(Quantized.of(art).exclusion_ignored)
                if set(u.stuck) >= set(u.nodes) - set(self.exclude):
                    # Nothing of it can be handed back to float (a MaxPool between INT8
                    # neighbours): no choice for the search.
                    u.can_float = False
                    continue
                # How much better floating this unit makes the model (positive: helps), in the
                # metric's unit whatever its direction.
                u.effect = qz.metric.drop(self.trial(art, f"float {u.name}"), base)
            if trials and not self.clock_budget.stopped:
                bar.update(len(trials))
            bar.done()
        finally:
            if self.log is not None:
                qz.runner.log = self.log

    def evaluate(self, floated: tuple, why: str) -> TraceRow:
        """A full evaluation of the model with ``floated`` float: its drop, whether it is
        within the budget, its estimated time (each float node gives its INT8 gain back)."""
        qz, floated = self.qz, self.spread(floated)
        self.steps.update(min(self.counts.full_evaluations, self.steps.total - 1), why)
        art = qz.quantize(self.method, self.exclude | set(floated),
                          label=f"quantize[mixed {len(floated)}]")
        self.counts.requantized += 1
        self.counts.full_evaluations += 1
        scores = qz.scores(art, f"evaluate[mixed {len(floated)} float]", subset=False)
        acc = scores[qz.metric.name]
        est = self.int8_ms + sum(self.gains.get(n, 0.0) for n in floated)
        drop = qz.metric.drop(self.ref, acc)
        within = drop <= self.budget + 1e-9 and qz.companions_within(scores)
        row = TraceRow(tuple(floated), acc, drop, within, est, why)
        self.trace.append(row)
        self.models.append(art)
        return row

    def full_evaluations(self, order: list, members: dict) -> list:
        """All INT8 first; past the budget, the shortest prefix of ``order`` that passes
        (bisection), then its costly nodes handed back to INT8 where accuracy allows."""
        self.steps = Progress(prefix_limit(len(order)) + math.ceil(math.log2(len(order) + 1))
                              + 2, "mixed search: full evaluations", self.stream,
                              clock=self.clock, unit="evaluations")

        def nodes_of(k: int) -> tuple:
            return tuple(n for name in order[:k] for n in members[name])

        if self.log is not None:
            self.qz.runner.log = self.steps.around(self.log)
        handback = []
        try:
            if self.evaluate((), "all INT8").within_budget:
                return handback
            rows = {}

            def passes(k: int) -> bool:
                rows[k] = self.evaluate(nodes_of(k), f"top {k} of {len(order)} {self.by} float")
                return rows[k].within_budget

            hi = smallest_passing(len(order), passes,
                                  lambda: self.clock_budget.over(1.0, "bisection"))
            hi_row = rows.get(hi)
            if hi_row is not None and hi_row.within_budget:
                handback = _hand_back(self.qz, hi_row, self.gains, self.cheap_ms, self.variant,
                                      lambda a, lab: self.trial(a, lab, hand_back=True),
                                      self.evaluate, self.clock_budget,
                                      max(8, math.ceil(math.sqrt(len(self.nodes)))))
        finally:
            self.steps.done()
            if self.log is not None:
                self.qz.runner.log = self.log
        return handback

    def verdict(self, best: TraceRow, met: bool, order: list, members: dict,
                n_c: int) -> SearchVerdict:
        """The search's machine-readable record: what it chose, what it cost, whether the time
        budget stopped it."""
        cb, counts, by, budget = self.clock_budget, replace(self.counts), self.by, self.budget
        limit = prefix_limit(len(order)) + math.ceil(math.log2(n_c + 1)) + 2
        spent = cb.elapsed()
        stopped = (f"; stopped by quant.search_budget_s={cb.seconds:g} during the "
                   f"{cb.stopped} after {hms(spent)} with the best model so far"
                   if cb.stopped else "")
        total = sum(len(members[n]) for n in order)
        floated = len(best.float_nodes)
        summary = (f"kept {floated} of {total} nodes float: drop {best.drop:.2f} points (budget "
                   f"{budget}) after {counts.full_evaluations} full evaluations and "
                   f"{counts.ranking_trials + counts.hand_back_trials} ranking trials over "
                   f"{len(order)} {by}" if met else
                   f"budget {budget} not met; best drop {best.drop:.2f} points with {floated} "
                   "nodes float")
        return SearchVerdict(
            budget_points=budget, met=met, chosen_float_nodes=best.float_nodes, drop=best.drop,
            full_evaluations=counts.full_evaluations, evaluation_limit=limit,
            within_limit=counts.full_evaluations <= limit, quantizable_nodes=total,
            units=len(order), ranked_by=by, trials=counts, seconds=round(spent, 3),
            time_budget_s=cb.seconds, stopped_by_budget=cb.stopped, summary=summary + stopped)

    def table(self, units: list[Unit], order: list) -> list[NodeSensitivity]:
        """One row per node: its unit, signals, measured effect and whether it could float,
        in the search's order."""
        table = []
        unit_of = {n: u for u in units for n in u.nodes}
        for n in self.nodes:
            u = unit_of[n]
            floatable = u.can_float and n not in u.stuck
            table.append(NodeSensitivity(
                node=n, op=self.ops.get(n, "?"), group=u.name, sqnr_db=self.sqnr.get(n),
                latency_gain_ms=self.gains.get(n, 0.0),
                metric_effect=u.effect if floatable else None,
                score=(u.effect / max(u.gain_ms, 0.01)
                       if floatable and u.effect is not None else None),
                signal=u.signal, can_float=floatable))
        rank_of = {name: k for k, name in enumerate(order)}
        table.sort(key=lambda r: (not r.can_float, rank_of.get(r.group, len(order)), r.node))
        return table


def _candidates(all_int8, model: Quantized, exclude) -> tuple[list, dict, dict]:
    """The nodes the search may float, in graph order; what floats together with each; the op
    types of those the profile does not name. Besides the nodes reported INT8, every node the
    quantizer wrapped in Q/DQ pairs (a LayerNormalization, a Concat): on a 258-node network a
    LayerNorm's rounded input cost 2 points that no mix of the reported nodes gave back."""
    import onnx

    from pipeline.stages.float_nodes import handback_candidates

    path = getattr(all_int8, "model", None)
    reported = model.int8()
    if path is None:  # no graph to read (a model of known sensitivities, in the tests)
        return reported, {}, {}
    graph = onnx.load(str(path), load_external_data=False).graph
    excluded = set(exclude) | set(model.excluded)
    order, together = handback_candidates(graph, model.precision, excluded)
    order += [n for n in reported if n not in set(order)]  # (a name the graph spells otherwise)
    return order, together, {n.name: n.op_type for n in graph.node if n.name in together}


def _hand_back(qz, row: TraceRow, gains, cheap_ms, variant, rank, evaluate, clock_budget,
               most) -> list[HandBack]:
    """The chosen units' costly nodes back to INT8, where accuracy allows: each ranked by what
    handing it back costs on the ranking subset (one edited trial each), then the number handed
    back bisected on the full set. Cheap nodes stay float: they never get a trial of their own;
    nor do more than ``most`` (about sqrt(N)) of the costly ones, the largest gains first."""
    floated = list(row.float_nodes)
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
        if evaluate(keep, f"{mid} of {len(back)} costly nodes back to INT8").within_budget:
            lo = mid
        else:
            hi = mid - 1
    return [HandBack(n, gains.get(n, 0.0), harm[n], k < lo) for k, n in enumerate(back)]
