"""``quant=auto``: the fastest artifact that passes every gate on this machine, whatever its CPU.

In: the config, the runner and the float artifacts the recipe built (export, FP32, FP16). Out:
the recipe's ``Outcome`` for the winner, with ``auto``: the whole table (each candidate on each
runtime: accuracy, p50, speedup over the fastest float baseline with its 95 % CI, the gate's
verdict) and why the winner won.

Candidates, each a cached stage output (a second run rebuilds nothing):
- the optimized FP32 model on every target this machine has (ONNX Runtime fp32, OpenVINO fp32,
  and OpenVINO bf16 / fp16 only where the CPU has native kernels for them);
- static INT8 as ``quant=int8`` builds it, then, only when it is within the accuracy budget,
  the float-region search for speed (``quant.region_trials``, ``pipeline/recipes/regions.py``:
  timing faster variants of a model that cannot ship is wasted); dynamic INT8 (the LSTM only;
  not built for a graph without such ops: it would be FP32 again), on every target;
- ``mixed`` under the gate's own accuracy budget, built as ``quant=mixed`` builds it, only when
  the static INT8 model misses that budget (within it, the search would return that very model).
All of them are timed in one benchmark (``stages/benchmark.py``, its ``contenders``): one
process, interleaved rounds, blocks when runtimes mix, one A/A check, so every speedup is a ratio
measured side by side. Each (candidate, target) is then judged by the gate exactly as a shipped
candidate would be, from its own seat of that benchmark (``pipeline.measure.seat``: its label's
numbers, nothing copied or renamed); the fastest at the gate's batch size that passes every
check ships: a choice (the outcome holds its artifact and evaluation as the candidate and the
label it was timed under, ``Outcome.seat``), with the verdict its row was given. A float
winner is the fastest float baseline itself: its speedup over it is 1 by identity, never a slower
model. With none passing, the most accurate fast one goes to the gate, which fails visibly.
The INT8 sub-recipe runs on the configured target exactly as ``quant=int8`` does, so the two
share their cached stages.
"""
from __future__ import annotations

import dataclasses
from dataclasses import replace

from pipeline import gate
from pipeline.config import QuantMode
from pipeline.measure.results import BenchResult, Evaluation, Role, Timing
from pipeline.measure.seat import Seats, seen_from
from pipeline.metrics.outputs import Rule, agreement, required
from pipeline.recipes.auto_table import BatchLatency, Row, choose, why
from pipeline.runtimes import Target, cpu_supports
from pipeline.runtimes.plan import Plan, label

# how the table names each role's candidate
NAMES = {Role.fp32: "fp32", Role.candidate: "int8", Role.dynamic: "dynamic", Role.mixed: "mixed"}


def _drop_and_agreement(ev, ref, metric, gate) -> tuple[float, float]:
    """``metric``: the primary ``MetricSpec``; the drop is positive when ``ev`` is worse; the
    agreement is judged by the ``gate`` config's rule (``pipeline.metrics.outputs.Rule``)."""
    return (metric.drop(Evaluation.of(ref).metrics[metric.name],
                        Evaluation.of(ev).metrics[metric.name]),
            agreement(ev, ref, Rule.of(gate)))


def _row(name, role, target, lab, ev, ref, result: BenchResult, verdict, metric, gate) -> Row:
    """A timed (candidate, target): its accuracy against FP16, its latency per batch, its
    speedup at the gate's batch (``result``: the benchmark seen from its seat,
    ``pipeline.measure.seat``) and the gate's verdict on it."""
    gate_batch = gate.speedup_batch_size
    at = result.at(gate_batch) or Timing(None, None)
    latency = {str(b): BatchLatency(t.p50_ms, t.p99_ms)
               for b, t in result.batches.items() if t.label == lab}
    measured = {}
    if ev is not None:
        e = Evaluation.of(ev)
        drop, agree = _drop_and_agreement(ev, ref, metric, gate)
        measured = dict(metric=metric.name, accuracy=e.metric(metric.name), accuracy_drop=drop,
                        agreement_with_fp16=agree, output_sha256=e.output_sha256)
    gated = latency.get(str(gate_batch))
    return Row(name, role, str(target), lab, target.runtime, target.precision, verdict.passed,
               verdict.failed, [c.detail for c in verdict.checks if not c.passed], latency,
               at.overall, at.fastest_float, **measured,
               p50=None if gated is None else gated.p50)


