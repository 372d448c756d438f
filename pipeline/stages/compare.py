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
    task: str
    batch_size: int
    eval_samples: int
    data_dir: str
    hardware: object
    min_rounds: int = 100
    max_seconds: float = 20.0
    name = "compare"
    version = 2
    hardware_dependent = True

    def run(self, parent, out_dir: Path, other) -> dict:
        from pipeline import runtimes
        from pipeline.measure import timing
        from pipeline.models import task

        t = task(self.task)
        ds, _ = t.dataset("evaluation", self.eval_samples, self.data_dir)
        b = self.batch_size
        inputs = [next(t.batches(ds.select(range(k * b, (k + 1) * b)), b))[1]
                  for k in range(min(8, max(1, len(ds) // b)))]
        # On the target's runtime and precision (runtime=auto: the primary one, as every step of
        # the quantization search): an INT8 kernel that loses on ONNX Runtime may win on OpenVINO.
        fns = {role: runtimes.load(a.model, self.hardware).run for role, a in (("a", parent), ("b", other))}
        times, info = timing.head_to_head(fns, inputs, [("b", "a")], self.min_rounds,
                                          self.max_seconds, 0.02)
        return {"a_over_b_speedup": timing.ratio_ci(times["b"], times["a"]), **info}
