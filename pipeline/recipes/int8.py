"""The INT8 sub-recipe, step by step: calibrate, quantize and explain, keep float what got slower,
float whole regions, float outputs, search a mix, per-node sensitivity, and float altogether when
the result is still slower than FP32. Dynamic INT8 of a fused transformer runs these steps on the
fused graph and on the unfused export and keeps the faster of the two, timed head to head.

In: the config, the runner, the optimized FP32 artifact and the evaluations of the float
baselines (FP32 for the ranking subset of hardest samples, FP16 as the accuracy reference).
Out: the candidate artifact and a ``QuantInfo`` record for the report: hardware-aware settings,
the calibration chosen (and, with ``auto``, how each method scored), the explanation of the
final model (profile, unfused Q/DQ, float ops), per-node sensitivity and the mixed-precision
search trace. Each step takes the current model (``Current``) and returns it, changed only when
its trial earned it; every trial is a cached stage, so a re-run with a changed budget repeats
only the evaluations it needs.
"""
from __future__ import annotations

from dataclasses import dataclass

from pipeline.config import CalibrationMethod, DynamicSource, QuantMode
from pipeline.quant.calibration import DYNAMIC, METHODS
from pipeline.recipes.int8_steps import QuantInfo, Quantizer, output_nodes
from pipeline.runtimes.ops import WEIGHTED_OPS
from pipeline.stages.compare import Compare


@dataclass
class Current:
    """The model the steps refine: its artifact, its explanation and the nodes kept float."""
    art: object
    explain: object
    exclude: set
    node_trial: tuple | None = None  # (artifact, float nodes) of the latency trial, for regions


def int8(job, runner, fp32, fp32_eval, fp16_eval, guard: bool = True, export=None) -> tuple:
    """(candidate artifact, QuantInfo) for quant=int8, dynamic or mixed. ``job``: an
    ``Int8Job`` (``pipeline.recipes.job``: the settings and facts this reads). ``guard=False`` keeps the INT8 model
    even when it is slower than FP32 (``quant=auto`` ranks it against the float models itself).
    ``export``: the unfused export of a transformer whose fusions made ``fp32``; dynamic INT8
    then quantizes the graph ``quant.dynamic_source`` names, or (``auto``) both, the faster kept."""
    sources = dynamic_sources(job, fp32, export)
    built = {name: steps(Quantizer(job, runner, src, fp32_eval, fp16_eval))
             for name, src in sources.items()}
    chosen, record = next(iter(built)), None
    if len(built) > 1:
        chosen, record = race(job, built)
    qz, art, info = built[chosen]
    if export is not None and job.quant.mode == QuantMode.dynamic and fp32.stage == "fuse":
        q = job.quant
        info.dynamic_source = record or {
            "chosen": chosen, "forced": None if q.dynamic_source == DynamicSource.auto
            else q.dynamic_source.value,
            "why": ("the fusions left the export as it was"
                    if export.files.get("model.onnx") == fp32.files.get("model.onnx") else
                    f"quant.dynamic_source={q.dynamic_source.value}"
                    if q.dynamic_source != DynamicSource.auto else
                    "quant.exclude names the fused graph's nodes")}
    return (not_slower_than_fp32(qz, art, info, fp32) if guard else art), info


def steps(qz: Quantizer) -> tuple:
    """The sub-recipe on one source graph: (quantizer, INT8 artifact, QuantInfo)."""
    info = QuantInfo(settings=qz.settings, calibration=qz.job.quant.calibration.value)
    smoothing(qz, info)
    method = calibration(qz, info)
    info.calibration = "none (dynamic)" if method == DYNAMIC else method  # what the report says
    cur = quantize(qz, method)
    cur = float_fallback(qz, method, cur, info)
    cur = float_regions(qz, method, cur, info)
    cur = float_outputs(qz, method, cur, info)
    cur = mixed_search(qz, method, cur, info)
    info.explain = cur.explain.meta
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
            or export.files.get("model.onnx") == fp32.files.get("model.onnx")):
        return {"fused": fp32}
    if q.dynamic_source == DynamicSource.export:
        return {"export": export}
    if q.dynamic_source == DynamicSource.fused or q.exclude:
        return {"fused": fp32}
    return {"fused": fp32, "export": export}


