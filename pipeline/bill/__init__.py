"""The bill: memory, compute and capacity, before anyone buys a card.

In: a decoder-only LLM's shape, or any ONNX artifact with a batch size and an input shape; a
hardware profile (``conf/hardware``); service targets (``conf/slo``). Out: plain dicts and tables:
weights, KV cache and activations against device memory, FLOPs, a roofline bound on latency, and
the instances and cost a target needs. One module per question: ``llm`` (the LLM formulas),
``onnx_cost`` and ``shapes`` (what an ONNX graph costs), ``roofline``, ``capacity``, ``artifact``
(the bill of a model file or of a pipeline run), ``render`` (tables), ``token_bytes`` (bytes a
decoder reads per token). This CPU's measured profile is ``pipeline.measure.probe`` and
``pipeline.measure.machine``; the command line ``python -m pipeline.bill`` is
``pipeline.cli.bill``. Deliberately not handled: multi-device splits, and any
number that was not either computed from a formula here or measured.
"""
from __future__ import annotations


def artifact_bill(model_path, batch, input_shape, hardware):
    """See ``pipeline.bill.artifact.artifact_bill`` (imported lazily: onnx is heavy)."""
    from pipeline.bill.artifact import artifact_bill as bill

    return bill(model_path, batch, input_shape, hardware)


def markdown(bill) -> str:
    """The '## Bill' section of a run report, as Markdown text (``bill``: a ``RunBill``, or
    report.json's bill read back)."""
    from pipeline.bill.render import markdown as lines

    return "\n".join(lines(bill))
