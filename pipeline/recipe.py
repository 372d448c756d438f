"""The recipe: the order of work, top to bottom. Config only picks options.

load -> export -> optimize -> (fp16 baseline) -> (quantize) -> evaluate each -> benchmark -> gate.
In: a ``Config`` and a ``Runner``. Out: the artifacts by role, the evaluations, the benchmark and
the gate verdict. Publishing and the report are done by ``__main__`` with what this returns.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from pipeline import gate
from pipeline.artifact import sha256_file
from pipeline.env import environment
from pipeline.config import BenchMode, Config, LoadConfig, QuantMode
from pipeline.errors import StageError
from pipeline.models import task
from pipeline.stages.benchmark import Benchmark
from pipeline.stages.evaluate import Evaluate
from pipeline.stages.export import Export
from pipeline.stages.fp16 import ToFp16
from pipeline.stages.load import Load
from pipeline.stages.loadtest import LoadTest
from pipeline.stages.optimize import Optimize
from pipeline.stages.quantize import Quantize

OPSET = 18  # torch's exporter implements 18 natively; >= 13 is needed for per-channel QDQ


@dataclass
class Outcome:
    models: dict        # role -> Artifact: export, fp32, fp16, candidate
    evals: dict         # role -> evaluate Artifact
    bench: object
    verdict: dict
    source: object      # the load artifact
    load: object = None  # the loadtest artifact (bench.mode=load or soak)


def recipe(cfg: Config, runner) -> Outcome:
    m, hw = cfg.model, cfg.hardware.runtime()  # stages see how to run, not the datasheet
    t = task(m.name)
    checkpoint_sha = None
    if m.checkpoint is not None:
        if not Path(m.checkpoint).is_file():
            raise StageError(f"model.checkpoint={m.checkpoint}: file not found")
        checkpoint_sha = sha256_file(Path(m.checkpoint))
    source = runner.run(Load(m.name, m.checkpoint, checkpoint_sha, tuple(m.widths), m.hidden))
    exported = runner.run(Export(m.name, OPSET, m.parity_samples, cfg.data_dir, hw), source)
    fp32 = runner.run(Optimize(m.name, m.parity_samples, cfg.data_dir, hw), exported)
    fp16 = runner.run(ToFp16(m.name, tuple(cfg.quant.fp16_keep_float32), m.parity_samples,
                             cfg.data_dir, hw), fp32)
    if cfg.quant.mode == QuantMode.int8:
        candidate = runner.run(Quantize(m.name, cfg.quant, m.calibration_samples, cfg.data_dir),
                               fp32)
    else:
        candidate = {QuantMode.none: fp32, QuantMode.fp16: fp16}[cfg.quant.mode]
    models = {"export": exported, "fp32": fp32, "fp16": fp16, "candidate": candidate}

    evaluate = Evaluate(m.name, m.eval_samples, m.eval_batch_size, cfg.data_dir, hw)
    evals = {role: runner.run(evaluate, art, label=f"evaluate[{role}]")
             for role, art in models.items()}
    # The benchmark's key covers only what shapes its numbers, not the load-test settings.
    timed = dataclasses.replace(cfg.bench, mode=BenchMode.latency, load=LoadConfig())
    bench = runner.run(Benchmark(m.name, timed, m.eval_samples, cfg.data_dir, hw),
                       candidate, fp32=fp32, fp16=fp16, export=exported)
    load = None
    if cfg.bench.mode.value != "latency":
        load = runner.run(LoadTest(m.name, cfg.bench.mode.value, cfg.bench.load, cfg.slo.p99_ms,
                                   m.eval_samples, cfg.data_dir, hw), candidate, fp32=fp32)
    verdict = gate.judge(evals, bench, cfg.gate, t.PRIMARY_METRIC, cfg.slo, candidate,
                         environment(hw))
    return Outcome(models, evals, bench, verdict, source, load)