def pick_source(speedup: dict) -> str:
    """``speedup``: the export's INT8 over the fused graph's (t_fused / t_export, median and
    95 % interval). The export only when its whole interval is above 1; equal or slower: the
    fused graph, as before the choice existed."""
    return "export" if speedup["ci95"][0] > 1.0 else "fused"


def race(job, built: dict) -> tuple[str, dict]:
    """Both dynamic candidates timed head to head at the gate's batch size, on the target's
    runtime (the ``compare`` stage, as the latency-aware step): (chosen source, the record)."""
    qz = built["fused"][0]
    bench, b = job.bench, job.gate.speedup_batch_size
    cmp = qz.runner.run(
        Compare(data=qz.evaluation, batch_size=b, hardware=qz.hw,
                min_rounds=min(Compare.min_rounds, bench.min_rounds),
                max_seconds=min(Compare.max_seconds, bench.max_seconds)),
        built["export"][1], label="compare[dynamic: export vs fused]", other=built["fused"][1])
    speedup = cmp.meta["a_over_b_speedup"]
    chosen = pick_source(speedup)
    return chosen, {"chosen": chosen, "forced": None, "batch_size": b,
                    "ms": {"export": cmp.meta["ms_a"], "fused": cmp.meta["ms_b"]},
                    "export_over_fused_speedup": speedup, "noisy": cmp.meta["noisy"],
                    "candidates": {k: v[1].digest for k, v in built.items()}}


# An activation whose largest channel is this many times its median one has outliers: under one
# per-tensor INT8 scale the median channel keeps at most 5 of the 8 bits. Random-weight encoders
# stay under 3 (the tests' tiny BERT), pretrained ones reach 10-40 (all-mpnet-base-v2).
OUTLIER_RATIO = 8.0


def smoothing(qz: Quantizer, info: QuantInfo) -> None:
    """SmoothQuant-style migration (``pipeline.stages.smooth``): each of the task's (or
    ``quant.smooth_alphas``) strengths is tried, all-INT8 on the ranking subset, against the
    unsmoothed model; the best one (ties: no smoothing, then the smaller alpha) is what every
    later step quantizes. Per-tensor INT8 activations are what outlier channels break, static
    or dynamic alike, so both modes take part."""
    if not qz.smooth_alphas:
        return
    from pipeline.stages.smooth import ChannelRanges, Smooth

    q = qz.job.quant
    base = qz.prepared
    ranges = qz.runner.run(ChannelRanges(qz._calibration_split(), q.calibration_batch_size),
                           base, label="channel_ranges")
    ratios = ranges.meta["outlier_ratio"]
    if not ratios or max(ratios.values()) < OUTLIER_RATIO:
        return  # even activations: per-tensor scales lose nothing smoothing would win back
    method = (DYNAMIC if qz.static == () else
              "minmax" if q.calibration == CalibrationMethod.auto else q.calibration.value)
    scores, models = {}, {"off": base}
    scores["off"] = qz.score(qz.quantize(method, q.exclude, label="quantize[smooth off]"),
                             "rank[smooth off]")
    for alpha in sorted(set(qz.smooth_alphas)):
        models[alpha] = qz.runner.run(Smooth(alpha), base, label=f"smooth[{alpha}]", ranges=ranges)
        qz.use(models[alpha], f"smooth {alpha}")
        scores[alpha] = qz.score(qz.quantize(method, q.exclude, label=f"quantize[smooth {alpha}]"),
                                 f"rank[smooth {alpha}]")
    sign = 1 if qz.metric.higher_is_better else -1
    keys = list(models)
    best = max(keys, key=lambda k: (sign * scores[k], -keys.index(k)))
    qz.use(models[best], "" if best == "off" else f"smooth {best}")
    info.smoothing = {"scores": {str(k): v for k, v in scores.items()}, "chosen": best,
                      "metric": qz.metric.name, "activations": len(ratios),
                      "largest_outlier_ratio": max(ratios.values()) if ratios else None}


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


def quantize(qz: Quantizer, method: str) -> Current:
    """Every node INT8 but ``quant.exclude``, and its explanation (profile, slower nodes)."""
    exclude = set(qz.job.quant.exclude)
    art = qz.quantize(method, exclude)
    return Current(art, qz.explain(art), exclude)


