"""explain: why the INT8 model is as fast as it is, before anyone deploys it.

In: a ``quantize`` artifact and the FP32 baseline (``fp32``). Out: what ONNX Runtime makes of the
INT8 model on this target (Q/DQ pairs left unfused after its graph optimizations, compute ops
still running in float) and a per-node profile of both models on the same real batch: each
node's time in FP32 and in INT8, the gain, and the nodes that run *slower* in INT8. The recipe
keeps those nodes in float (``quant.latency_aware``) and the report shows the table.
What FP32 fuses into one kernel (a Conv and its HardSwish) but INT8 runs as several (QLinearConv,
a float HardSigmoid between Q/DQ, QLinearMul) is compared as a group (``fusion_groups``): node by
node the Conv looks faster and the Mul has no FP32 time at all.

Profiles come from onnxruntime's own profiler (``enable_profiling``) with the deployed graph
optimizations; fused kernels keep the name of the node they came from plus a ``_token_N``
suffix, which is stripped so FP32 and INT8 timings of the same module line up. Each node also
carries the path of the source module it came from where the graph says
(``quant/modules.py``: ``encoder.layer.0.attention.self`` for a fused attention), which the
per-layer table shows. The profiling and graph helpers live in ``measure/profile.py``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pipeline.runtimes.ops import FORMAT_OPS
from pipeline.measure.profile import fusion_groups, op_types, optimized_graph_summary, profile
from pipeline.quant.modules import module_paths

SLOWER_MARGIN = 1.05  # 5 %: below that, profile noise, not a slower kernel


@dataclass(frozen=True)
class Explain:
    data: object           # DataSplit: the evaluation samples the profiled batch is cut from
    batch_size: int
    runs: int
    hardware: object
    name = "explain"
    version = 7  # 7: each node's module path (``module``)
    hardware_dependent = True

    def run(self, parent, out_dir: Path, fp32) -> dict:
        from pipeline.models import task

        from pipeline.data import real_batches

        t = task(self.data.task)
        batch = real_batches.spread(t, t.dataset(self.data), self.batch_size)
        f32 = profile(fp32.model, self.hardware, batch, self.runs)
        i8 = profile(parent.model, self.hardware, batch, self.runs)
        precision = parent.meta.get("precision", {})
        fp32_total = sum(r["ms"] for r in f32.values())
        fp32_ops = op_types(fp32.model)
        groups = fusion_groups(fp32.model, parent.model, f32, i8)
        modules = module_paths(fp32.model, parent.model,
                               prefix=getattr(t, "module_prefix", ""))
        nodes = []
        for name, row in i8.items():
            if row["op"] in FORMAT_OPS or (name not in f32 and name not in groups["host"]):
                continue
            quantized = precision.get(name, "float").startswith("int8")
            host = groups["host"].get(name, name)   # the FP32 kernel this node ran inside
            a, b = (f32[name]["ms"] if name in f32 else 0.0), row["ms"]
            # A group: an FP32 kernel plus the nodes fused into it there (a Conv and its
            # HardSwish), against the same nodes' INT8 kernels and the Q/DQ between them.
            a_group, b_group = groups["fp32_ms"].get(host, a), groups["int8_ms"].get(host, b)
            # Slower: by more than the margin and by more than 0.5 % of the whole model, so
            # profiler noise on a microsecond-sized node does not count; only nodes the
            # quantizer made INT8 can be handed back to float.
            slower = (b_group > a_group * SLOWER_MARGIN and b_group - a_group > 0.005 * fp32_total
                      and quantized)
            fp32_op = f32[name]["op"] if name in f32 else f"{fp32_ops[name]} (fused into {host})"
            row = {"node": name, "module": modules.get(name), "fp32_op": fp32_op,
                   "int8_op": row["op"],
                   "precision": precision.get(name, "float"),
                   "fp32_ms": a, "int8_ms": b, "gain_ms": a - b, "slower_in_int8": slower}
            if host in groups["members"]:
                row["fusion_group"] = {"host": host, "fp32_ms": a_group, "int8_ms": b_group}
            nodes.append(row)
        nodes.sort(key=lambda r: -r["fp32_ms"])
        result = {"batch_size": self.batch_size, "runs": self.runs, "fp32_total_ms": fp32_total,
                  "int8_total_ms": sum(r["ms"] for r in i8.values()),
                  "qdq_overhead_ms": sum(r["ms"] for r in i8.values() if r["op"] in FORMAT_OPS),
                  "nodes": nodes, "slower_in_int8": [r["node"] for r in nodes if r["slower_in_int8"]],
                  **optimized_graph_summary(parent.model, self.hardware)}
        (out_dir / "explain.json").write_text(json.dumps(result, indent=2))
        return result
