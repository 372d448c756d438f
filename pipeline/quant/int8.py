"""The INT8 sub-recipe: calibrate, quantize, explain, keep float what got slower, search a mix.

In: the config, the runner, the optimized FP32 artifact and the evaluations of the float
baselines (FP32 for the ranking subset of hardest samples, FP16 as the accuracy reference).
Out: the candidate artifact and a ``QuantInfo`` record for the report: hardware-aware settings,
the calibration chosen (and, with ``auto``, how each method scored), the explanation of the
final model (profile, unfused Q/DQ, float ops), per-node sensitivity and the mixed-precision
search trace. Every step is a cached stage, so a re-run with a changed budget repeats only the
evaluations it needs.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.quant import defaults as quant_defaults
from pipeline.config import CalibrationMethod, QuantMode
from pipeline.env import effective_flags
from pipeline.errors import ConfigError
from pipeline.stages.calibrate import Calibrate
from pipeline.stages.compare import Compare
from pipeline.stages.evaluate import Evaluate, hardest
from pipeline.stages.explain import Explain
from pipeline.stages.prepare import Prepare
from pipeline.stages.quantize import Quantize

METHODS = ("minmax", "entropy", "percentile")
WEIGHTED_OPS = ("Conv", "ConvTranspose", "MatMul", "Gemm", "LSTM", "GRU", "RNN")


@dataclass
class QuantInfo:
    settings: dict
    calibration: str
    calibration_ranking: dict = field(default_factory=dict)   # method -> ranking-subset metric
    explain: dict | None = None
    latency_exclusions: list = field(default_factory=list)
    latency_trial: dict | None = None    # the float-fallback trial and its end-to-end timing
    regions: dict | None = None          # float regions tried end to end (quant.region_trials)
    float_outputs: list = field(default_factory=list)  # output nodes left float: no 8-bit logits
    sensitivity: list = field(default_factory=list)
    search: dict | None = None


def output_nodes(model) -> dict[str, str]:
    """The nodes that produce a graph output: name -> op type."""
    import onnx

    graph = onnx.load(str(model), load_external_data=False).graph
    outs = {o.name for o in graph.output}
    return {n.name: n.op_type for n in graph.node if any(o in outs for o in n.output)}


def check_exclude(exclude, model, name: str) -> None:
    """Every ``quant.exclude`` name must be a node of the model the quantizer sees: onnxruntime
    ignores an unknown name silently, and any exclusion switches QDQ propagation off. Checked as
    soon as that graph exists, before anything is quantized."""
    import onnx

    if not exclude:
        return
    names = [n.name for n in onnx.load(str(model), load_external_data=False).graph.node]
    unknown = [n for n in exclude if n not in names]
    if unknown:
        modules = [n for n in names if not n.startswith("node_")]  # the exporter's own names
        raise ConfigError(f"quant.exclude={list(exclude)}: {unknown[0]!r} is not a node of "
                          f"model={name}; valid names: {', '.join(modules)}")


class Quantizer:
    def __init__(self, cfg, runner, fp32, fp32_eval, fp16_eval, t, evaluation, calibration):
        """``t``: the task (its primary metric, its default dynamic op types); ``evaluation``:
        the evaluation ``DataSplit``; ``calibration``: a function giving the calibration split
        (built only when a method needs it)."""
        self.cfg, self.runner, self.fp32 = cfg, runner, fp32
        self.fp16_eval, self.metric = fp16_eval, t.metrics.primary_spec
        self.evaluation, self._calibration_split = evaluation, calibration
        m, q = cfg.model, cfg.quant
        self.dynamic_op_types = tuple(q.dynamic_op_types if q.dynamic_op_types is not None
                                      else t.dynamic_op_types)
        self.hw = cfg.hardware.target()
        self.settings = quant_defaults.resolve(q, effective_flags())
        self.prepared = runner.run(Prepare(), fp32)
        check_exclude(q.exclude, self.prepared.model, m.name)
        self.subset = hardest(fp32_eval, min(q.ranking_samples, evaluation.count))
        self.static = None if q.mode != QuantMode.dynamic else ()
        if q.static_op_types is not None:
            self.static = tuple(q.static_op_types)
        self.calibrations: dict = {}

    # -- building blocks -------------------------------------------------------------------
    def calibration(self, method: str):
        if method not in self.calibrations:
            q = self.cfg.quant
            self.calibrations[method] = self.runner.run(
                Calibrate(self._calibration_split(), method, q.calibration_batch_size),
                self.prepared, label=f"calibrate[{method}]")
        return self.calibrations[method]

    def quantize(self, method: str, exclude=(), label="quantize"):
        q = self.cfg.quant
        stage = Quantize(tuple(sorted(self.settings.items())), q.per_channel, method,
                         self.static, self.dynamic_op_types, tuple(sorted(exclude)))
        if self.static == ():  # dynamic only: nothing to calibrate
            return self.runner.run(stage, self.prepared, label=label)
        return self.runner.run(stage, self.prepared, label=label,
                               calibration=self.calibration(method))

    def score(self, art, label: str, subset=True) -> float:
        m = self.cfg.model
        ev = self.runner.run(Evaluate(self.evaluation, m.eval_batch_size, self.hw,
                                      self.subset if subset else ()), art, label=label)
        return ev.meta["metrics"][self.metric.name]

    def explain(self, art, label="explain"):
        q = self.cfg.quant
        return self.runner.run(Explain(self.evaluation, self.cfg.gate.speedup_batch_size,
                                       q.profile_runs, self.hw), art,
                               label=label, fp32=self.fp32)

    # -- the recipe --------------------------------------------------------------------------
    def run(self):
        q = self.cfg.quant
        info = QuantInfo(settings=self.settings, calibration=q.calibration.value)
        method = q.calibration.value
        if self.static == ():
            method = "none (dynamic)"
        elif q.calibration == CalibrationMethod.auto:
            for candidate_method in METHODS:
                art = self.quantize(candidate_method, q.exclude, label=f"quantize[{candidate_method}]")
                info.calibration_ranking[candidate_method] = self.score(
                    art, f"rank[{candidate_method}]")
            # Best on the hardest lines; ties go to the cheaper, simpler method (list order).
            best = self.metric.higher_is_better
            method = max(METHODS, key=lambda k: ((1 if best else -1) * info.calibration_ranking[k],
                                                 -METHODS.index(k)))
        info.calibration = method
        exclude = set(q.exclude)
        art = self.quantize(method, exclude)
        expl = self.explain(art)
        if q.latency_aware and expl.meta["slower_in_int8"]:
            # Nodes whose INT8 kernel lost to float on this machine: try them float, and keep
            # that model only if it is faster end to end (a float node adds a Q/DQ boundary
            # its own profile does not show).
            slower = list(expl.meta["slower_in_int8"])
            trial = self.quantize(method, exclude | set(slower), label="quantize[latency-aware]")
            floated = [n for n in slower if trial.meta["precision"].get(n) == "float"]
            info.latency_trial = {"float_nodes": floated, "stayed_int8": trial.meta["exclusion_ignored"],
                                  "speedup_over_all_int8": None}
            if floated and not q.region_trials:  # with regions: judged below, side by side
                # No longer than the benchmark itself may time a batch size (a quick run's short
                # bench.max_seconds); at the defaults this is the stage's own budget and key.
                bench = self.cfg.bench
                verdict = self.runner.run(
                    Compare(self.evaluation, self.cfg.gate.speedup_batch_size, self.hw,
                            min_rounds=min(Compare.min_rounds, bench.min_rounds),
                            max_seconds=min(Compare.max_seconds, bench.max_seconds)),
                    trial, label="compare[latency-aware]", other=art).meta["a_over_b_speedup"]
                info.latency_trial["speedup_over_all_int8"] = verdict
                if verdict["ci95"][0] > 1.0:
                    info.latency_exclusions = floated
                    exclude |= set(floated)
                    art = trial
                    expl = self.explain(art, label="explain[latency-aware]")
        if q.region_trials and q.latency_aware:
            # Whole blocks float, timed end to end together with the node trial above, which
            # cannot see the Q/DQ borders its float nodes add (pipeline/quant/regions.py).
            from pipeline.quant import regions

            nodes = (trial, floated) if info.latency_trial and info.latency_trial["float_nodes"] else None
            art, kept, info.regions = regions.search(self, method, exclude, art, expl.meta, nodes)
            if nodes:
                info.latency_trial["speedup_over_all_int8"] = info.regions["node_trial"]
            if kept:
                info.latency_exclusions = kept
                exclude |= set(kept)
                expl = self.explain(art, label="explain[regions]")
        # The model's outputs stay float where INT8 buys next to nothing: the quantizer puts a
        # Q/DQ pair on every output, which rounds the logits to 8 bits. A node without weights
        # (the head's bias Add: a QLinearAdd 0.003 ms faster at batch 8) stays float; leaving it
        # so took the OCR model's drop against FP16 from 0.05 points to 0.00. A weighted output
        # node keeps its INT8 kernel; the mixed search may still float it for accuracy.
        cheap = sorted(n for n, op in output_nodes(self.prepared.model).items()
                       if n not in exclude and op not in WEIGHTED_OPS)
        if cheap:
            trial = self.quantize(method, exclude | set(cheap), label="quantize[float outputs]")
            kept = [n for n in cheap if trial.meta["precision"].get(n) == "float"]
            if kept:
                info.float_outputs = kept
                exclude |= set(kept)
                art = trial
                expl = self.explain(art, label="explain[float outputs]")
        if q.mode == QuantMode.mixed:
            from pipeline.quant.mixed import search

            art, info.sensitivity, info.search = search(self, method, exclude, art)
            expl = self.explain(art, label="explain[mixed]")
        info.explain = expl.meta
        if not info.sensitivity:  # the per-layer table still gets each node's output SQNR
            from pipeline.stages.sqnr import Sqnr

            sqnr = self.runner.run(Sqnr(self.evaluation, self.subset, self.hw), art,
                                   fp32=self.fp32).meta["sqnr_db"]
            info.sensitivity = [{"node": n, "sqnr_db": v} for n, v in sqnr.items()]
        return art, info
