"""The INT8 sub-recipe, one step after another: calibrate, quantize and explain, keep float what
got slower, float whole regions, float outputs, search a mix, per-node sensitivity, and float
altogether when the result is still slower than FP32. Dynamic INT8 of a fused transformer runs
these steps on the fused graph and on the unfused export and keeps the faster of the two, timed
head to head.

In: an ``Int8Job`` (``pipeline.recipes.job``: the quant, bench and gate settings, the task and
its splits), the runner, the optimized FP32 artifact and the evaluations of the float baselines
(FP32 for the ranking subset of hardest samples, FP16 as the accuracy reference). Out: the
candidate artifact and a ``QuantInfo`` record for the report (``pipeline.quant.int8_info``):
hardware-aware settings, the calibration chosen (and, with ``auto``, how each method scored),
the explanation of the final model (profile, unfused Q/DQ, float ops), per-node sensitivity and
the mixed-precision search trace.

Read it top to bottom: ``int8`` picks the source graphs, ``steps`` lists the steps in order, and
each step follows in that order. A step takes the current model (``Current``: the artifact, its
explanation, the nodes kept float) and returns it, changed only when its trial earned it. What
every step uses to act (quantize with a cached calibration per method, edit a QDQ graph, score
on the ranking subset or the whole set, explain) is the ``Quantizer`` at the end, built once per
source graph. Every trial is a cached stage, so a re-run with a changed budget repeats only the
evaluations it needs. The mixed search and the float-region search are modules of their own
(``pipeline.recipes.mixed``, ``pipeline.recipes.regions``).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from pipeline.config import CalibrationMethod, DynamicSource, QuantMode
from pipeline.core.env import effective_flags
from pipeline.core.errors import ConfigError
from pipeline.measure.comparison import Comparison
from pipeline.measure.results import Evaluation, Speedup
from pipeline.quant import defaults as quant_defaults
from pipeline.quant.calibration import DYNAMIC, METHODS
from pipeline.quant.explanation import Explanation
from pipeline.quant.int8_info import (DynamicSourceChoice, NodeSqnr, NodeTrial, QuantInfo,
                                      Smoothing, SourceTimes, VersusFp32)
from pipeline.quant.quantized import Quantized
from pipeline.runtimes.ops import WEIGHTED_OPS
from pipeline.stages.calibrate import Calibrate
from pipeline.stages.compare import Compare
from pipeline.stages.evaluate import Evaluate, against, hardest
from pipeline.stages.explain import Explain
from pipeline.stages.prepare import Prepare
from pipeline.stages.quantize import Quantize


def int8(job, runner, fp32, fp32_eval, fp16_eval, guard: bool = True, export=None) -> tuple:
    """(candidate artifact, QuantInfo) for quant=int8, dynamic or mixed. ``guard=False`` keeps
    the INT8 model even when it is slower than FP32 (``quant=auto`` ranks it against the float
    models itself). ``export``: the unfused export of a transformer whose fusions made ``fp32``;
    dynamic INT8 then quantizes the graph ``quant.dynamic_source`` names, or (``auto``) both,
    the faster kept."""
    sources = dynamic_sources(job, fp32, export)
    built = {name: steps(Quantizer(job, runner, src, fp32_eval, fp16_eval))
             for name, src in sources.items()}
    chosen, record = next(iter(built)), None
    if len(built) > 1:
        chosen, record = race(job, built)
    qz, art, info = built[chosen]
    if export is not None and job.quant.mode == QuantMode.dynamic and fp32.stage == "fuse":
        q = job.quant
        info.source = record or DynamicSourceChoice(
            chosen=chosen.value, forced=None if q.dynamic_source == DynamicSource.auto
            else q.dynamic_source.value,
            why=("the fusions left the export as it was" if _same_graph(export, fp32) else
                 f"quant.dynamic_source={q.dynamic_source.value}"
                 if q.dynamic_source != DynamicSource.auto else
                 "quant.exclude names the fused graph's nodes"))
    return (not_slower_than_fp32(qz, art, info, fp32) if guard else art), info


def steps(qz: Quantizer) -> tuple:
    """The sub-recipe on one source graph: (quantizer, INT8 artifact, QuantInfo)."""
    info = QuantInfo(settings=qz.settings, calibration=qz.job.quant.calibration.value)
    info.smoothing = smoothing(qz)
    method = calibration(qz, info)
    info.calibration = "none (dynamic)" if method == DYNAMIC else method  # what the report says
    cur = quantize(qz, method)
    cur = float_fallback(qz, method, cur, info)
    cur = float_regions(qz, method, cur, info)
    cur = float_outputs(qz, method, cur, info)
    cur = mixed_search(qz, method, cur, info)
    info.explain = cur.explain
    if not info.sensitivity:  # the per-layer table still gets each node's output SQNR
        info.sensitivity = sensitivity(qz, cur.art)
    return qz, cur.art, info


def dynamic_sources(job, fp32, export) -> dict:
    """The graphs dynamic INT8 starts from, by name. Fusions that pay in FP32 need not pay once
    quantized: on all-mpnet-base-v2 (attention not fused, so the fused FP32 graph was no faster
    than the export) the same dynamic INT8 with smoothing ran 1.19x faster from the unfused
    export than from the fused graph at batch 8, at the same accuracy (mean cosine 0.9921 vs
    0.9924 against FP32). Static INT8, a model without transformer fusions (the OCR models'
    ``optimize``) and a graph the fusions left as it was keep one source; so does
    ``quant.exclude`` under ``auto``, its names being the fused graph's."""
    q = job.quant
    if (export is None or q.mode != QuantMode.dynamic or fp32.stage != "fuse"
            or _same_graph(export, fp32)):
        return {DynamicSource.fused: fp32}
    if q.dynamic_source == DynamicSource.export:
        return {DynamicSource.export: export}
    if q.dynamic_source == DynamicSource.fused or q.exclude:
        return {DynamicSource.fused: fp32}
    return {DynamicSource.fused: fp32, DynamicSource.export: export}


