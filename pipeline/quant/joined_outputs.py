"""Graph outputs joined from tensors of very different ranges: their Concat kept float by static
INT8.

Why: one INT8 scale spans a Concat's output. A detector's head (YOLOv8's, as nudenet ships it)
joins box coordinates (0 to 320 pixels) and class scores (0 to 1) into its one output; one scale
of 1.26 rounded every score below 0.63 to 0 and every other to 1.26, and the INT8 model found 19
of the 60 detections its float model finds, while a cosine over the whole output (the
coordinates dominate it) read 0.999. An input whose range is a sixteenth of the widest keeps fewer
than 4 of the 8 bits. Only a Concat that writes a graph output gains from staying float: inside
the graph the next weighted op quantizes the joined tensor anyway. Its inputs keep their own
scales (a Q/DQ pair each), so the scores keep 1/255 steps.

In: an ONNX model (graph only) and the calibrated ranges ``{tensor: (lowest, highest)}``. Out: the
names of those Concat nodes.
"""
from __future__ import annotations

import math

# the widest input's magnitude over the narrowest's from which the narrow one keeps under 4 bits:
# the same ratio by which the agreement metric splits an output into parts
from pipeline.metrics.agreement import RANGE_RATIO as RATIO


def joined_outputs(model, ranges: dict[str, tuple[float, float]]) -> list[str]:
    outputs = {o.name for o in model.graph.output}
    joined = []
    for n in model.graph.node:
        if n.op_type != "Concat" or not n.name or not outputs.intersection(n.output):
            continue
        spans = [max(abs(lo), abs(hi)) for lo, hi in (ranges[t] for t in n.input if t in ranges)]
        spans = [s for s in spans if math.isfinite(s) and s > 0]
        if len(spans) >= 2 and max(spans) >= RATIO * min(spans):
            joined.append(n.name)
    return joined
