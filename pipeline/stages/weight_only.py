"""weight_only: a decoder's MatMul weights in 4 or 8 bits (onnxruntime's MatMulNBits), per layer.

In: the FP32 decoder folder (``decoder_export``), a plan (node name -> 4 or 8 bits; a MatMul the
plan does not name stays float), the block size, symmetric or not, the algorithm for the 4-bit
nodes and the ``accuracy_level`` written on every MatMulNBits node; GPTQ reads calibration text.
Out: the same folder (``genai_config.json``, tokenizer files copied) with ``model.onnx`` and
``model.onnx.data`` quantized, the nodes per width and the bytes of weights.

onnxruntime's ``MatMulNBitsQuantizer`` does the work: the 8-bit nodes first with its default
round-to-nearest (the only algorithm it offers at 8 bits), then the 4-bit nodes with the chosen
algorithm (rtn: its default RTN; hqq: half-quadratic; k_quant: llama.cpp-style k-quants; gptq:
second-order, needs calibration text). Every node outside a pass's set is excluded from it, so
each pass touches only its own.
"""
from __future__ import annotations

import contextlib
import io
import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.errors import StageError

ALGORITHMS = ("rtn", "hqq", "k_quant", "gptq")
CALIBRATION_SEQUENCES = 8  # GPTQ's Hessians: enough rows for a tiny model, minutes for a 1B one


def node_counts(folder: Path) -> dict[str, int]:
    import onnx

    model = onnx.load(str(Path(folder) / "model.onnx"), load_external_data=False)
    return dict(sorted(Counter(n.op_type for n in model.graph.node).items()))


def matmuls(folder: Path) -> list[str]:
    """The MatMul nodes with a constant weight, in graph order (the output layer last)."""
    import onnx

    model = onnx.load(str(Path(folder) / "model.onnx"), load_external_data=False)
    weights = {i.name for i in model.graph.initializer}
    return [n.name for n in model.graph.node if n.op_type == "MatMul"
            and len(n.input) > 1 and n.input[1] in weights]


def matmul_weights(folder: Path) -> dict[str, int]:
    """Each constant-weight MatMul's weight elements (what its share of decode's reads scales
    with), read from the graph without its external data."""
    import math

    import onnx

    model = onnx.load(str(Path(folder) / "model.onnx"), load_external_data=False)
    dims = {i.name: math.prod(i.dims) for i in model.graph.initializer}
    return {n.name: dims[n.input[1]] for n in model.graph.node if n.op_type == "MatMul"
            and len(n.input) > 1 and n.input[1] in dims}


@dataclass(frozen=True)
class WeightOnly:
    plan: tuple            # ((node name, bits), ...): 4 or 8; nodes not named stay float
    block_size: int
    symmetric: bool
    algorithm: str         # for the 4-bit nodes: rtn | hqq | k_quant | gptq
    accuracy_level: int    # MatMulNBits' compute type: 0 as built, 4 int8 activations
    calibration: object = None  # TextSet: GPTQ's calibration text
    # The 8-bit nodes' block when it differs from block_size (None: block_size): quant=auto's
    # mix takes the block that won for all-INT8 while its 4-bit nodes keep block_size.
    block_size_8: int | None = None
    name = "weight_only"
    version = 2  # 2: block_size_8; the stage's peak resident memory in its result
    hardware_dependent = False

    def run(self, parent, out_dir: Path) -> dict:
        import onnx

        from pipeline.core.env import peak_rss_mb

        model = onnx.load(str(parent.model))
        present = {n.name for n in model.graph.node if n.op_type == "MatMul"}
        unknown = [n for n, _ in self.plan if n not in present]
        if unknown:
            raise StageError(f"weight_only: no MatMul named {unknown[0]} in the FP32 decoder")
        for bits in (8, 4):
            chosen = {n for n, b in self.plan if b == bits}
            if chosen:
                model = self._quantize(model, bits, chosen, present - chosen, parent.path)
        onnx.save(model, str(out_dir / "model.onnx"), save_as_external_data=True,
                  all_tensors_to_one_file=True, location="model.onnx.data")
        for name in parent.files:  # genai_config.json, tokenizer files
            if name not in ("model.onnx", "model.onnx.data"):
                shutil.copy2(parent.path / name, out_dir / name)
        widths = Counter(b for _, b in self.plan)
        return {"nodes": node_counts(out_dir), "matmul_bits": {str(b): widths[b] for b in (4, 8)},
                "matmul_float": len(present) - len(self.plan),
                "weights_bytes": (out_dir / "model.onnx.data").stat().st_size,
                "settings": {"block_size": self.block_size, "block_size_8": self._block(8),
                             "symmetric": self.symmetric, "algorithm": self.algorithm,
                             "accuracy_level": self.accuracy_level},
                "peak_rss_mb": peak_rss_mb()}

    def _block(self, bits: int) -> int:
        return (self.block_size_8 or self.block_size) if bits == 8 else self.block_size

    def _quantize(self, model, bits: int, chosen: set, others: set, folder: Path):
        import logging

        from onnxruntime.quantization import matmul_nbits_quantizer as mnq

        logging.getLogger("onnxruntime.quantization").setLevel(logging.ERROR)
        algorithm = self.algorithm if bits == 4 else "rtn"
        common = dict(block_size=self._block(bits), is_symmetric=self.symmetric,
                      accuracy_level=self.accuracy_level or None,
                      nodes_to_exclude=sorted(others))
        config = None
        if algorithm == "hqq":
            config = mnq.HQQWeightOnlyQuantConfig(block_size=self.block_size, bits=bits)
        elif algorithm == "k_quant":
            config = mnq.KQuantWeightOnlyQuantConfig()
        elif algorithm == "gptq":
            config = mnq.GPTQWeightOnlyQuantConfig(
                calibration_data_reader=_Reader(self.calibration.token_ids()[
                    :CALIBRATION_SEQUENCES], folder), block_size=self.block_size)
        log = io.StringIO()  # the k-quant and GPTQ paths print a progress bar and INFO lines
        logging.getLogger("neural_compressor").setLevel(logging.ERROR)
        try:
            with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
                q = mnq.MatMulNBitsQuantizer(model, bits=bits, nodes_to_include=sorted(chosen),
                                             algo_config=config, **common)
                q.process()
        except Exception as e:  # noqa: BLE001 - the quantizer's errors: one line naming it
            raise StageError(f"weight_only: MatMulNBits {bits}-bit {algorithm} failed: "
                             f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
                             ) from None
        return q.model.model


class _Reader:
    """GPTQ's calibration batches: each sequence with an empty KV cache."""

    def __init__(self, token_ids, folder: Path):
        import json

        import numpy as np

        d = json.loads((Path(folder) / "genai_config.json").read_text())["model"]["decoder"]
        shape = (1, d["num_key_value_heads"], 0, d["head_size"])
        past = {f"past_key_values.{i}.{kv}": np.zeros(shape, np.float32)
                for i in range(d["num_hidden_layers"]) for kv in ("key", "value")}
        self.feeds = []
        for ids in token_ids:
            a = np.asarray(ids, np.int64)[None, :]
            self.feeds.append({"input_ids": a, "attention_mask": np.ones_like(a), **past})
        self.i = 0

    def get_next(self):
        if self.i >= len(self.feeds):
            return None
        self.i += 1
        return self.feeds[self.i - 1]

    def rewind(self):
        self.i = 0

    def __iter__(self):
        return iter(self.feeds)
