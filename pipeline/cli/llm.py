"""``python -m pipeline model=hf model.path=<decoder folder or .gguf> data=...``: a decoder LLM.

The command line's decoder path, after compose: the folder checked (or the GGUF file converted
once), the decoder recipe (``pipeline.recipes.decoder``), the report, and publishing of the whole
folder onnxruntime-genai loads, with its evidence, when the gate passes. Exit codes as for
every run (README): 0 passed (and published), 1 the gate failed, 2 a bad config, 3 a stage
failed.
"""
from __future__ import annotations

from pipeline.core.errors import ConfigError
from pipeline.cli.finish import finish, run_recipe


def preflight(cfg):
    """What composing cannot know, before anything is written; returns the ``Decoder``."""
    import onnxruntime

    from pipeline.models.decoder import context, lengths, resolve
    from pipeline.recipes.decoder import check_mode

    check_mode(cfg)
    if cfg.slo.mode.value == "serve":  # the server does not generate yet
        raise ConfigError("slo.mode=serve: decoders are not served yet; use slo.mode=model")
    if cfg.hardware.provider != "CPUExecutionProvider" or \
            cfg.hardware.provider not in onnxruntime.get_available_providers():
        raise ConfigError(f"hardware={cfg.hardware.name}: a decoder is compiled and timed on this "
                          "machine's CPU (hardware=cpu)")
    if cfg.metric is not None:
        raise ConfigError(f"metric={cfg.metric.name.value}: a decoder is scored on its text "
                          "(perplexity, next-token agreement with FP32); leave metric= unset")
    # a limit for a metric the decoder does not report: refused now, not after every stage ran
    from pipeline.metrics.limits import limits
    from pipeline.recipes.decoder import METRICS

    limits(cfg.gate.max_accuracy_drop, METRICS)
    decoder = resolve(cfg.model.path, cfg.workdir)
    lengths(cfg.quant.decoder, cfg.model.params, context(decoder))
    return decoder


def run(cfg) -> int:
    from pipeline.recipes.decoder import recipe
    from pipeline.report import decoder as rep

    decoder = preflight(cfg)
    print(f"pipeline: {cfg.model.name} (decoder {decoder.architecture}) "
          f"quant={cfg.quant.mode.value} hardware={cfg.hardware.name}")
    runner, out, t0 = run_recipe(cfg, recipe, decoder)
    return finish(cfg, runner, t0, out, rep.shipment(cfg, out, rep.report(cfg, out, runner.record)))
