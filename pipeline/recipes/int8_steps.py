"""The INT8 building blocks the sub-recipe's steps (``pipeline.recipes.int8``) share.

In: the config, the runner, the optimized FP32 artifact and the evaluations of the float
baselines (FP32 for the ranking subset of hardest samples, FP16 as the accuracy reference).
Out: a ``Quantizer`` that prepares the model once and then quantizes (with a calibration per
method, cached), scores on the ranking subset or the whole set, and explains; the ``QuantInfo``
record the steps fill for the report; and the checks on ``quant.exclude`` and the output nodes.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.quant import defaults as quant_defaults
from pipeline.quant.defaults import Int8Settings
from pipeline.config import QuantMode
from pipeline.core.env import effective_flags
from pipeline.core.errors import ConfigError
from pipeline.stages.calibrate import Calibrate
from pipeline.stages.evaluate import Evaluate, against, hardest
from pipeline.stages.explain import Explain
from pipeline.stages.prepare import Prepare
from pipeline.stages.quantize import Quantize



@dataclass
class QuantInfo:
    settings: Int8Settings
    calibration: str
    calibration_ranking: dict = field(default_factory=dict)   # method -> ranking-subset metric
    smoothing: dict | None = None        # SmoothQuant-style migration: each alpha's score, the pick
    explain: dict | None = None
    latency_exclusions: list = field(default_factory=list)
    latency_trial: dict | None = None    # the float-fallback trial and its end-to-end timing
    regions: dict | None = None          # float regions tried end to end (quant.region_trials)
    float_outputs: list = field(default_factory=list)  # output nodes left float: no 8-bit logits
    sensitivity: list = field(default_factory=list)
    search: dict | None = None
    versus_fp32: dict | None = None      # the final INT8 model against FP32 per batch size; when
    #                                      slower somewhere, the candidate is the FP32 model
    dynamic_source: dict | None = None   # dynamic INT8 of a fused transformer: which graph it
    #                                      quantized (fused or export) and, when both, their timings


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
    """What every INT8 step shares: the prepared model, the settings from the CPU's flags, the
    ranking subset, and the calls that quantize, score and explain (calibrations cached per
    method). The steps themselves are ``pipeline.recipes.int8``."""

    def __init__(self, job, runner, fp32, fp32_eval, fp16_eval):
        """``job``: the ``Int8Job`` (``pipeline.recipes.job``): the quant, bench and gate
        settings, the task (its primary metric, its default dynamic op types), the evaluation
        split and a function giving the calibration split (built only when a method needs it)."""
        t, evaluation, calibration = job.task, job.evaluation, job.calibration
        self.job, self.runner, self.fp32 = job, runner, fp32
        self.fp16_eval, self.metric = fp16_eval, t.metrics.primary_spec
        self.against = against(t, fp16_eval)  # a label-free run: scored against FP16's outputs
        self.evaluation, self._calibration_split = evaluation, calibration
        q = job.quant
        self.dynamic_op_types = tuple(q.dynamic_op_types if q.dynamic_op_types is not None
                                      else t.dynamic_op_types)
        self.hw = job.hw
        self.settings = quant_defaults.resolve(q, effective_flags())
        self.static = None if q.mode != QuantMode.dynamic else ()
        if q.static_op_types is not None:
            self.static = tuple(q.static_op_types)
        # Dynamic INT8 alone calibrates nothing, so it needs none of quant_pre_process's shape
        # inference, and its rewrites cost speed: on all-mpnet-base-v2's export (batch 8, one
        # process, AMX) the same quantize_dynamic call ran 0.89x as fast from the prepared graph
        # as from the graph itself, 0.92x with shape inference alone.
        self.prepared = fp32 if self.static == () else runner.run(Prepare(), fp32)
        check_exclude(q.exclude, self.prepared.model, job.model_name)
        self.subset = hardest(fp32_eval, min(q.ranking_samples, evaluation.count))
        self.calibrations: dict = {}
        self.tag = ""  # which smoothed model the calibrations are of (their labels)
        self.smooth_alphas = tuple(q.smooth_alphas if q.smooth_alphas is not None
                                   else getattr(t, "smooth_alphas", ()))

    def use(self, prepared, tag: str = "") -> None:
        """Quantize from ``prepared`` from now on (a smoothed model): its own calibrations,
        labelled with ``tag``."""
        self.prepared, self.calibrations, self.tag = prepared, {}, tag

    def calibration(self, method: str):
        if method not in self.calibrations:
            q = self.job.quant
            self.calibrations[method] = self.runner.run(
                Calibrate(self._calibration_split(), method, q.calibration_batch_size),
                self.prepared, label=f"calibrate[{method}{', ' + self.tag if self.tag else ''}]")
        return self.calibrations[method]

    def quantize(self, method: str, exclude=(), label="quantize"):
        q = self.job.quant
        stage = Quantize(self.settings, q.per_channel, method,
                         self.static, self.dynamic_op_types, tuple(sorted(exclude)))
        if self.static == ():  # dynamic only: nothing to calibrate
            return self.runner.run(stage, self.prepared, label=label)
        return self.runner.run(stage, self.prepared, label=label,
                               calibration=self.calibration(method))

    def edit(self, art, nodes, label="edit"):
        """``art`` (a static INT8 model) with ``nodes`` float, by editing its QDQ graph: no
        re-quantization (``stages/float_nodes.py``)."""
        from pipeline.stages.float_nodes import FloatNodes

        return self.runner.run(FloatNodes(tuple(sorted(nodes)), self.static), art, label=label,
                               prepared=self.prepared)

    def score(self, art, label: str, subset=True) -> float:
        ev = self.runner.run(Evaluate(self.evaluation, self.job.eval_batch_size, self.hw,
                                      self.subset if subset else ()), art, label=label,
                               **self.against)
        return ev.meta["metrics"][self.metric.name]

    def explain(self, art, label="explain"):
        q = self.job.quant
        return self.runner.run(Explain(self.evaluation, self.job.gate.speedup_batch_size,
                                       q.profile_runs, self.hw), art,
                               label=label, fp32=self.fp32)