def float_fallback(qz: Quantizer, method: str, cur: Current, info: QuantInfo) -> Current:
    """Nodes whose INT8 kernel lost to float on this machine: try them float, and keep that model
    only if it is faster end to end (a float node adds a Q/DQ boundary its own profile does not
    show). With region trials, the trial is timed there instead, side by side with the regions."""
    q = qz.job.quant
    if not (q.latency_aware and cur.explain.meta["slower_in_int8"]):
        return cur
    slower = list(cur.explain.meta["slower_in_int8"])
    trial = qz.quantize(method, cur.exclude | set(slower), label="quantize[latency-aware]")
    floated = [n for n in slower if trial.meta["precision"].get(n) == "float"]
    info.latency_trial = {"float_nodes": floated, "stayed_int8": trial.meta["exclusion_ignored"],
                          "speedup_over_all_int8": None}
    if not floated:
        return cur
    if q.region_trials:
        cur.node_trial = (trial, floated)
        return cur
    bench = qz.job.bench
    # No longer than the benchmark itself may time a batch size (a quick run's short
    # bench.max_seconds); at the defaults this is the stage's own budget and key.
    verdict = qz.runner.run(
        Compare(data=qz.evaluation, batch_size=qz.job.gate.speedup_batch_size, hardware=qz.hw,
                min_rounds=min(Compare.min_rounds, bench.min_rounds),
                max_seconds=min(Compare.max_seconds, bench.max_seconds)),
        trial, label="compare[latency-aware]", other=cur.art).meta["a_over_b_speedup"]
    info.latency_trial["speedup_over_all_int8"] = verdict
    if verdict["ci95"][0] <= 1.0:
        return cur
    info.latency_exclusions = floated
    return Current(trial, qz.explain(trial, label="explain[latency-aware]"),
                   cur.exclude | set(floated))


def float_regions(qz: Quantizer, method: str, cur: Current, info: QuantInfo) -> Current:
    """Whole blocks float, timed end to end together with the node trial above, which cannot see
    the Q/DQ borders its float nodes add (``pipeline.recipes.regions``)."""
    q = qz.job.quant
    if not (q.region_trials and q.latency_aware):
        return cur
    from pipeline.recipes import regions

    art, kept, info.regions = regions.search(qz, method, cur.exclude, cur.art, cur.explain.meta,
                                             cur.node_trial)
    if cur.node_trial:
        info.latency_trial["speedup_over_all_int8"] = info.regions["node_trial"]
    if not kept:
        return Current(art, cur.explain, cur.exclude)
    info.latency_exclusions = kept
    return Current(art, qz.explain(art, label="explain[regions]"), cur.exclude | set(kept))


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
    kept = [n for n in cheap if trial.meta["precision"].get(n) == "float"]
    if not kept:
        return cur
    info.float_outputs = kept
    return Current(trial, qz.explain(trial, label="explain[float outputs]"),
                   cur.exclude | set(kept))


def mixed_search(qz: Quantizer, method: str, cur: Current, info: QuantInfo) -> Current:
    """quant=mixed: nodes back to float by sensitivity under the accuracy budget
    (``pipeline.recipes.mixed``)."""
    if qz.job.quant.mode != QuantMode.mixed:
        return cur
    from pipeline.recipes.mixed import search

    art, info.sensitivity, info.search = search(qz, method, cur.exclude, cur.art)
    return Current(art, qz.explain(art, label="explain[mixed]"), cur.exclude)


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
    bench = job.bench
    speedups = {}
    for b in bench.batch_sizes:
        speedups[str(b)] = qz.runner.run(
            Compare(data=qz.evaluation, batch_size=b, hardware=qz.hw,
                    min_rounds=min(Compare.min_rounds, bench.min_rounds),
                    max_seconds=min(Compare.max_seconds, bench.max_seconds)),
            art, label=f"compare[int8 vs fp32, b{b}]", other=fp32).meta["a_over_b_speedup"]
    slower = [b for b, sp in speedups.items() if sp["ci95"][1] < 1.0]
    info.versus_fp32 = {"speedup": speedups, "slower_at_batch": slower,
                        "candidate": "fp32" if slower else "int8"}
    return fp32 if slower else art


def sensitivity(qz: Quantizer, art) -> list:
    """Each node's output SQNR against FP32 on the ranking subset, for the per-layer table."""
    from pipeline.stages.sqnr import Sqnr

    sqnr = qz.runner.run(Sqnr(data=qz.evaluation, subset=qz.subset, hardware=qz.hw), art, fp32=qz.fp32).meta["sqnr_db"]
    return [{"node": n, "sqnr_db": v} for n, v in sqnr.items()]
