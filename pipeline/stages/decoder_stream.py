"""The streaming path for a decoder larger than the memory budget (docs/llm.md, "Models larger
than memory"; the plan: ``pipeline.recipes.decoder_memory``).

``decoder_export_stream``: onnxruntime-genai's model builder writes the decoder's graph, but
never holds its weights: the transformers model is built on the meta device, the tensors that
are not Linear weights (embedding, norms, biases) are read from the checkpoint one at a time,
and each MatMul weight is left in the checkpoint, a placeholder in the graph naming the
checkpoint tensors it is made of (``pipeline.stages._lazy_builder``). No parity check (it would
hold the model in FP32 twice, transformers' and onnxruntime's) and no session: the folder is
what candidates are built from, not a model to run. No FP32 copy is written to disk either.

``weight_only_stream``: each planned MatMul's weight read from the checkpoint as it is
quantized to MatMulNBits (``pipeline.quant.stream_nbits``; byte for byte what ``weight_only``
writes at round to nearest from the FP32 export of the same weights).
Both record the stage child's peak resident memory (``peak_rss_mb``: its own and its children's
high-water marks, as the kernel counts them, in MiB).
"""
from __future__ import annotations

import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.env import peak_rss_mb
from pipeline.core.errors import StageError

@dataclass(frozen=True)
class DecoderExportStream:
    decoder: object        # pipeline.models.decoder.Decoder
    name = "decoder_export_stream"
    version = 3  # 2: the MatMul weights left in the checkpoint (no FP32 export, no bf16
                 # model); 3: the context within a sliding window (decoder_export.build_fp32)
    hardware_dependent = False

    def run(self, parent, out_dir: Path) -> dict:
        from pipeline.stages._lazy_builder import export_graph
        from pipeline.stages.weight_only import node_counts

        mapping = export_graph(self.decoder, out_dir)
        return {"architecture": self.decoder.architecture, "nodes": node_counts(out_dir),
                "parity_vs_transformers": None,  # not checked: it needs FP32 whole, twice
                "matmuls_in_checkpoint": len(mapping["weights"]),
                # what the folder holds itself: every tensor but the MatMul weights
                "weights_bytes": (out_dir / "model.onnx.data").stat().st_size,
                "peak_rss_mb": round(peak_rss_mb(children=True), 1)}


@dataclass(frozen=True)
class WeightOnlyStream:
    plan: tuple            # ((node name, bits), ...): 4 or 8; nodes not named stay float
    block_size: int
    symmetric: bool
    accuracy_level: int    # MatMulNBits' compute type: 0 as built, 4 int8 activations
    name = "weight_only_stream"
    version = 2  # 2: MatMul weights read from the checkpoint
    hardware_dependent = False

    def run(self, parent, out_dir: Path) -> dict:
        from pipeline.quant.stream_nbits import CHECKPOINT_MAP, quantize_folder
        from pipeline.stages.weight_only import node_counts

        try:
            done = quantize_folder(parent.path, out_dir, dict(self.plan), self.block_size,
                                   self.symmetric, self.accuracy_level)
        except ValueError as e:
            raise StageError(f"weight_only_stream: {e}") from None
        for name in parent.files:  # genai_config.json, tokenizer files
            if name not in ("model.onnx", "model.onnx.data", CHECKPOINT_MAP):
                shutil.copy2(parent.path / name, out_dir / name)
        widths, nodes = Counter(b for _, b in self.plan), node_counts(out_dir)
        return {"nodes": nodes, "matmul_bits": {str(b): widths[b] for b in (4, 8)},
                "matmul_float": nodes.get("MatMul", 0),
                "weights_bytes": (out_dir / "model.onnx.data").stat().st_size,
                "largest_weight_bytes": done["largest_weight_bytes"],
                "settings": {"block_size": self.block_size, "symmetric": self.symmetric,
                             "algorithm": "rtn", "accuracy_level": self.accuracy_level},
                "peak_rss_mb": round(peak_rss_mb(children=True), 1)}
