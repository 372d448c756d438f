"""A model whose graph runs one sample at a time: the run's batch sizes set to what it can run.

In: the run's ``Config`` and its task (``max_batch``: 1 for an ONNX file that declares a batch of
1 and fails at batch 2, ``pipeline.models.onnx_file``). Out: the config to run, with every batch
size the run would feed above that limit lowered to it, and one line naming each change (None
when nothing changed). Done once, before any stage: the stages' keys, the report's config and
the Triton config written from the evidence then all say batch 1, and no stage is asked for a
batch the graph cannot run. The task's ``batches()`` and ``example()`` never exceed the limit
either, so a stage's own fixed batch (the SQNR probe's 32) holds too.

Why not refuse: static exports bake the batch into the graph (a Reshape to [1, 197, 12, 64], a
detector's NMS tail), and a deployment engineer with such a file still needs it gated, timed at
the batch it serves and published; the speed gate then judges batch 1, what it will serve.
"""
from __future__ import annotations

import dataclasses


def within(cfg, task) -> tuple[object, str | None]:
    """``(cfg, note)``: ``cfg`` with its batch sizes at most ``task.max_batch``."""
    limit = getattr(task, "max_batch", None)
    if not limit:
        return cfg, None
    changed: list[str] = []

    def cap(section: str, obj, **values):
        """``obj`` with each field in ``values`` (a size or a list of sizes) capped."""
        new = {}
        for name, value in values.items():
            capped = (sorted({min(v, limit) for v in value}) if isinstance(value, list)
                      else min(value, limit))
            if capped != value:
                changed.append(f"{section}.{name}={value} -> {capped}")
                new[name] = capped
        return dataclasses.replace(obj, **new) if new else obj

    b = cfg.bench
    bench = cap("bench", b, batch_sizes=list(b.batch_sizes))
    bench = dataclasses.replace(bench, load=cap("bench.load", b.load, max_batch=b.load.max_batch))
    out = dataclasses.replace(
        cfg, bench=bench,
        model=cap("model", cfg.model, eval_batch_size=cfg.model.eval_batch_size),
        quant=cap("quant", cfg.quant, calibration_batch_size=cfg.quant.calibration_batch_size),
        gate=cap("gate", cfg.gate, speedup_batch_size=cfg.gate.speedup_batch_size),
        slo=cap("slo", cfg.slo, batch_size=cfg.slo.batch_size))
    if not changed:
        return cfg, None
    return out, (f"the model runs at most {limit} sample(s) per run: " + ", ".join(changed))
