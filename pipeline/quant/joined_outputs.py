"""Graph outputs joined from tensors of very different ranges: the join, and every node between
it and the output, kept float by static INT8.

Why: one INT8 scale spans a Concat's output. A detector's head (YOLOv8's, as nudenet ships it)
joins box coordinates (0 to 320 pixels) and class scores (0 to 1) into its one output; one scale
of 1.26 rounded every score below 0.63 to 0 and every other to 1.26, and the INT8 model found 19
of the 60 detections its float model finds, while a cosine over the whole output (the
coordinates dominate it) read 0.999. An input whose range is a sixteenth of the widest keeps fewer
than 4 of the 8 bits. The join need not write the output itself: an NMS-free YOLO26 joins its
boxes (-190 to 810 pixels) and scores at the end of its head, then transposes, splits and picks
its best rows (Transpose, Split, ReduceMax, TopK, GatherElements) before its output; each of
those ops quantized carries the joined tensor's one scale on, and its INT8 model found none of
the 10,848 detections its float model found. So the join stays float with every node after it up
to the graph's outputs, unless a weighted op comes first: that op quantizes the joined tensor
anyway (its input), and what follows it has ranges of its own. The inputs keep their own scales
(a Q/DQ pair each), so the scores keep 1/255 steps.

In: an ONNX model (graph only) and the calibrated ranges ``{tensor: (lowest, highest)}``. Out: the
names of the nodes kept float: each such Concat, then the nodes on its way to an output.
"""
from __future__ import annotations

import math

# the widest input's magnitude over the narrowest's from which the narrow one keeps under 4 bits:
# the same ratio by which the agreement metric splits an output into parts
from pipeline.metrics.agreement import RANGE_RATIO as RATIO

# ops with weights of their own: past one of them, a tensor's range is new (and its input is
# quantized whatever is kept float before it)
WEIGHTED = {"Conv", "ConvTranspose", "MatMul", "Gemm", "Einsum", "Attention", "LSTM", "GRU", "RNN"}


def joined_outputs(model, ranges: dict[str, tuple[float, float]]) -> list[str]:
    nodes = list(model.graph.node)
    out_side = _leading_out(nodes, {o.name for o in model.graph.output})
    consumers: dict[str, list[int]] = {}
    for k, n in enumerate(nodes):
        for t in n.input:
            consumers.setdefault(t, []).append(k)
    kept: dict[int, None] = {}
    for k, n in enumerate(nodes):
        if n.op_type != "Concat" or not n.name or k not in out_side or not _far_apart(n, ranges):
            continue
        kept[k] = None
        stack = [k]
        while stack:  # the join's ways out, within the nodes that lead out
            for c in (c for t in nodes[stack.pop()].output for c in consumers.get(t, ())):
                if c in out_side and c not in kept:
                    kept[c] = None
                    stack.append(c)
    return [nodes[k].name for k in sorted(kept) if nodes[k].name]


def _leading_out(nodes: list, outputs: set[str]) -> set[int]:
    """The nodes (by index) from which a graph output is reached without crossing a weighted op
    (themselves not weighted), walked back from the outputs."""
    producer = {t: k for k, n in enumerate(nodes) for t in n.output}
    found = {producer[t] for t in outputs if t in producer
             and nodes[producer[t]].op_type not in WEIGHTED}
    stack = list(found)
    while stack:
        for t in nodes[stack.pop()].input:
            k = producer.get(t)
            if k is not None and k not in found and nodes[k].op_type not in WEIGHTED:
                found.add(k)
                stack.append(k)
    return found


def _far_apart(node, ranges) -> bool:
    spans = [max(abs(lo), abs(hi)) for lo, hi in (ranges[t] for t in node.input if t in ranges)]
    spans = [s for s in spans if math.isfinite(s) and s > 0]
    return len(spans) >= 2 and max(spans) >= RATIO * min(spans)