def _same_graph(a, b) -> bool:
    return a.files.get("model.onnx") == b.files.get("model.onnx")


def pick_source(speedup: Speedup) -> str:
    """``speedup``: the export's INT8 over the fused graph's (t_fused / t_export, median and
    95 % interval). The export only when its whole interval is above 1; equal or slower: the
    fused graph, as before the choice existed."""
    return DynamicSource.export.value if speedup.low > 1.0 else DynamicSource.fused.value


def race(job, built: dict) -> tuple[DynamicSource, DynamicSourceChoice]:
    """Both dynamic candidates timed head to head at the gate's batch size, on the target's
    runtime (the ``compare`` stage, as the latency-aware step): (chosen source, the record)."""
    qz = built[DynamicSource.fused][0]
    b = job.gate.speedup_batch_size
    cmp = Comparison.of(qz.runner.run(
        _compare(qz, job.bench, b), built[DynamicSource.export][1],
        label="compare[dynamic: export vs fused]", other=built[DynamicSource.fused][1]))
    chosen = DynamicSource(pick_source(cmp.a_over_b))
    return chosen, DynamicSourceChoice(
        chosen=chosen.value, forced=None, batch_size=b,
        ms=SourceTimes(export=cmp.ms_a, fused=cmp.ms_b), export_over_fused_speedup=cmp.a_over_b,
        noisy=cmp.noisy, candidates={k.value: v[1].digest for k, v in built.items()})


def _compare(qz, bench, batch_size: int) -> Compare:
    """The ``compare`` stage at ``batch_size``, no longer than the benchmark itself may time a
    batch size (a quick run's short ``bench.max_seconds``); at the defaults this is the stage's
    own budget and key."""
    return Compare(data=qz.evaluation, batch_size=batch_size, hardware=qz.hw,
                   min_rounds=min(Compare.min_rounds, bench.min_rounds),
                   max_seconds=min(Compare.max_seconds, bench.max_seconds))


