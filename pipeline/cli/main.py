"""``python -m pipeline [overrides]``: compile, gate, publish and report one model: the CLI only.

Exit codes: 0 the candidate passed its gate (and was published when a registry is set),
1 the gate failed (candidate and report kept), 2 bad config, 3 a stage failed or the machine
refused (a read-only or full disk), 4 a bug. Expected failures print one line without a
traceback; a bug keeps it.
``python -m pipeline -m a=x,y ...`` runs a sweep instead (``pipeline.cli.sweep.launch``, docs/sweeps.md).
The steps: compose, preflight, the recipe (``pipeline.recipes.main``), the report and publishing
(``pipeline.report.manifest``).
"""
from __future__ import annotations

import sys
from pathlib import Path

from pipeline.core import interrupt
from pipeline.engine.compose import compilable_models, compose
from pipeline.core.errors import ConfigError, cli
from pipeline.cli.finish import finish, run_recipe


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    from pipeline.cli.sweep import launch as sweep

    if sweep.is_sweep(argv):  # -m: a sweep through Hydra's multirun (docs/sweeps.md)
        return cli(sweep.main, argv, __doc__)
    with interrupt.handled():  # Ctrl-C, SIGTERM: one line, a report, exit 130/143
        return cli(_run, argv, __doc__)


def _preflight(cfg):
    """What composing cannot know: whether this model compiles and this runtime has the provider.
    Checked before anything is written, so such a mistake ends like any other config error.
    Returns the config to run (quant=auto on an already-quantized model runs as quant=none) and
    the run's facts (``pipeline.models.run``)."""
    if cfg.model.llm is not None:
        raise ConfigError(f"model={cfg.model.name}: a bill-only LLM description (python -m "
                          f"pipeline.bill model={cfg.model.name}); compilable models: "
                          f"{', '.join(compilable_models())}")
    checkpoint = cfg.model.checkpoint
    if checkpoint is not None and not Path(checkpoint).is_file():
        raise ConfigError(f"model.checkpoint={checkpoint}: "
                          f"{'not a file' if Path(checkpoint).exists() else 'no such file'} "
                          f"(from {Path.cwd()}; null = a seeded random network)")
    if checkpoint is not None:
        from pipeline.models.weights import checkpoint as safetensors_only

        safetensors_only(checkpoint, "model.checkpoint")  # a pickle is refused, never read
    import onnxruntime

    available = onnxruntime.get_available_providers()
    if cfg.hardware.provider not in available:
        raise ConfigError(f"hardware={cfg.hardware.name}: provider {cfg.hardware.provider} is not "
                          f"available in this onnxruntime ({', '.join(available)}); the profile "
                          "is data for python -m pipeline.bill")
    from pipeline import runtimes

    runtimes.check(cfg.hardware, cfg.quant.mode)  # runtime installed, precision on this CPU
    from pipeline.models import check_params
    from pipeline.models.run import facts
    from pipeline.task.contract import check

    # The model, its data and metric must fit each other before any stage runs: a file that is
    # not ONNX, a factory that does not import, a metric that does not fit the outputs.
    check_params(cfg.model.source, cfg.model.params)  # a built-in network's own architecture
    run = facts(cfg)  # the user's files hashed here, once; everything after reads `run`
    t = run.task
    problems = check(t)
    if problems:
        raise ConfigError(f"model={cfg.model.source}: does not meet the task contract: "
                          + "; ".join(problems))
    from pipeline.metrics.limits import limits

    notes = list(getattr(t, "warnings", ()))
    from pipeline.quant.given import already_quantized

    cfg, note = already_quantized(cfg, t)  # quant=int8 on a quantized model: refused here
    notes += [note] if note else []
    from pipeline.task.batch_limit import within

    cfg, note = within(cfg, t)  # a graph of batch 1 only: every batch size the run uses is 1
    if note:
        notes.append(note)
        t.warnings.append(note)  # and the report says so
    try:
        limits(cfg.gate.max_accuracy_drop, t.metrics)  # each judged metric reported, with a limit
    except ConfigError as e:  # still one line: with the warning that says why it is judged
        raise ConfigError("; ".join([str(e), *notes])) from None
    for line in notes:
        print(f"pipeline: warning: {line}", file=sys.stderr)
    if cfg.prune.method.value != "none":  # ignored names, whole layers removed, the trace
        from pipeline.prune.helper import preflight

        preflight(t, cfg.prune, cfg.model.params)
    return cfg, run


def _run(argv: list[str]) -> int:
    cfg = compose(argv)
    from pipeline.config import DecoderQuant
    from pipeline.config.decoder_files import is_decoder

    if cfg.model.source == "hf" and is_decoder(cfg.model.path):  # a decoder LLM: pipeline.cli.llm
        from pipeline.cli import llm

        return llm.run(cfg)
    if cfg.quant.decoder != DecoderQuant():
        raise ConfigError(f"quant.decoder: weight-only settings for decoder LLMs; model="
                          f"{cfg.model.source} {cfg.model.path or cfg.model.name} is not one (a "
                          "causal-LM folder or a .gguf file)")
    cfg, run = _preflight(cfg)
    serve_slo = cfg.slo.mode.value == "serve"
    if serve_slo:  # hook: slo.mode=serve (pipeline/serve/slo.py), a task the server reads
        from pipeline.serve import slo as served_slo

        served_slo.preflight(run.task)
    from pipeline.recipes.main import recipe
    from pipeline.report import manifest as ship

    # model.name is the registry's name (ocr_tiny publishes as "ocr"), not the model= option
    print(f"pipeline: {cfg.model.name} (model.source={cfg.model.source}) "
          f"quant={cfg.quant.mode.value} hardware={cfg.hardware.name}")
    runner, out, t0 = run_recipe(cfg, recipe, run)
    if serve_slo:  # hook: the candidate behind the real server; its p99 joins the verdict
        served_slo.judge(cfg, out)
    body = ship.body(cfg, out, runner.record)
    return finish(cfg, runner, t0, out, ship.shipment(cfg, out, body))


if __name__ == "__main__":
    raise SystemExit(main())
