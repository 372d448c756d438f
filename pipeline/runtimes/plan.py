"""Which model runs on which (runtime, precision), and, with ``runtime=auto``, which one ships.

In: the stages' target (``hardware.target()``), the quant mode, the evaluate and benchmark
artifacts. Out: the targets each role is evaluated and timed on, the labels its timings carry in
``latency.json`` (the plain role name for its home target, ``"<role> @ <runtime> <precision>"``
for the others), and after the benchmark a decision: per batch size the fastest candidate target
whose accuracy, measured on that target, passes the accuracy gate against the FP16 baseline; the
evaluations as the gate and the report read them (``candidate``: the shipped model's on the
chosen target), the seat its timings are read from (its benchmark label per batch size: the
benchmark itself is not copied or renamed); and its record for the report and manifest
(``runtimes.record.RuntimePlan``) with one cell per artifact and target, and each runtime's
failure on its own line.

With a fixed runtime R and precision P, the candidate runs on (R, P) and the float baselines on
(R, fp32); the FP32 model is also timed on ONNX Runtime when R is another engine, so a runtime
switch can never ship something slower than the project's default float baseline. Baselines run
in fp32 because they are references: a bf16 compile of the FP32 model is a candidate, not a
baseline. ``quant=bf16`` is the FP32 model with P = bf16.
"""
from __future__ import annotations

import dataclasses

from pipeline.core.errors import StageError
from pipeline.runtimes import PRIMARY, Target, settings_for, targets
from pipeline.runtimes.record import Cell, Choice, Deployed, RuntimePlan, TargetRow

FLOAT_ROLES = ("fp32", "fp16")


def home(hw, role: str) -> Target:
    """The target whose timings and evaluation carry the plain role name."""
    if hw.runtime == "auto":
        return PRIMARY
    return Target(hw.runtime, hw.precision if role == "candidate" else "fp32")


def label(hw, role: str, target: Target) -> str:
    return role if target == home(hw, role) else f"{role} @ {target}"


def timed(hw, options, roles, aa_label: str) -> dict[str, tuple[str, Target]]:
    """label -> (role, target) for every model the benchmark times, the A/A copy included."""
    extra = [Target(*o) for o in options]
    out = {}
    for role in roles:
        ts = [home(hw, role)]
        if hw.runtime == "auto":
            ts += [t for t in extra if t != PRIMARY]
        elif role == "fp32" and hw.runtime != PRIMARY.runtime:
            ts.append(PRIMARY)
        for t in ts:
            out[label(hw, role, t)] = (role, t)
    out[aa_label] = ("fp32", home(hw, "fp32"))
    return out


def is_float_baseline(role: str, target: Target) -> bool:
    return role in FLOAT_ROLES and target.precision == "fp32"


