"""compare: is model A really faster than model B end to end? A short interleaved A/B timing.

In: two artifacts (``parent`` = A, ``other`` = B) and the batch size. Out: the median of
per-round ratios t_B / t_A with its bootstrap 95 % interval (``pipeline.measure.timing``). The recipe uses
it to confirm a per-node profiling decision: keeping a node float also adds a Quantize/Dequantize
boundary that the node's own profile does not show, so the whole model decides, timed on the
target's runtime. (The per-node profile is ONNX Runtime's: OpenVINO's per-layer counters name
fused layers that do not map one to one back to the ONNX nodes.)
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Compare:
    data: object           # DataSplit: the evaluation samples the batches are cut from
    batch_size: int
    hardware: object
    min_rounds: int = 100
    max_seconds: float = 20.0
    name = "compare"
    version = 5  # 5: the order of models turns once per pass over the inputs (timing.interleaved)
    hardware_dependent = True

    def run(self, parent, out_dir: Path, other) -> dict:
        import numpy as np

        from pipeline import runtimes
        from pipeline.measure import timing
        from pipeline.models import task

        from pipeline.data import real_batches

        t = task(self.data.task)
        b = self.batch_size
        inputs = real_batches.in_order(t, t.dataset(self.data), b)
        # On the target's runtime and precision (runtime=auto: the primary one, as every step of
        # the quantization search): an INT8 kernel that loses on ONNX Runtime may win on OpenVINO.
        fns = {role: runtimes.load(a.model, self.hardware).run for role, a in (("a", parent), ("b", other))}
        times, info = timing.head_to_head(fns, inputs, [("b", "a")], self.min_rounds,
                                          self.max_seconds, 0.02)
        return {"a_over_b_speedup": timing.ratio_ci(times["b"], times["a"]),
                "ms_a": float(np.median(times["a"])), "ms_b": float(np.median(times["b"])), **info}
