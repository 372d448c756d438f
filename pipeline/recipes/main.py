"""The recipe: the order of work, top to bottom. Config only picks options.

load -> (prune) -> export (for an ONNX file: import instead) -> optimize (a transformer: fuse) ->
fp16 baseline -> evaluate the floats -> (INT8: prepare, calibrate, quantize, explain, keep float what got slower, float
outputs, mixed search: the sub-recipe in pipeline/recipes/int8.py; quant=auto: every candidate,
pipeline/recipes/auto.py) ->
evaluate the candidate -> benchmark -> (load test) -> gate.
In: a ``Config``, a ``Runner`` and the run's facts (``pipeline.models.run.Run``: the task key and
task, the checkpoint's digest; the command line builds it once). Out: the artifacts by role, the evaluations, the benchmark and
the gate verdict, with the ``Run`` they came from. Publishing and the report are done by the
command line with what this returns.
Everything model-specific comes from the task (``pipeline.models.task``): its data splits (each a
``DataSplit`` with its content digest, part of every key that reads it), its inputs and dynamic
axes, its primary metric and the defaults it gives quantization and pruning.
"""
from __future__ import annotations

from dataclasses import replace

from pipeline import gate
from pipeline.core.env import environment
from pipeline.config import Config, PruneMethod, QuantMode
from pipeline.gate.outcome import Outcome, PruningArtifacts
from pipeline.models.run import Run
from pipeline.models.sources import Source, Splits
from pipeline.stages.benchmark import Benchmark
from pipeline.stages.evaluate import Evaluate, against, baselines
from pipeline.stages.export import Export
from pipeline.stages.fp16 import ToFp16
from pipeline.stages.load import Load, params_key
from pipeline.stages.loadtest import LoadTest
from pipeline.stages.optimize import Optimize
from pipeline.stages.prune import Prune
from pipeline.recipes.int8 import int8
from pipeline.recipes.job import Int8Job
from pipeline.runtimes import PRIMARY, settings_for
from pipeline.runtimes.plan import Plan
from pipeline.measure.results import Role
from pipeline.measure.seat import seen_from

OPSET = 18  # torch's exporter implements 18 natively; >= 13 is needed for per-channel QDQ


def attention_pays(cfg: Config, runner, splits, hw, fused, unfused) -> bool:
    """Is the pipeline's MultiHeadAttention faster than the attention left as exported? Timed
    head to head in FP32 at the gate's batch size (the attention stays float in every INT8 mode,
    so the sign carries over): kept only when the whole 95 % interval is above 1. On
    all-mpnet-base-v2's dynamic INT8 it was 1.06x the unfused attention at batch 8 on an AMD EPYC
    Zen 4 and 0.91x on a Zen 5 (1.00x at batch 1), both with AVX512-VNNI and 2 threads."""
    from pipeline.stages.compare import Compare

    bench = cfg.bench
    cmp = runner.run(Compare(data=splits.evaluation, batch_size=cfg.gate.speedup_batch_size,
                             hardware=hw, min_rounds=min(Compare.min_rounds, bench.min_rounds),
                             max_seconds=min(Compare.max_seconds, bench.max_seconds)),
                     fused, label="compare[attention]", other=unfused)
    return cmp.meta["a_over_b_speedup"]["ci95"][0] > 1.0


def _fp16(cfg: Config, runner, t, splits, hw, fp32):
    """The FP16 baseline. Where no FP16 copy could be built (control flow), the FP32 model stood
    in: said once on the terminal and in the report's warnings; quant=fp16 then has nothing to
    ship."""
    from pipeline.core.errors import StageError
    from pipeline.stages.fp16 import stand_in

    # fp16 probes ONNX Runtime's kernels whatever the target: its key ignores the runtime.
    fp16 = runner.run(ToFp16(keep_float32=tuple(cfg.quant.fp16_keep_float32), data=splits.parity,
                             hardware=settings_for(hw, PRIMARY)), fp32)
    why = stand_in(fp16)
    if why and cfg.quant.mode == QuantMode.fp16:
        raise StageError(f"quant=fp16: {why}; nothing in FP16 to ship (quant=none ships the "
                         "optimized FP32 model)")
    if why:
        print(f"fp16: {why}", flush=True)
        if hasattr(t, "warnings"):
            t.warnings.append(f"fp16: {why}")
    return fp16