def not_timed(hw, plan, evals: dict, roles: list, contenders: tuple, accurate) -> list[str]:
    """The benchmark labels ``quant=auto`` need not time: a candidate or contender on a runtime
    where its evaluation misses the accuracy budget (it cannot ship there: the table lists it
    as failing accuracy, untimed), and the FP16 model where it is no float baseline (nothing
    compares with it). Never the float baselines, nor the INT8 model on its own target, which
    is the benchmark's parent. In blocks across runtimes every round times each label 20 times,
    so each label left out shortens every round."""
    from pipeline.runtimes.plan import is_float_baseline

    out = []
    for role in [Role.candidate, *roles]:
        for target in plan.options:
            lab = label(hw, role, target)
            if is_float_baseline(role, target) or lab == Role.candidate:
                continue
            if role not in (Role.candidate, *contenders):
                out.append(lab)
                continue
            ev = plan.evaluation_of(evals, role, target)
            if ev is not None and not accurate(ev):
                out.append(lab)
    return list(dict.fromkeys(out))


def _untimed_row(name, role, target, lab, ev, ref, g, metrics, metric, floor: float) -> Row:
    """A table row for a candidate left untimed on a runtime where it misses the accuracy
    budget: its accuracy checks, as the gate names them, and no latency. ``floor``: the
    agreement it must reach (``pipeline.metrics.outputs.required``)."""
    from pipeline.metrics import limits as metric_limits

    drop, agree = _drop_and_agreement(ev, ref, metric, g)
    e, r = Evaluation.of(ev), Evaluation.of(ref)
    failed = [("accuracy_drop" if i == 0 else f"{j.metric}_drop") for i, j in enumerate(
        metric_limits.judged(r.metrics, e.metrics, g.max_accuracy_drop, metrics)) if not j.passed]
    if agree < floor:
        failed.append("output_agreement")
    if e.non_finite:  # NaN or inf outputs (gate.judge's finite_outputs)
        failed.append("finite_outputs")
    return Row(name, role, str(target), lab, target.runtime, target.precision, False, failed,
               ["not timed: it misses the accuracy budget on this runtime"], metric=metric.name,
               accuracy=e.metric(metric.name), accuracy_drop=drop, agreement_with_fp16=agree,
               output_sha256=e.output_sha256, timed=False)


def recipe(cfg, runner, run, splits, source, exported, fp32, fp16, pruning=None,
           unfused=None):
    """The ``quant=auto`` branch of ``pipeline.recipes.main.recipe``, from the float artifacts
    on: build every candidate, time them side by side, judge each (candidate, target) with the
    gate, and judge the winner as the shipped candidate."""
    from pipeline.gate.outcome import Outcome
    from pipeline.recipes.auto_result import AutoResult, Int8Trials

    a = _Auto(cfg, runner, run.task, splits, exported, fp32, fp16, unfused or exported)
    a.candidates()
    bench, untimed = a.time()
    table = a.judge_all(bench, untimed)
    winner = choose(table)
    final, final_evals, seat, verdict, summary = a.as_winner(bench, winner)
    infos = a.infos
    auto = AutoResult(winner, table, why(winner, table), a.notes,
                      [str(x) for x in a.plan.options], a.plan.unavailable, a.plan.failures,
                      cfg.gate.speedup_batch_size, Int8Trials.of(infos[Role.candidate]),
                      infos[Role.dynamic].dynamic_source if Role.dynamic in infos else None)
    return Outcome(run, final, final_evals, bench, verdict, source, None, infos.get(winner.role),
                   summary, pruning, auto=auto, seat=seat)


