"""The pruning part of the report: what pruning did, on rows of its own.

In: the recipe's ``Outcome`` of a ``prune=channels`` run (its ``pruning`` artifacts: load, prune
and the unpruned export). Out: a typed ``PruningSection`` for report.json and the manifest,
and Markdown lines for report.md.
One row per step, so each effect stands alone: the unpruned network, the pruned one before
recovery, and the recovered one, each with parameters, MACs, ONNX size and the task's metrics on
the prune stage's held-out samples (scored in torch). The pruned network's ONNX size is the export
row's; the unpruned one's is a real export of the unpruned network (``export[unpruned]``). Latency
of pruned against unpruned is measured by ``make bench`` side by side, not here: a single run holds
only one of them.
"""
from __future__ import annotations

from dataclasses import dataclass

from pipeline.core.json_record import from_json, rest


@dataclass(frozen=True)
class PruneStep:
    """One row: a network's size and its held-out metrics."""
    step: str
    parameters: int
    macs: float
    onnx_mb: float
    metrics: dict = rest()   # held-out metric name -> value, beside the fields in the JSON


@dataclass(frozen=True)
class HeldOut:
    seed: int
    samples: int
    what: str                # the samples in words (the task's own), else "N samples"


@dataclass(frozen=True)
class Recovery:
    """The recovery fine-tune as the prune stage ran it (its threads, loss, speed: ``rest``)."""
    steps: int
    seconds: float
    precision: str = "bfloat16"    # absent in records from before it was recorded
    rest: dict = rest()


@dataclass(frozen=True)
class PruningSection:
    """report.json's ``pruning`` (and the manifest's), key for key as runs have written it."""
    config: dict                           # the prune group as the run set it
    rows: tuple[PruneStep, ...]            # unpruned, pruned before recovery, recovered
    layers: tuple[tuple[str, int, int], ...]  # (layer, channels before, after), network order
    params: dict                           # the pruned network's params
    metrics: tuple[str, ...]               # the held-out metrics, in the rows' order
    macs_per: str                          # what one MAC count is of (the task's input)
    macs_reduction: float
    parameters_reduction: float
    onnx_size_reduction: float
    held_out: HeldOut
    recover: Recovery
    artifact: str                          # the prune stage's digest


@dataclass(frozen=True)
class _HeldOutScores:
    seed: int
    samples: int
    unpruned: dict
    pruned: dict
    recovered: dict
    what: str | None = None  # absent in records from before it was recorded


@dataclass(frozen=True)
class _PruneMeta:
    """What the report reads of the prune stage's record (``pipeline.stages.prune``)."""
    parameters: int
    parameters_before: int
    macs: float
    macs_before: float
    macs_reduction: float
    macs_per: str
    layers: tuple[tuple[str, int, int], ...]
    held_out: _HeldOutScores
    recover: Recovery
    others: dict = rest()    # what the report does not read (params, source)


def section(outcome) -> PruningSection:
    """The section of a ``prune=channels`` run (``outcome.pruning``: its artifacts)."""
    import json

    p = outcome.pruning
    meta = from_json(_PruneMeta, p.prune.meta)  # strict: the recovery keeps its every key
    params = json.loads((p.prune.path / "net.json").read_text())["params"]
    cfg = p.prune.config.get("prune", {})
    unpruned_mb = p.unpruned_export.model.stat().st_size / 1e6
    pruned_mb = outcome.models["export"].model.stat().st_size / 1e6
    held, rec = meta.held_out, meta.recover
    rows = (
        PruneStep("load (unpruned)", meta.parameters_before, meta.macs_before, unpruned_mb,
                  dict(held.unpruned)),
        PruneStep(f"prune (ratio {cfg.get('ratio')}, {cfg.get('importance')}, round to "
                  f"{cfg.get('round_to')}), before recovery", meta.parameters, meta.macs,
                  pruned_mb, dict(held.pruned)),
        PruneStep(f"recovery ({rec.steps} steps, {rec.seconds} s, {rec.precision})",
                  meta.parameters, meta.macs, pruned_mb, dict(held.recovered)),
    )
    return PruningSection(
        config=cfg, rows=rows, layers=meta.layers, params=params, metrics=tuple(held.unpruned),
        macs_per=meta.macs_per, macs_reduction=meta.macs_reduction,
        parameters_reduction=1 - meta.parameters / meta.parameters_before,
        onnx_size_reduction=1 - pruned_mb / unpruned_mb,
        held_out=HeldOut(held.seed, held.samples, held.what or f"{held.samples} samples"),
        recover=rec, artifact=p.prune.digest)


def markdown(section: PruningSection, units: dict | None = None) -> list[str]:
    """``units``: each metric's unit (from the report's metric specs), for the column heads."""
    units = units or {}
    names = section.metrics
    heads = "".join(f" held-out {n} {units.get(n, '')}".rstrip() + " |" for n in names)
    lines = ["", "## Pruning", "",
             f"| step | parameters | MACs ({section.macs_per}) | ONNX MB |{heads}",
             "|---|---|---|---|" + "---|" * len(names)]
    for r in section.rows:
        lines.append(f"| {r.step} | {r.parameters:,} | {r.macs / 1e6:.1f} M | "
                     f"{r.onnx_mb:.2f} |" + "".join(f" {r.metrics[n]:.2f} |" for n in names))
    layers = ", ".join(f"{name} {b}->{a}" for name, b, a in section.layers)
    params = ", ".join(f"{k} {v}" for k, v in section.params.items())
    lines += ["", f"Parameters -{100 * section.parameters_reduction:.1f} %, MACs "
              f"-{100 * section.macs_reduction:.1f} %, ONNX size "
              f"-{100 * section.onnx_size_reduction:.1f} %. Held-out: "
              f"{section.held_out.what}, scored in torch.",
              f"Channels per pruned layer (LSTM: hidden units per direction): {layers}"
              + (f"; the network's params now: {params}" if params else "")
              + ". Latency against the unpruned network: one run of each, side by side (`make "
              "bench`, section `pruning`)."]
    return lines