# -- the steps, in the order ``steps`` takes them -----------------------------------------------

# An activation whose largest channel is this many times its median one has outliers: under one
# per-tensor INT8 scale the median channel keeps at most 5 of the 8 bits. Random-weight encoders
# stay under 3 (the tests' tiny BERT), pretrained ones reach 10-40 (all-mpnet-base-v2).
OUTLIER_RATIO = 8.0


def smoothing(qz: Quantizer) -> Smoothing | None:
    """SmoothQuant-style migration (``pipeline.stages.smooth``): each of the task's (or
    ``quant.smooth_alphas``) strengths is tried, all-INT8 on the ranking subset, against the
    unsmoothed model; the best one (ties: no smoothing, then the smaller alpha) is what every
    later step quantizes. Per-tensor INT8 activations are what outlier channels break, static
    or dynamic alike, so both modes take part. None when nothing was tried."""
    if not qz.smooth_alphas:
        return None
    from pipeline.stages.smooth import ChannelRanges, Smooth

    q = qz.job.quant
    base = qz.prepared
    ranges = qz.runner.run(ChannelRanges(qz._calibration_split(), q.calibration_batch_size),
                           base, label="channel_ranges")
    ratios = ranges.meta["outlier_ratio"]
    if not ratios or max(ratios.values()) < OUTLIER_RATIO:
        return None  # even activations: per-tensor scales lose nothing smoothing would win back
    method = (DYNAMIC if qz.static == () else
              "minmax" if q.calibration == CalibrationMethod.auto else q.calibration.value)
    tried = [("off", base, qz.score(qz.quantize(method, q.exclude, label="quantize[smooth off]"),
                                    "rank[smooth off]"))]
    for alpha in sorted(set(qz.smooth_alphas)):
        model = qz.runner.run(Smooth(alpha), base, label=f"smooth[{alpha}]", ranges=ranges)
        qz.use(model, f"smooth {alpha}")
        tried.append((alpha, model, qz.score(
            qz.quantize(method, q.exclude, label=f"quantize[smooth {alpha}]"),
            f"rank[smooth {alpha}]")))
    sign = 1 if qz.metric.higher_is_better else -1
    best = max(range(len(tried)), key=lambda i: (sign * tried[i][2], -i))
    key, model, _ = tried[best]
    qz.use(model, "" if best == 0 else f"smooth {key}")
    return Smoothing(scores={str(k): score for k, _, score in tried}, chosen=key,
                     metric=qz.metric.name, activations=len(ratios),
                     largest_outlier_ratio=max(ratios.values()) if ratios else None)


def calibration(qz: Quantizer, info: QuantInfo) -> str:
    """The calibration method: none for dynamic INT8, the configured one, or (``auto``) the best
    of ``METHODS`` on the hardest lines, each scored into ``info.calibration_ranking``."""
    q = qz.job.quant
    if qz.static == ():
        return DYNAMIC
    if q.calibration != CalibrationMethod.auto:
        return q.calibration.value
    for candidate_method in METHODS:
        art = qz.quantize(candidate_method, q.exclude, label=f"quantize[{candidate_method}]")
        info.calibration_ranking[candidate_method] = qz.score(art, f"rank[{candidate_method}]")
    # Best on the hardest samples (in the primary metric's direction); ties go to the cheaper,
    # simpler method (list order).
    sign = 1 if qz.metric.higher_is_better else -1
    return max(METHODS, key=lambda k: (sign * info.calibration_ranking[k], -METHODS.index(k)))


@dataclass
class Current:
    """The model the steps refine: its artifact, its explanation and the nodes kept float."""
    art: object
    profile: object          # the explain artifact (the region search reads its meta)
    explain: Explanation
    exclude: set
    node_trial: tuple | None = None  # (artifact, float nodes) of the latency trial, for regions