class _Auto:
    """One ``quant=auto`` run's state: the plan over every runtime here, the evaluations by
    role, the candidates built and why others were not."""

    def __init__(self, cfg, runner, t, splits, exported, fp32, fp16, source_for_dynamic):
        from pipeline.metrics.limits import limits
        from pipeline.stages.evaluate import Evaluate, baselines

        from pipeline.recipes.auto_result import Notes
        from pipeline.recipes.job import Int8Job

        self.cfg, self.runner, self.t, self.splits = cfg, runner, t, splits
        self.job = Int8Job.of(cfg, t, splits)  # each candidate: this job with its quant mode
        self.metric, self.g = t.metrics.primary_spec, cfg.gate
        # the primary's budget, in its scale
        self.budget = limits(self.g.max_accuracy_drop, t.metrics)[self.metric.name]
        self.hw = dataclasses.replace(cfg.hardware.target(), runtime="auto")  # every runtime here
        self.plan = Plan(self.hw, "auto")
        self.evaluate = Evaluate(data=splits.evaluation, batch_size=cfg.model.eval_batch_size,
                                 hardware=self.hw)
        self.evals = baselines(runner, self.plan, self.evaluate, t, exported, fp32, fp16)
        self.ref = self.evals[Role.fp16]
        # the agreement with FP16 every candidate must reach: the gate's, or FP32's own if less
        self.floor = required(self.g, self.evals.get(Role.fp32), self.ref)
        self.fp32, self.export = fp32, source_for_dynamic
        self.models = {Role.export: exported, Role.fp32: fp32, Role.fp16: fp16}
        self.infos, self.notes = {}, Notes()

    def build(self, mode, **changes):
        """A candidate as ``quant=<mode>`` builds it (its cached stages); every candidate is
        ranked against the float baselines here, so no float fallback inside."""
        from pipeline.recipes.int8 import int8 as int8_recipe

        return int8_recipe(self.job.with_quant(mode=mode, **changes), self.runner, self.fp32,
                           self.evals[Role.fp32], self.ref, guard=False, export=self.export)

    def accurate(self, ev) -> tuple[bool, float, float]:
        from pipeline.metrics.limits import within

        g, ref = self.g, self.ref
        drop, agree = _drop_and_agreement(ev, ref, self.metric, g)
        return (within(Evaluation.of(ref).metrics, Evaluation.of(ev).metrics,
                       g.max_accuracy_drop, self.t.metrics)
                and agree >= self.floor
                and not Evaluation.of(ev).non_finite), drop, agree

    def _evaluated(self, role: str, label_: str):
        from pipeline.stages.evaluate import against

        return self.runner.run(self.plan.evaluation(self.evaluate, role), self.models[role],
                               label=label_, **against(self.t, self.ref))

    def candidates(self) -> None:
        """Static INT8 (with the float-region search only when it can ship), dynamic INT8 where
        the graph has an op it quantizes, the mixed search only where static INT8 misses the
        budget; each evaluated on every target."""
        from pipeline.stages.evaluate import against

        cfg, t, notes = self.cfg, self.t, self.notes
        # INT8 first as quant=int8 builds it (its cached stages), and its accuracy: the
        # float-region search times whole blocks float for speed, which pays only for a model
        # that can ship. So it runs only when that model is within the accuracy budget;
        # otherwise the mixed candidate is the INT8 model that can pass, built as quant=mixed.
        regions = cfg.quant.region_trials
        self.models[Role.candidate], self.infos[Role.candidate] = self.build(QuantMode.int8,
                                                                       region_trials=0)
        first = self._evaluated(Role.candidate, "evaluate[int8]")
        if regions and cfg.quant.latency_aware:
            if self.accurate(first)[0]:
                self.models[Role.candidate], self.infos[Role.candidate] = self.build(QuantMode.int8)
            else:
                notes = replace(notes, regions=(
                    f"not tried (quant.region_trials={regions}): static INT8 misses the accuracy "
                    "budget, so no faster INT8 model could ship; the mixed candidate floats what "
                    "accuracy needs"))
        if dynamic_ops(cfg, t, self.fp32, self.export):
            # Dynamic INT8 quantizes the LSTM only: floating what profiles slower gives back FP32.
            self.models[Role.dynamic], self.infos[Role.dynamic] = self.build(
                QuantMode.dynamic, region_trials=0, latency_aware=False)
        else:  # it would quantize nothing: the FP32 model again, evaluated and timed again
            notes = replace(notes, dynamic=(
                "not built: the graph has no op dynamic INT8 quantizes (quant.dynamic_op_types: "
                f"{', '.join(dynamic_op_types(cfg, t))}), so it would be the FP32 model itself"))
        for role in (Role.candidate, Role.dynamic):
            if role in self.models:
                self.evals[role] = self._evaluated(role, f"evaluate[{NAMES[role]}]")
        passed, drop, _ = self.accurate(self.evals[Role.candidate])
        if not passed:
            self.models[Role.mixed], self.infos[Role.mixed] = self.build(
                QuantMode.mixed, max_accuracy_drop=self.budget, region_trials=0)
            self.evals[Role.mixed] = self._evaluated(Role.mixed, "evaluate[mixed]")
        else:
            notes = replace(notes, mixed=(
                f"not built: static INT8 is already within the accuracy budget (drop {drop:.2f} "
                f"<= {self.budget:g}), so the mixed search would return that same model"))
        self.notes = notes
        self.plan.evaluate_others(self.runner, self.evaluate, self.models,
                                  against(t, self.ref))

    def time(self):
        """One benchmark of every contender and the float baselines, side by side; what was
        left untimed (it misses the accuracy budget where it would run)."""
        from pipeline.stages.benchmark import Benchmark

        models, plan = self.models, self.plan
        contenders = tuple(r for r in (Role.fp32, Role.dynamic, Role.mixed) if r in models)
        # Timed: the contenders and the float baselines the gate compares with. The export is
        # an unoptimized copy of FP32 and FP16 ONNX runs emulated on a CPU without FP16
        # kernels, so neither can win or be the fastest float there; both are still evaluated.
        skip = {Role.candidate, Role.export} | (set() if cpu_supports("fp16") else {Role.fp16})
        refs = {r: a for r, a in models.items() if r not in skip}
        untimed = not_timed(self.hw, plan, self.evals, list(refs), contenders,
                            lambda ev: self.accurate(ev)[0])
        bench = self.runner.run(Benchmark(data=self.splits.evaluation,
                                          bench=self.cfg.bench.timing(), hardware=plan.hw,
                                          options=plan.bench_options(), contenders=contenders,
                                          untimed=tuple(sorted(untimed))),
                                models[Role.candidate], label="benchmark[auto]", **refs)
        plan.failures.update(Seats.of(bench).failures)
        return bench, untimed

    def judge_all(self, bench, untimed) -> list[Row]:
        """Each (candidate, target) judged by the gate as if it shipped: the table."""
        from pipeline.core.env import environment

        g, t, metric, hw, plan = self.g, self.t, self.metric, self.hw, self.plan
        env = environment(hw)
        table, self.verdicts, seats = [], {}, Seats.of(bench)
        for role in (Role.fp32, Role.candidate, Role.dynamic, Role.mixed):
            if role not in self.models:
                continue
            for target in plan.options:
                lab = label(hw, role, target)
                ev = plan.evaluation_of(self.evals, role, target)
                if lab in untimed:  # evaluated, missed the accuracy budget there: not timed
                    table.append(_untimed_row(NAMES[role], role, target, lab, ev, self.ref, g,
                                              t.metrics, metric, self.floor))
                    continue
                if lab not in seats.timed:
                    continue  # failed to load on that runtime: recorded in failures
                seat = seen_from(bench, lab)  # its own timings, nothing renamed
                # FP32 as the baselines evaluated it: its agreement with FP16 is the least any
                # row must keep (FP32 on another runtime included) where it is under the limit
                measures = gate.measures({Role.fp16: self.ref, role: ev}, seat, g,
                                         self.cfg.slo, self.models[role], role=role,
                                         float_eval=self.evals.get(Role.fp32))
                verdict = self.verdicts[lab] = gate.judge(measures, g, t.metrics, self.cfg.slo,
                                                          env)
                table.append(_row(NAMES[role], role, target, lab, ev, self.ref, seat, verdict,
                                  metric, g))
        return table

    def as_winner(self, bench, winner: Row):
        """The winner ships: (models, evaluations, seat, verdict, runtimes summary). Its verdict
        is the one the table gave it (the same judge, from the same seat of the same benchmark);
        the models and evaluations the report and the registry read hold it as the candidate,
        the seat names the label it was timed under, and the benchmark is the one timed."""
        g, t, plan, models, evals = self.g, self.t, self.plan, self.models, self.evals
        role, target = winner.role, Target(winner.runtime, winner.precision)
        floats = (Role.export, Role.fp32, Role.fp16)
        plan.allowed = [target]
        view, seat, summary, _ = plan.decide({**{r: evals[r] for r in floats}, role: evals[role]},
                                             bench, g, t.metrics, g.speedup_batch_size, role=role)
        return ({**{r: models[r] for r in floats}, Role.candidate: models[role]},
                {r: view[r] for r in (*floats, Role.candidate)}, seat,
                self.verdicts[winner.label], summary)


