"""The recipe: the order of work, top to bottom. Config only picks options.

load -> (prune) -> export -> optimize -> fp16 baseline -> evaluate the floats -> (INT8: prepare,
calibrate, quantize, explain, keep float what got slower, float outputs, mixed search: the
sub-recipe in pipeline/quant/recipe.py; quant=auto: every candidate, pipeline/quant/auto.py) ->
evaluate the candidate -> benchmark -> (load test) -> gate.
In: a ``Config`` and a ``Runner``. Out: the artifacts by role, the evaluations, the benchmark and
the gate verdict. Publishing and the report are done by ``__main__`` with what this returns.
"""
from __future__ import annotations

from pathlib import Path

from pipeline import gate
from pipeline.artifact import sha256_file
from pipeline.env import environment
from pipeline.config import Config, PruneMethod, QuantMode
from pipeline.errors import ConfigError
from pipeline.models import task
from pipeline.outcome import Outcome
from pipeline.stages.benchmark import Benchmark
from pipeline.stages.evaluate import Evaluate
from pipeline.stages.export import Export
from pipeline.stages.fp16 import ToFp16
from pipeline.stages.load import Load
from pipeline.stages.loadtest import LoadTest
from pipeline.stages.optimize import Optimize
from pipeline.stages.prune import Prune
from pipeline.quant.recipe import int8
from pipeline.runtimes import PRIMARY, settings_for
from pipeline.runtimes.plan import Plan

OPSET = 18  # torch's exporter implements 18 natively; >= 13 is needed for per-channel QDQ


def recipe(cfg: Config, runner) -> Outcome:
    m, hw = cfg.model, cfg.hardware.target()  # stages see how to run, not the datasheet
    t = task(m.name)
    checkpoint_sha = None
    if m.checkpoint is not None:
        if not Path(m.checkpoint).is_file():  # checked before anything runs; gone since
            raise ConfigError(f"model.checkpoint={m.checkpoint}: file not found")
        checkpoint_sha = sha256_file(Path(m.checkpoint))
    source = runner.run(Load(task=m.name, checkpoint=m.checkpoint,
                             checkpoint_sha256=checkpoint_sha, widths=tuple(m.widths),
                             hidden=m.hidden))
    pruning = None
    if cfg.prune.method == PruneMethod.channels:  # off: no stage, so every key stays as it was
        pruning = {"load": source,
                   "prune": runner.run(Prune(task=m.name, prune=cfg.prune), source)}
        source = pruning["prune"]  # the same format as load: later stages see a smaller network
    export = Export(task=m.name, opset=OPSET, parity_samples=m.parity_samples,
                    data_dir=cfg.data_dir, hardware=hw)
    exported = runner.run(export, source)
    if pruning:  # the unpruned export (shared with unpruned runs' cache) for the size row
        pruning["unpruned_export"] = runner.run(export, pruning["load"], label="export[unpruned]")
    fp32 = runner.run(Optimize(task=m.name, parity_samples=m.parity_samples,
                               data_dir=cfg.data_dir, hardware=hw), exported)
    # fp16 probes ONNX Runtime's kernels whatever the target: its key ignores the runtime.
    fp16 = runner.run(ToFp16(task=m.name, keep_float32=tuple(cfg.quant.fp16_keep_float32),
                             parity_samples=m.parity_samples, data_dir=cfg.data_dir,
                             hardware=settings_for(hw, PRIMARY)), fp32)
    if cfg.quant.mode == QuantMode.auto:  # every candidate, timed side by side: pipeline/quant/auto.py
        from pipeline.quant import auto

        return auto.recipe(cfg, runner, t, source, exported, fp32, fp16, pruning)
    plan = Plan(hw, cfg.quant.mode)  # which runtime and precision each artifact runs on
    evaluate = Evaluate(task=m.name, eval_samples=m.eval_samples, batch_size=m.eval_batch_size,
                        data_dir=cfg.data_dir, hardware=hw)
    evals = {role: runner.run(plan.evaluation(evaluate, role), art, label=f"evaluate[{role}]")
             for role, art in (("export", exported), ("fp32", fp32), ("fp16", fp16))}
    quant_info = None
    if cfg.quant.mode in (QuantMode.int8, QuantMode.dynamic, QuantMode.mixed):
        # prepare, calibrate, quantize, explain, float fallback, float regions, float outputs,
        # mixed search, sensitivity: pipeline/quant/recipe.py
        candidate, quant_info = int8(cfg, runner, fp32, evals["fp32"], evals["fp16"],
                                     t.PRIMARY_METRIC)
    else:
        candidate = {QuantMode.none: fp32, QuantMode.fp16: fp16,
                     QuantMode.bf16: fp32}[cfg.quant.mode]  # bf16: a precision, not a file
    models = {"export": exported, "fp32": fp32, "fp16": fp16, "candidate": candidate}
    evals["candidate"] = runner.run(plan.evaluation(evaluate, "candidate"), candidate,
                                    label="evaluate[candidate]")
    plan.evaluate_others(runner, evaluate, models)  # runtime=auto: every target, per artifact
    bench = runner.run(Benchmark(task=m.name, bench=cfg.bench.timing(),
                                 eval_samples=m.eval_samples, data_dir=cfg.data_dir,
                                 hardware=plan.hw, options=plan.bench_options()),
                       candidate, fp32=fp32, fp16=fp16, export=exported)
    # runtime=auto picks the target here; the gate and the report see the chosen one.
    evals, bench, targets, deployed = plan.decide(evals, bench, cfg.gate, t.PRIMARY_METRIC,
                                                  cfg.gate.speedup_batch_size)
    load = None
    if cfg.bench.mode.value != "latency":
        load = runner.run(LoadTest(task=m.name, mode=cfg.bench.mode.value, load=cfg.bench.load,
                                   slo_p99_ms=cfg.slo.p99_ms, eval_samples=m.eval_samples,
                                   data_dir=cfg.data_dir, hardware=deployed,
                                   nonce=cfg.bench.nonce),
                          candidate, fp32=fp32)
    verdict = gate.judge(evals, bench, cfg.gate, t.PRIMARY_METRIC, cfg.slo, candidate,
                         environment(hw))
    if not verdict["passed"] and quant_info is not None:  # which float artifact would pass
        from pipeline.quant.auto import float_hint

        float_hint(verdict, evals, bench, plan, cfg.gate, t.PRIMARY_METRIC, m.name)
    return Outcome(models, evals, bench, verdict, source, load, quant_info, targets, pruning)