def explained(qz: Quantizer, art, exclude: set, label: str = "explain") -> Current:
    """``art`` as the current model, with its explanation."""
    profile = qz.explain(art, label=label)
    return Current(art, profile, Explanation.of(profile), exclude)


def quantize(qz: Quantizer, method: str) -> Current:
    """Every node INT8 but ``quant.exclude``, and its explanation (profile, slower nodes)."""
    exclude = set(qz.job.quant.exclude)
    return explained(qz, qz.quantize(method, exclude), exclude)


def float_fallback(qz: Quantizer, method: str, cur: Current, info: QuantInfo) -> Current:
    """Nodes whose INT8 kernel lost to float on this machine: try them float, and keep that model
    only if it is faster end to end (a float node adds a Q/DQ boundary its own profile does not
    show). With region trials, the trial is timed there instead, side by side with the regions."""
    q = qz.job.quant
    if not (q.latency_aware and cur.explain.slower_in_int8):
        return cur
    slower = list(cur.explain.slower_in_int8)
    trial = qz.quantize(method, cur.exclude | set(slower), label="quantize[latency-aware]")
    made = Quantized.of(trial)
    floated = made.floated(slower)
    info.node_trial = NodeTrial(tuple(floated), made.exclusion_ignored, None)
    if not floated:
        return cur
    if q.region_trials:
        cur.node_trial = (trial, floated)
        return cur
    verdict = Comparison.of(qz.runner.run(
        _compare(qz, qz.job.bench, qz.job.gate.speedup_batch_size), trial,
        label="compare[latency-aware]", other=cur.art)).a_over_b
    info.node_trial = replace(info.node_trial, speedup_over_all_int8=verdict)
    if verdict.low <= 1.0:
        return cur
    info.latency_exclusions = floated
    return explained(qz, trial, cur.exclude | set(floated), "explain[latency-aware]")


def float_regions(qz: Quantizer, method: str, cur: Current, info: QuantInfo) -> Current:
    """Whole blocks float, timed end to end together with the node trial above, which cannot see
    the Q/DQ borders its float nodes add (``pipeline.recipes.regions``)."""
    q = qz.job.quant
    if not (q.region_trials and q.latency_aware):
        return cur
    from pipeline.recipes import regions

    art, kept, info.regions = regions.search(qz, method, cur.exclude, cur.art, cur.profile.meta,
                                             cur.node_trial)
    if cur.node_trial:  # timed with the regions: the region search's record has its speedup
        info.node_trial = replace(info.node_trial,
                                  speedup_over_all_int8=Speedup.of(info.regions["node_trial"]))
    if not kept:
        return Current(art, cur.profile, cur.explain, cur.exclude)
    info.latency_exclusions = kept
    return explained(qz, art, cur.exclude | set(kept), "explain[regions]")


def float_outputs(qz: Quantizer, method: str, cur: Current, info: QuantInfo) -> Current:
    """The model's outputs stay float where INT8 buys next to nothing: the quantizer puts a Q/DQ
    pair on every output, which rounds the logits to 8 bits. A node without weights (the head's
    bias Add: a QLinearAdd 0.003 ms faster at batch 8) stays float; leaving it so took the OCR
    model's drop against FP16 from 0.05 points to 0.00. A weighted output node keeps its INT8
    kernel; the mixed search may still float it for accuracy."""
    cheap = sorted(n for n, op in output_nodes(qz.prepared.model).items()
                   if n not in cur.exclude and op not in WEIGHTED_OPS)
    if not cheap:
        return cur
    trial = qz.quantize(method, cur.exclude | set(cheap), label="quantize[float outputs]")
    kept = Quantized.of(trial).floated(cheap)
    if not kept:
        return cur
    info.float_outputs = kept
    return explained(qz, trial, cur.exclude | set(kept), "explain[float outputs]")


