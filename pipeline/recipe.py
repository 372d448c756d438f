"""The recipe: the order of work, top to bottom. Config only picks options.

load -> (prune) -> export (or, for an ONNX file, import) -> optimize -> fp16 baseline -> evaluate the floats -> (INT8: prepare,
calibrate, quantize, explain, keep float what got slower, mixed search; see quantization.py) ->
evaluate the candidate -> benchmark -> (load test) -> gate.
In: a ``Config`` and a ``Runner``. Out: the artifacts by role, the evaluations, the benchmark and
the gate verdict. Publishing and the report are done by ``__main__`` with what this returns.
Everything model-specific comes from the task (``pipeline.models.task``): its data splits (each a
``DataSplit`` with its content digest, part of every key that reads it), its inputs and dynamic
axes, its primary metric and the defaults it gives quantization and pruning.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from pipeline import gate
from pipeline.artifact import sha256_file
from pipeline.env import environment
from pipeline.config import BenchMode, Config, LoadConfig, PruneMethod, QuantMode
from pipeline.errors import ConfigError
from pipeline.models import task
from pipeline.models.sources import Splits, task_key
from pipeline.stages.benchmark import Benchmark
from pipeline.stages.evaluate import Evaluate
from pipeline.stages.export import Export
from pipeline.stages.fp16 import ToFp16
from pipeline.stages.load import Load, params_key
from pipeline.stages.loadtest import LoadTest
from pipeline.stages.optimize import Optimize
from pipeline.stages.prune import Prune
from pipeline.quant.int8 import Quantizer
from pipeline.runtimes import PRIMARY, settings_for
from pipeline.runtimes.plan import Plan

OPSET = 18  # torch's exporter implements 18 natively; >= 13 is needed for per-channel QDQ


@dataclass
class Outcome:
    models: dict        # role -> Artifact: export, fp32, fp16, candidate
    evals: dict         # role -> evaluate Artifact
    bench: object
    verdict: dict
    source: object      # the network export starts from: load, or prune when pruning
    load: object = None  # the loadtest artifact (bench.mode=load or soak)
    quant: object = None  # QuantInfo: settings, calibration, explanation, sensitivity, search
    runtimes: dict | None = None  # targets per artifact, failures, the choice (runtimes.plan)
    pruning: dict | None = None  # prune=channels: the load, prune and unpruned export artifacts
    auto: dict | None = None  # quant=auto: every candidate on every runtime, the winner and why


def recipe(cfg: Config, runner) -> Outcome:
    m, hw = cfg.model, cfg.hardware.target()  # stages see how to run, not the datasheet
    key = task_key(m, cfg.data, cfg.metric, cfg.data_dir)
    t = task(key)
    splits = Splits(t, cfg)
    metric = t.metrics.primary_spec
    pruning = None
    if getattr(t, "onnx_source", None):  # an ONNX file: nothing to load or export
        from pipeline.stages.import_onnx import ImportOnnx

        source = exported = runner.run(ImportOnnx(key, t.onnx_source, t.onnx_sha256,
                                                  splits.parity, hw))
    else:
        checkpoint_sha = None
        if m.checkpoint is not None:
            if not Path(m.checkpoint).is_file():  # checked before anything runs; gone since
                raise ConfigError(f"model.checkpoint={m.checkpoint}: file not found")
            checkpoint_sha = sha256_file(Path(m.checkpoint))
        source = runner.run(Load(key, m.checkpoint, checkpoint_sha, params_key(m.params)))
        if cfg.prune.method == PruneMethod.channels:  # off: no stage, every key stays as it was
            from pipeline.stages.prune import with_ignored

            pruning = {"load": source,
                       "prune": runner.run(Prune(key, with_ignored(cfg.prune, t)), source)}
            source = pruning["prune"]  # the load format: later stages see a smaller network
        exported = runner.run(Export(key, OPSET, splits.parity, hw), source)
        if pruning:  # the unpruned export (shared with unpruned runs' cache) for the size row
            pruning["unpruned_export"] = runner.run(
                Export(key, OPSET, splits.parity, hw), pruning["load"], label="export[unpruned]")
    fp32 = runner.run(Optimize(splits.parity, hw), exported)
    # fp16 probes ONNX Runtime's kernels whatever the target: its key ignores the runtime.
    fp16 = runner.run(ToFp16(tuple(cfg.quant.fp16_keep_float32), splits.parity,
                             settings_for(hw, PRIMARY)), fp32)
    if cfg.quant.mode == QuantMode.auto:  # every candidate, timed side by side: pipeline/quant/auto.py
        from pipeline.quant import auto

        return auto.recipe(cfg, runner, t, splits, source, exported, fp32, fp16, pruning)
    plan = Plan(hw, cfg.quant.mode)  # which runtime and precision each artifact runs on
    evaluate = Evaluate(splits.evaluation, m.eval_batch_size, hw)
    evals = {role: runner.run(plan.evaluation(evaluate, role), art, label=f"evaluate[{role}]")
             for role, art in (("export", exported), ("fp32", fp32), ("fp16", fp16))}
    quant_info = None
    if cfg.quant.mode in (QuantMode.int8, QuantMode.dynamic, QuantMode.mixed):
        candidate, quant_info = Quantizer(cfg, runner, fp32, evals["fp32"], evals["fp16"], t,
                                          splits.evaluation, splits.calibration).run()
    else:
        candidate = {QuantMode.none: fp32, QuantMode.fp16: fp16,
                     QuantMode.bf16: fp32}[cfg.quant.mode]  # bf16: a precision, not a file
    models = {"export": exported, "fp32": fp32, "fp16": fp16, "candidate": candidate}
    evals["candidate"] = runner.run(plan.evaluation(evaluate, "candidate"), candidate,
                                    label="evaluate[candidate]")
    plan.evaluate_others(runner, evaluate, models)  # runtime=auto: every target, per artifact
    # The benchmark's key covers only what shapes its numbers, not the load-test settings.
    timed = dataclasses.replace(cfg.bench, mode=BenchMode.latency, load=LoadConfig())
    bench = runner.run(Benchmark(splits.evaluation, timed, plan.hw, plan.bench_options()),
                       candidate, fp32=fp32, fp16=fp16, export=exported)
    # runtime=auto picks the target here; the gate and the report see the chosen one.
    evals, bench, targets, deployed = plan.decide(evals, bench, cfg.gate, metric,
                                                  cfg.gate.speedup_batch_size)
    load = None
    if cfg.bench.mode.value != "latency":
        load = runner.run(LoadTest(splits.evaluation, cfg.bench.mode.value, cfg.bench.load,
                                   cfg.slo.p99_ms, deployed, cfg.bench.nonce),
                          candidate, fp32=fp32)
    verdict = gate.judge(evals, bench, cfg.gate, metric, cfg.slo, candidate, environment(hw))
    if not verdict["passed"] and quant_info is not None:  # which float artifact would pass
        from pipeline.quant.auto import float_hint

        float_hint(verdict, evals, bench, plan, cfg.gate, metric, m.name)
    return Outcome(models, evals, bench, verdict, source, load, quant_info, targets, pruning)