def _something_dynamic(cfg: Config, t, fp32, export) -> None:
    """quant=dynamic on a graph with no op it quantizes (a detector of convolutions, nudenet's):
    the candidate would be the FP32 model itself, judged and timed against itself. One line."""
    from pipeline.core.errors import ConfigError
    from pipeline.recipes.auto import dynamic_op_types, dynamic_ops

    if cfg.quant.mode == QuantMode.dynamic and not dynamic_ops(cfg, t, fp32, export):
        raise ConfigError(f"quant=dynamic: the graph has no op dynamic INT8 quantizes "
                          f"(quant.dynamic_op_types: {', '.join(dynamic_op_types(cfg, t))}), so "
                          "the candidate would be the FP32 model itself; use quant=int8 "
                          "(static, calibrated), or quant=auto to have every candidate tried")


def recipe(cfg: Config, runner, run: Run) -> Outcome:
    m, hw = cfg.model, cfg.hardware.target()  # stages see how to run, not the datasheet
    key, t = run.key, run.task
    splits = Splits(t, cfg)
    pruning = None
    if getattr(t, "onnx_source", None):  # an ONNX file: nothing to load or export
        from pipeline.stages.import_onnx import ImportOnnx

        source = exported = runner.run(ImportOnnx(task=key, path=t.onnx_source,
                                                  sha256=t.onnx_sha256, stamp=run.stamp,
                                                  data=splits.parity, hardware=hw))
    else:
        source = runner.run(Load(task=key, checkpoint=m.checkpoint,
                                 checkpoint_sha256=run.checkpoint_sha256,
                                 params=params_key(m.params)))
        if cfg.prune.method == PruneMethod.channels:  # off: no stage, every key stays as it was
            from pipeline.prune.helper import with_ignored

            unpruned = source
            source = runner.run(Prune(task=key, prune=with_ignored(cfg.prune, t),
                                      data=splits.evaluation if isinstance(key, Source) else None),
                                unpruned)  # the load format: later stages see a smaller network
        export = Export(task=key, opset=OPSET, data=splits.parity, hardware=hw)
        exported = runner.run(export, source)
        if cfg.prune.method == PruneMethod.channels:
            # the unpruned export (shared with unpruned runs' cache) for the size row
            pruning = PruningArtifacts(unpruned, source, runner.run(export, unpruned,
                                                                    label="export[unpruned]"))
    fusion = getattr(t, "fusion", None)
    unfused = exported  # the graph dynamic INT8 may quantize instead of the fused one
    if fusion:  # a transformer encoder: onnxruntime.transformers' fusions make the FP32 baseline
        from pipeline.stages.attention import FuseAttention
        from pipeline.stages.fuse import Fuse

        fuse = Fuse(data=splits.parity, hardware=hw, model_type=fusion["model_type"],
                    num_heads=fusion["num_heads"], hidden_size=fusion["hidden_size"])
        fp32 = runner.run(fuse, exported)
        if (fp32.meta.get("attention") or {}).get("fused"):
            # dynamic INT8 may start from the export (recipes/int8.dynamic_sources): the same
            # attention fusion there, or that source would lose the fused kernel's speed
            unfused = runner.run(FuseAttention(data=splits.parity, num_heads=fusion["num_heads"],
                                               hardware=hw), exported, label="attention[export]")
            if not attention_pays(cfg, runner, splits, hw, unfused, exported):
                fp32 = runner.run(replace(fuse, attention=False), exported, label="fuse[attention off]")
                unfused = exported
        # and the fused graph's choice of residual norms (flat where SkipLayerNormalization is
        # slower here), or the runtime's own fusion at load would make that source slower
        if (fp32.meta.get("norms") or {}).get("flattened"):
            from pipeline.stages.norms import Norms

            unfused = runner.run(Norms(data=splits.parity, hardware=hw), unfused,
                                 label="norms[export]")
    else:
        fp32 = runner.run(Optimize(data=splits.parity, hardware=hw), exported)
    fp16 = _fp16(cfg, runner, t, splits, hw, fp32)
    if cfg.quant.mode == QuantMode.auto:  # every candidate, timed side by side: pipeline/recipes/auto.py
        from pipeline.recipes import auto

        return auto.recipe(cfg, runner, run, splits, source, exported, fp32, fp16, pruning,
                           unfused=unfused)
    _something_dynamic(cfg, t, fp32, unfused)
    plan = Plan(hw, cfg.quant.mode)  # which runtime and precision each artifact runs on
    evaluate = Evaluate(data=splits.evaluation, batch_size=m.eval_batch_size, hardware=hw)
    evals = baselines(runner, plan, evaluate, t, exported, fp32, fp16)
    quant_info = None
    if cfg.quant.mode in (QuantMode.int8, QuantMode.dynamic, QuantMode.mixed):
        # prepare, calibrate, quantize, explain, float fallback, float regions, float outputs,
        # mixed search, sensitivity: pipeline/recipes/int8.py
        candidate, quant_info = int8(Int8Job.of(cfg, t, splits), runner, fp32, evals[Role.fp32],
                                     evals[Role.fp16], export=unfused)
    else:
        candidate = {QuantMode.none: fp32, QuantMode.fp16: fp16,
                     QuantMode.bf16: fp32}[cfg.quant.mode]  # bf16: a precision, not a file
    models = {Role.export: exported, Role.fp32: fp32, Role.fp16: fp16, Role.candidate: candidate}
    evals[Role.candidate] = runner.run(plan.evaluation(evaluate, Role.candidate), candidate,
                                    label="evaluate[candidate]", **against(t, evals[Role.fp16]))
    # runtime=auto: every target, per artifact
    plan.evaluate_others(runner, evaluate, models, against(t, evals[Role.fp16]))
    bench = runner.run(Benchmark(data=splits.evaluation, bench=cfg.bench.timing(),
                                 hardware=plan.hw, options=plan.bench_options()),
                       candidate, fp32=fp32, fp16=fp16, export=exported)
    # runtime=auto picks the target here; the gate and the report read the chosen one's seat.
    evals, seat, targets, deployed = plan.decide(evals, bench, cfg.gate, t.metrics,
                                                 cfg.gate.speedup_batch_size)
    load = None
    if cfg.bench.mode.value != "latency":
        load = runner.run(LoadTest(data=splits.evaluation, mode=cfg.bench.mode.value,
                                   load=cfg.bench.load, slo_p99_ms=cfg.slo.p99_ms,
                                   hardware=deployed, nonce=cfg.bench.nonce),
                          candidate, fp32=fp32)
    verdict = gate.judge(gate.measures(evals, seen_from(bench, seat), cfg.gate, cfg.slo, candidate,
                                       against_given=cfg.quant.mode == QuantMode.none),
                         cfg.gate, t.metrics, cfg.slo, environment(hw))
    if not verdict.passed and quant_info is not None:  # which float artifact would pass
        from pipeline.recipes.auto import accuracy_hint, dynamic_op_types, float_hint

        float_hint(verdict, evals, bench, plan, cfg.gate, t.metrics)
        accuracy_hint(verdict, cfg.quant.mode, dynamic_op_types(cfg, t))
    return Outcome(run, models, evals, bench, verdict, source, load, quant_info, targets, pruning, seat=seat)