def mixed_search(qz: Quantizer, method: str, cur: Current, info: QuantInfo) -> Current:
    """quant=mixed: nodes back to float by sensitivity under the accuracy budget
    (``pipeline.recipes.mixed``)."""
    if qz.job.quant.mode != QuantMode.mixed:
        return cur
    from pipeline.recipes.mixed import search

    art, info.sensitivity, info.search = search(qz, method, cur.exclude, cur.art)
    return explained(qz, art, cur.exclude, "explain[mixed]")


def sensitivity(qz: Quantizer, art) -> list[NodeSqnr]:
    """Each node's output SQNR against FP32 on the ranking subset, for the per-layer table."""
    from pipeline.stages.sqnr import Sqnr

    sqnr = qz.runner.run(Sqnr(data=qz.evaluation, subset=qz.subset, hardware=qz.hw), art,
                         fp32=qz.fp32).meta["sqnr_db"]
    return [NodeSqnr(n, v) for n, v in sqnr.items()]


def not_slower_than_fp32(qz: Quantizer, art, info: QuantInfo, fp32=None):
    """INT8 that cannot pay falls back to float. The steps above keep float what profiled slower
    node by node, but on a CPU without fast integer dot products (no VNNI) a mobile network's
    INT8 can stay slower than FP32 end to end: every HardSwish and squeeze-excite adds Q/DQ pairs
    the float model fused away. So the final model is timed against FP32 at every benchmarked
    batch size; where it is slower (upper bound of its speedup's 95 % interval below 1), the
    candidate is the FP32 model itself, and the report says why. Only when the gate asks for
    speed (``gate.min_speedup > 0``): without that, INT8 may be wanted for its size. ``fp32``:
    the FP32 baseline when ``qz`` quantized another graph (the unfused export)."""
    job = qz.job
    fp32 = fp32 or qz.fp32
    if not (job.quant.latency_aware and job.gate.min_speedup > 0):
        return art
    speedups = {str(b): Comparison.of(qz.runner.run(
        _compare(qz, job.bench, b), art, label=f"compare[int8 vs fp32, b{b}]", other=fp32)).a_over_b
        for b in job.bench.batch_sizes}
    slower = tuple(b for b, sp in speedups.items() if sp.high < 1.0)
    info.versus = VersusFp32(speedups, slower, "fp32" if slower else "int8")
    return fp32 if slower else art


# -- what every step uses ------------------------------------------------------------------------

class Quantizer:
    """What every INT8 step shares: the prepared model, the settings from the CPU's flags, the
    ranking subset, and the calls that quantize, edit, score and explain (calibrations cached
    per method)."""

    def __init__(self, job, runner, fp32, fp32_eval, fp16_eval):
        """``job``: the ``Int8Job``: the quant, bench and gate settings, the task (its primary
        metric, its default dynamic op types), the evaluation split and a function giving the
        calibration split (built only when a method needs it)."""
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
        return self.scores(art, label, subset)[self.metric.name]

    def scores(self, art, label: str, subset=True) -> dict[str, float]:
        ev = self.runner.run(Evaluate(self.evaluation, self.job.eval_batch_size, self.hw,
                                      self.subset if subset else ()), art, label=label,
                             **self.against)
        return Evaluation.of(ev).metrics

    def companions_within(self, scores: dict[str, float]) -> bool:
        """The metrics the gate judges beside the primary (a cosine's 1st percentile, an
        output's parts) within the gate's own limits for them: a model the search keeps must
        not fail the gate on one of them."""
        from pipeline.metrics.limits import judged

        reference = Evaluation.of(self.fp16_eval).metrics
        return all(j.passed for j in judged(reference, scores, self.job.gate.max_accuracy_drop,
                                            self.job.task.metrics)
                   if j.metric != self.metric.name)

    def explain(self, art, label="explain"):
        q = self.job.quant
        return self.runner.run(Explain(self.evaluation, self.job.gate.speedup_batch_size,
                                       q.profile_runs, self.hw), art,
                               label=label, fp32=self.fp32)


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
                          f"{name}'s model; valid names: {', '.join(modules)}")