class Plan:
    def __init__(self, hw, quant_mode: str, flags=None):
        quant_mode = getattr(quant_mode, "value", quant_mode)
        self.auto = hw.runtime == "auto"
        if quant_mode == "bf16" and not self.auto:
            hw = dataclasses.replace(hw, precision="bf16")
        self.hw = hw
        if self.auto:
            self.options, self.unavailable = targets(flags)
            self.allowed = [t for t in self.options
                            if quant_mode != "bf16" or t.precision == "bf16"]
            if not self.allowed:
                raise StageError(f"runtime=auto: no target can run quant={quant_mode} here "
                                 f"({'; '.join(f'{k}: {v}' for k, v in self.unavailable.items())})")
        else:
            self.options, self.unavailable = [], {}
            self.allowed = [home(hw, "candidate")]
        self.failures: dict[str, str] = {}
        self.extra: dict[tuple[str, Target], object] = {}  # (role, target) -> evaluate artifact

    # -- before the benchmark ------------------------------------------------------------------
    def evaluation(self, evaluate, role: str):
        """The Evaluate stage for a role on its home target."""
        return dataclasses.replace(evaluate, hardware=settings_for(self.hw, home(self.hw, role)))

    def evaluate_others(self, runner, evaluate, models: dict, refs: dict | None = None) -> None:
        """auto: every artifact on every other target; a failing one is recorded, not fatal.
        ``refs``: what every evaluation takes (a label-free run's FP16 baseline)."""
        for t in self.options:
            for role, art in models.items():
                if t == home(self.hw, role):
                    continue
                stage = dataclasses.replace(evaluate, hardware=settings_for(self.hw, t))
                try:
                    self.extra[(role, t)] = runner.run(stage, art, label=f"evaluate[{role} @ {t}]",
                                                       **(refs or {}))
                except StageError as e:
                    self.failures[f"{role} @ {t}"] = str(e)

    def bench_options(self) -> tuple:
        return tuple((t.runtime, t.precision) for t in self.options) if self.auto else ()

    # -- after the benchmark -------------------------------------------------------------------
    def evaluation_of(self, evals: dict, role: str, t: Target):
        return evals.get(role) if t == home(self.hw, role) else self.extra.get((role, t))

    def decide(self, evals: dict, bench, gate, metric, gate_batch: int, role: str = "candidate"):
        """(evals view, seat, ``RuntimePlan`` record, deployed settings). ``role``: the model
        that ships (quant=auto: the winner's role), whose targets are weighed; the evals view
        holds its evaluation on the chosen target as the candidate's, and the seat is the
        benchmark label it was timed under per batch size (``pipeline.measure.seat``): the
        benchmark itself is not copied or renamed. ``metric``: the task's ``MetricsSpec`` (or its
        primary ``MetricSpec``): every metric the gate judges must hold for a target to pass on
        accuracy. The record names the shipped model ``candidate``, as reports always have."""
        from pipeline.metrics import limits
        from pipeline.metrics.outputs import Rule, agreement, required

        metrics, metric = metric, limits.primary(metric)
        rule = Rule.of(gate)
        batches = bench.meta["batches"]
        self.failures.update(bench.meta.get("failures", {}))
        ref = evals["fp16"]
        ref_acc = ref.meta["metrics"][metric.name]
        floor = required(gate, evals.get("fp32"), ref)
        choice, seat = {}, {}
        for b, at in batches.items():
            rows = []
            for t in self.allowed:
                lab, ev = label(self.hw, role, t), self.evaluation_of(evals, role, t)
                lat = at["latency_ms"].get(lab)
                if ev is None or lat is None:
                    continue
                acc = ev.meta["metrics"][metric.name]
                agree = agreement(ev, ref, rule)
                rows.append(TargetRow(
                    target=str(t), runtime=t.runtime, precision=t.precision,
                    label=label(self.hw, "candidate", t), accuracy_drop=metric.drop(ref_acc, acc),
                    agreement_with_fp16=agree, p50=lat["p50"], p99=lat["p99"],
                    passes_accuracy=(limits.within(ref.meta["metrics"], ev.meta["metrics"],
                                                   gate.max_accuracy_drop, metrics)
                                     and agree >= floor),
                    speedup_vs_fastest_float=at.get("speedup_vs_fastest_float_by_label",
                                                    {}).get(lab),
                    metrics={metric.name: acc}))
            if not rows:
                raise StageError(f"batch {b}: no candidate target was both evaluated and timed "
                                 f"({'; '.join(self.failures.values()) or 'nothing ran'})")
            passing = [r for r in rows if r.passes_accuracy]
            # None passes: the most accurate ships to the gate, which then fails it visibly.
            pick = min(passing, key=lambda r: r.p50) if passing else \
                min(rows, key=lambda r: (r.accuracy_drop, r.p50))
            choice[b] = Choice.of(pick, rows)
            seat[b] = label(self.hw, role, pick.target_of())
        deployed = (choice.get(str(gate_batch)) or next(iter(choice.values()))).target_of()
        summary = self._summary(evals, bench, choice, deployed, role)
        view = {**evals, "candidate": self.evaluation_of(evals, role, deployed)}
        return view, seat, summary, settings_for(self.hw, deployed)

    def _summary(self, evals, bench, choice: dict, deployed: Target, shipped: str) -> RuntimePlan:
        columns = list(self.options) if self.auto else sorted(
            {t for _, t in timed(self.hw, (), ("export", "fp32", "fp16", "candidate"), "").values()})
        cells: dict = {}
        raw = bench.meta["batches"]
        for name in ("export", "fp32", "fp16", "candidate"):
            role = shipped if name == "candidate" else name  # the shipped model's own labels
            for t in columns:
                lab = label(self.hw, role, t)
                ev = self.evaluation_of(evals, role, t)
                lat = {b: {k: at["latency_ms"][lab][k] for k in ("p50", "p99")}
                       for b, at in raw.items() if lab in at.get("latency_ms", {})}
                error = next((self.failures[k] for k in (lab, f"{role} @ {t}")
                              if k in self.failures), None)
                if ev is None and not lat and error is None:
                    continue
                cells.setdefault(name, {})[str(t)] = Cell(
                    output_sha256=ev.meta.get("output_sha256") if ev else None,
                    executed=(ev.meta.get("runtime") or {}).get("executed") if ev else None,
                    latency_ms=lat or None, error=error,
                    metrics=dict(ev.meta["metrics"]) if ev else {})
        dev = self.evaluation_of(evals, shipped, deployed).meta.get("runtime") or {}
        return RuntimePlan(
            mode="auto" if self.auto else "fixed", targets=tuple(str(t) for t in columns),
            unavailable=dict(self.unavailable), failures=dict(self.failures), cells=cells,
            choice=choice,
            deployed=Deployed(runtime=deployed.runtime, precision=deployed.precision,
                              performance_hint=self.hw.performance_hint,
                              intra_op_threads=self.hw.intra_op_threads,
                              inter_op_threads=self.hw.inter_op_threads,
                              version=dev.get("version"), settings=dev.get("settings"),
                              compiled=dev.get("compiled"), executed=dev.get("executed")))
