"""Nodes that compute indices, not activations: kept float by static INT8.

Why: a model may compute integer positions in float, then cast them (MPNet's relative-position
buckets: ``Abs``, ``Div``, ``Log``, ``Mul``, ``Add``, ``Cast`` to int64, ``Min``, then a
``Gather`` of the bias table). Static INT8 puts Q/DQ pairs on those float ops like on any
activation; the rounding moves a bucket by one or, when a range is wrong, casts garbage
(``indices element out of data bounds, idx=-9223372036854775784``). Those nodes cost nothing at
run time and their values are exact integers: quantizing them can only break the model.

In: an ONNX model (graph only). Out: the names of the nodes whose every output reaches only casts
to a non-float type or other such nodes: the float part of an index computation. A node whose
output also feeds the activation path (or is a graph output) is never in it.
"""
from __future__ import annotations

FLOATS = {1, 10, 11, 16}  # FLOAT, FLOAT16, DOUBLE, BFLOAT16 (onnx.TensorProto)


def index_nodes(model) -> list[str]:
    """Names of the nodes that only feed casts to integers or booleans (transitively)."""
    graph = model.graph
    consumers: dict[str, list] = {}
    for n in graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    outputs = {o.name for o in graph.output}

    def to_index(n) -> bool:
        return n.op_type == "Cast" and next(
            (a.i for a in n.attribute if a.name == "to"), 1) not in FLOATS

    found: set[str] = set()
    changed = True
    while changed:  # grows backwards from the casts until nothing more qualifies
        changed = False
        for n in graph.node:
            if n.name in found or to_index(n) or not n.output:
                continue
            uses = [c for o in n.output for c in consumers.get(o, [])]
            if (uses and not any(o in outputs for o in n.output)
                    and all(to_index(c) or c.name in found for c in uses)):
                found.add(n.name)
                changed = True
    return [n.name for n in graph.node if n.name in found]
