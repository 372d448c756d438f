"""The bill of an ONNX artifact, alone or for every model of a pipeline run.

In: a ``model.onnx``, a batch size, one sample's input shape and a ``HardwareConfig``
(``artifact_bill``); or the recipe's ``Outcome`` and the run's ``Config`` (``run_bill``). Out:
records (``pipeline.bill.record``): the artifact's cost (``pipeline.bill.onnx_cost``), its
roofline on the hardware profile (``pipeline.bill.roofline``) and whether weights plus peak
activations fit the device memory; for a run, one bill per report row with the measured p50
beside the roofline, the source network's parameter count, and a capacity plan for the candidate
(``pipeline.bill.capacity``). The run's bill is priced at the gate's batch size on the padded
sizes (of the input's dynamic axis) the benchmark really timed, so the roofline and the measured
latency describe the same work.
Deliberately not handled: models with several inputs of dynamic size (only the first input's
shape can be given).
"""
from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path

from pipeline.bill import capacity, onnx_cost, roofline
from pipeline.bill.record import Activations, ArtifactBill, HardwareProfile, RunBill, SizeAxis
from pipeline.core.errors import ConfigError


def artifact_bill(model_path: str | Path, batch: int, input_shape, hardware,
                  size=None) -> ArtifactBill:
    """Cost, memory and roofline of one inference of ``model_path`` at ``batch``; ``input_shape``
    is one sample's shape without the batch (None: the model's static sizes, with ``size``'s
    dynamic axis at the size the benchmark fed it: ``onnx_cost.input_shapes``)."""
    cost = onnx_cost.analyse(model_path, batch, input_shape, size)
    ops = cost.pop("ops")
    activations = Activations(**cost.pop("activations"))
    # What must be resident: weights and other constants, plus the activations alive at once.
    memory = cost["parameter_bytes"] + cost["other_constant_bytes"] + activations.peak_bytes
    return ArtifactBill(
        **{**cost, "unknown_shapes": tuple(cost["unknown_shapes"])}, batch=batch,
        hardware=hardware.name, activations=activations,
        roofline=roofline.estimate(ops, cost["compulsory_bytes"], hardware), memory_bytes=memory,
        fits=memory <= hardware.memory_gb * 1e9 if hardware.memory_gb is not None else None)


def sample_shape(key, sizes: list[int] | None = None) -> list[int] | None:
    """The task's representative sample (its contract's ``representative``: one sample of the
    first input, without the batch), its dynamic size axis replaced by the median of ``sizes``
    rounded to the task's ``size_multiple``. None when the task declares none."""
    from pipeline.models import task

    try:
        t = task(key)
    except ConfigError:  # a bill-only model (an LLM shape): no sample
        return None
    shape = list(getattr(t, "representative", None) or []) or None
    if shape is not None and sizes:
        name, axis = t.size_axis
        if name == t.inputs[0].name:
            step = getattr(t, "size_multiple", 1)
            shape[axis - 1] = int(step * round(statistics.median(sizes) / step))
    return shape


def run_bill(outcome, cfg, constant_axes=()) -> RunBill:
    """The bill section of a pipeline report: every report row's model at the gate's batch.
    ``constant_axes``: (input, axis, size) of the axes every benchmarked sample had at one size
    (``pipeline.measure.bench_record.InputContract.constant_axes``)."""
    batch = cfg.gate.speedup_batch_size
    batches = outcome.bench.meta["batches"]
    timed = batches[str(batch)]
    axis = outcome.bench.meta.get("size_axis") or {}
    # batched on the batch axis alone (every other axis fixed, silero-vad's [batch, 576]): the
    # "sizes" the benchmark bucketed are batch sizes, no input size to bill at or plan for
    by_size = axis.get("axis") != 0
    sizes = _sizes(timed, outcome.label_at(batch)) if by_size else []
    shape = sample_shape(outcome.run.key, sizes)  # the run's key: the model is not hashed again
    # A task that declares no representative sample (a user's ONNX file, an encoder, the mobile
    # recognizer) is billed at the median size the benchmark fed its dynamic axis
    size = (axis["input"], axis["axis"], int(statistics.median(sizes))) \
        if shape is None and sizes and axis.get("input") else None
    # and at the size every sample had on an axis the model leaves dynamic (a height of 48)
    same = [c for c in constant_axes if c[1] != size[1]] if size is not None else []
    models = {}
    for role, art in outcome.models.items():
        bill = artifact_bill(art.model, batch, shape, cfg.hardware,
                             [size, *same] if size and same else size)
        lab = outcome.label_at(batch) if role == "candidate" else role  # the shipped one's seat
        p50 = timed["latency_ms"].get(lab, {}).get("p50")
        models[role] = measured_beside(bill, p50)
    measured = {int(b): {"p99_ms": at["latency_ms"][outcome.label_at(b)]["p99"],
                         "throughput": at["latency_ms"][outcome.label_at(b)]["throughput"]}
                for b, at in batches.items()}
    largest = max((w for b, at in batches.items() for w in _sizes(at, outcome.label_at(b))),
                  default=None) if by_size else None
    first = next(iter(models.values()), None)
    return RunBill(
        batch=batch, input_shape=[batch, *shape] if shape else
        (next(iter(first.inputs.values()), None) if first else None),
        size_from=("median padded size of the benchmarked batches' dynamic axis" if sizes
                   else "the task's representative sample" if shape
                   else "the model's own shape (only its batch axis is dynamic)"),
        size_axis=SizeAxis(*size) if size else None,
        hardware=_hardware_summary(cfg.hardware),
        source_parameters=outcome.source.meta.get("parameters"), models=models,
        capacity=capacity.plan(measured, cfg.slo, cfg.hardware.price_per_hour, largest))


def measured_beside(bill: ArtifactBill, p50_ms: float | None) -> ArtifactBill:
    """The bill with the p50 measured on its hardware, and how far above the floor that is."""
    bound = bill.roofline.bound_ms
    return replace(bill, measured_p50_ms=p50_ms,
                   measured_over_bound=p50_ms / bound if p50_ms and bound else None)


def _sizes(timed: dict, label: str = "candidate") -> list[int]:
    """The padded sizes of the dynamic axis the benchmark timed at one batch size, for the
    model timed under ``label``."""
    if "input_widths" in timed:
        return list(timed["input_widths"])
    return [r["size"] for r in timed.get("per_size", {}).get(label, [])]


def _hardware_summary(hw) -> HardwareProfile:
    return HardwareProfile(hw.name, hw.kind.value, hw.memory_gb, hw.memory_bandwidth_gbs,
                           {k: v for k, v in vars(hw.peak_tflops).items() if v is not None},
                           hw.price_per_hour, hw.source)