def dynamic_op_types(cfg, t) -> tuple:
    """The op types dynamic INT8 quantizes: ``quant.dynamic_op_types`` or the task's own."""
    q = cfg.quant
    return tuple(q.dynamic_op_types if q.dynamic_op_types is not None else t.dynamic_op_types)


def dynamic_ops(cfg, t, fp32, export=None) -> list[str]:
    """The nodes of the graphs dynamic INT8 would start from whose op it quantizes. None (a CNN
    without an LSTM): the dynamic candidate would be the FP32 model again, built, evaluated on
    every target and timed for nothing."""
    import onnx

    types = set(dynamic_op_types(cfg, t))
    found = []
    for art in (fp32, export):
        path = getattr(art, "model", None)
        if path is not None:
            graph = onnx.load(str(path), load_external_data=False).graph
            found += [n.name for n in graph.node if n.op_type in types]
    return found


def float_hint(verdict, evals: dict, bench, plan, gate_cfg, metric) -> None:
    """``quant=int8`` (or dynamic, mixed) failed its speed check: say, in the verdict, which float
    artifact and runtime would pass and that ``quant=auto`` publishes it. Never changes the
    outcome: a model slower than its float baseline is not shipped."""
    if "speedup_ci_low" not in verdict.failed:
        return
    at = BenchResult.of(bench).at(gate_cfg.speedup_batch_size)
    lab = at.fastest_float if at is not None else None
    where = Seats.of(bench).timed.get(lab)
    if not lab or not where:
        return
    role, target = where.role, Target(where.runtime, where.precision)
    ev = plan.evaluation_of(evals, role, target)
    if ev is None:
        return
    from pipeline.metrics.limits import primary, within

    metrics, metric = metric, primary(metric)
    drop, agree = _drop_and_agreement(ev, evals[Role.fp16], metric, gate_cfg)
    floor = required(gate_cfg, evals.get(Role.fp32), evals[Role.fp16])
    ok = (within(Evaluation.of(evals[Role.fp16]).metrics, Evaluation.of(ev).metrics,
                 gate_cfg.max_accuracy_drop, metrics) and agree >= floor)
    title = {Role.fp32: "the optimized FP32 model", Role.fp16: "the FP16 model"}.get(role, role)
    p50 = at.latencies[lab].p50
    if ok:
        hint = (f"{title} on {target} would pass (p50 {p50:.2f} ms at batch "
                f"{gate_cfg.speedup_batch_size}, drop {drop:{'.2f' if metric.unit == '%' else '.4f'}} "
                f"{'points' if metric.unit == '%' else metric.scale}): the same command with "
                "`quant=auto` publishes the fastest artifact that passes every gate")
    else:
        hint = (f"the fastest float baseline, {title} on {target}, misses the accuracy gate too "
                f"(drop {drop:.2f}, agreement {agree:.2%}); `quant=auto` compares every candidate")
    verdict.add_hint(hint)


