"""fuse: a transformer encoder's graph fused by ``onnxruntime.transformers`` (the FP32 baseline).

In: an ``export`` artifact and the encoder's shape from its folder's ``config.json`` (model type
for the optimizer, attention heads, hidden size). Out: ``model.onnx`` with attention, skip and
bias LayerNorm, GELU and embedding LayerNorm fused into ONNX Runtime's contrib ops, each fusion
with its count (``get_fused_operator_statistics``); an attention the optimizer left unfused
(MPNet's relative position bias) then fused by ``pipeline.stages.attention`` and counted as
``MultiHeadAttention``, its record under ``attention``; residual LayerNorms then made flat where
that is faster on the machine (``pipeline.stages.norms``, record under ``norms``); node counts by op type before and
after, and parity against the export (max abs difference; the task's own agreement test: cosine for
embeddings, argmax for classifiers). This stage stands where ``optimize`` stands for other
models: ``opt_level=0`` applies only the offline fusions, so ONNX Runtime still does its own
graph optimizations when it loads the file on the target.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pipeline.core.errors import StageError
from pipeline.engine.runner import CHECKS_ONLY
from pipeline.measure.fusion_record import attention_blocks, attention_fused
from pipeline.stages.attention import checked
from pipeline.stages.norms import flattened_if_faster
from pipeline.stages._parity import compare, node_counts, require


UNFUSED_BY_CHOICE = ("left unfused: MultiHeadAttention was timed no faster than the unfused "
                     "attention on this machine (stage compare[attention])")


@dataclass(frozen=True)
class Fuse:
    data: object           # DataSplit: the samples parity is checked on
    model_type: str        # onnxruntime.transformers' model type (bert for BERT-like encoders)
    num_heads: int
    hidden_size: int
    hardware: object = field(metadata=CHECKS_ONLY)  # runs its checks: not in the key
    tolerance: float = 1e-3
    # False: leave an attention the optimizer did not fuse as it is (the recipe timed the
    # pipeline's MultiHeadAttention no faster on this machine, pipeline/recipes/main.py)
    attention: bool = True
    name = "fuse"
    version = 3  # 3: residual norms flat where SkipLayerNormalization is slower (pipeline.stages.norms)
    hardware_dependent = True  # 3: that choice is timed on the machine

    def run(self, parent, out_dir: Path) -> dict:
        import logging
        import tempfile

        import onnx
        from onnxruntime.transformers.optimizer import optimize_model

        from pipeline.models import task
        from pipeline.runtimes import onnxruntime as ort

        # the optimizer logs every pattern it tried and missed at WARNING
        logging.getLogger("onnxruntime.transformers").setLevel(logging.ERROR)
        try:
            fused = optimize_model(str(parent.model), model_type=self.model_type,
                                   num_heads=self.num_heads, hidden_size=self.hidden_size,
                                   opt_level=0, use_gpu=False)
        except Exception as e:  # noqa: BLE001 - the optimizer's errors: one line naming it
            raise StageError(f"transformer fusion ({self.model_type}, {self.num_heads} heads, "
                             f"hidden {self.hidden_size}) failed: {type(e).__name__}: "
                             f"{str(e).splitlines()[0][:200] if str(e) else ''}") from None
        stats = {op: int(n) for op, n in fused.get_fused_operator_statistics().items() if n}
        target = out_dir / "model.onnx"
        t = task(self.data.task)
        ds = t.dataset(self.data)
        attention = None
        with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
            optimized, staged = Path(tmp) / "optimized.onnx", Path(tmp) / "attention.onnx"
            fused.save_model_to_file(str(optimized))
            if not self.attention:
                attention = {"fused": 0, "why_not": UNFUSED_BY_CHOICE, "parity": None}
                staged = optimized
            elif not {"Attention", "MultiHeadAttention"} & set(stats):
                attention = checked(optimized, staged, self.num_heads, t, ds, self.hardware)
                if attention["fused"]:
                    stats["MultiHeadAttention"] = attention["fused"]
            else:
                staged = optimized
            norms = flattened_if_faster(staged, target, t, ds, self.hardware)
        onnx.checker.check_model(str(target))
        nodes_before = node_counts(parent.model)
        blocks, done = attention_blocks(nodes_before) or 0, attention_fused(stats)
        if 0 < done < blocks:  # the report says it too (pipeline.report.run._fusion)
            print(f"  fuse: attention fused in {done} of {blocks} attention blocks; the other "
                  f"{blocks - done} run unfused", flush=True)

        before = ort.session(parent.model, self.hardware)
        after = ort.session(target, self.hardware)
        parity = compare(lambda x: ort.run(before, x), lambda x: ort.run(after, x), t, ds)
        require(parity, self.tolerance, "fused model differs from the export")
        return {"fusions": dict(sorted(stats.items())), "attention": attention, "norms": norms,
                "nodes_before": nodes_before, "nodes": node_counts(target),
                "parity_vs_export": parity, "model_type": self.model_type,
                "num_heads": self.num_heads, "hidden_size": self.hidden_size}