def accuracy_hint(verdict, mode: QuantMode, op_types: tuple) -> None:
    """``quant=int8`` (static) failed an accuracy check: say, in the verdict, what can hold the
    accuracy. ``op_types``: the op types dynamic INT8 quantizes for this model. Where they
    include the matrix products (a transformer encoder), dynamic INT8, whose activation scales
    are taken on each call: a pretrained encoder's outlier activations (all-mpnet-base-v2: a
    GELU output in [-0.17, 100]) break one calibrated scale per tensor. Elsewhere the mixed
    search, which keeps the most harmful nodes float. Never changes the outcome."""
    if mode != QuantMode.int8 or not any(c.endswith("_drop") for c in verdict.failed):
        return
    if {"MatMul", "Gemm"} & set(op_types):
        hint = ("static INT8 misses the accuracy limit: dynamic INT8 (`quant=dynamic`) takes "
                "activation scales on each call, which outlier activations need; the same command "
                "with `quant=auto` builds it beside the mixed search and the float models and "
                "publishes the fastest that passes")
    else:
        hint = ("static INT8 misses the accuracy limit: `quant=mixed` keeps the most harmful "
                "nodes float under the budget; the same command with `quant=auto` builds it "
                "beside the float models and publishes the fastest that passes")
    verdict.add_hint(hint)
