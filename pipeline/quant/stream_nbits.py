"""MatMulNBits tensor by tensor: a decoder folder's MatMul weights quantized to 4 or 8 bits
without loading the model's weights whole.

In: an ONNX folder whose weights are external data: ``model.onnx`` + ``model.onnx.data`` (any
size: offsets past 2 GB are plain int64), where a MatMul weight may instead be a placeholder of
the streaming export (``pipeline.stages._lazy_builder``) naming the checkpoint tensors it is
made of (``CHECKPOINT_MAP``); a plan (MatMul node name -> 4 or 8 bits), block size, symmetric or
not, accuracy level. Out: the same graph in ``out`` with each planned MatMul replaced by a
MatMulNBits node named as onnxruntime's ``MatMulNBitsQuantizer`` names it (``<node>_Q<bits>``),
every initializer written to one external data file as it goes.

Why not ``MatMulNBitsQuantizer`` itself: it takes a loaded ``ModelProto``, i.e. every weight in
memory (28 GB for a 7 B model in FP32), and keeps the quantized copies beside them until saved.
Here the graph is read without its data; each weight is read on its own (from the data file with
a seek, or from the checkpoint's safetensors: ``pipeline.models.checkpoint_tensors``; not a
memory map: mapped pages count in the process's resident set until unmapped), widened to FP32,
quantized by the same C++ kernels (``DefaultWeightOnlyQuantizer.qbits_block_quant``, round to
nearest) and appended to the new data file: the peak is one weight in FP32 (twice: the
checkpoint's ``[out, in]`` and its transpose) and its codes.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.models.checkpoint_tensors import CheckpointTensors

if TYPE_CHECKING:  # annotations only: numpy is imported where it is used
    import numpy as np

# the streaming export's placeholder for a MatMul weight left in the checkpoint
# (``pipeline.stages._lazy_builder``: stages import quant, not the other way round)
CHECKPOINT_MAP = "checkpoint_weights.json"
ALIGN = 4096  # where each tensor starts in the data file: page-aligned, as onnx's writer does
COPY_CHUNK = 64 << 20  # bytes copied at a time for a tensor kept as it is


def _external(t) -> dict[str, str]:
    return {e.key: e.value for e in t.external_data}


def quantize_folder(src: Path, out: Path, plan: dict[str, int], block_size: int,
                    symmetric: bool, accuracy_level: int, data_name: str = "model.onnx.data"
                    ) -> dict:
    """Write ``out/model.onnx`` and ``out/<data_name>``; return what was quantized."""
    import onnx
    from onnx import helper
    from onnx.external_data_helper import uses_external_data
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig, DefaultWeightOnlyQuantizer)

    src, out = Path(src), Path(out)
    model = onnx.load(str(src / "model.onnx"), load_external_data=False)
    graph = model.graph
    missing = sorted(set(plan) - {n.name for n in graph.node if n.op_type == "MatMul"})
    quantizers = {b: DefaultWeightOnlyQuantizer(DefaultWeightOnlyQuantConfig(
        block_size=block_size, is_symmetric=symmetric, accuracy_level=accuracy_level or None,
        bits=b)) for b in (4, 8)}
    data = _Data(src, out, data_name)
    try:
        swap = _Swap(data, quantizers, block_size, symmetric, accuracy_level)
        nodes, new_inits, dropped = swap.nodes(graph, plan)
        if missing:
            raise ValueError(f"no MatMul named {missing[0]} in the graph")
        kept = [t for t in graph.initializer if t.name not in dropped]
        for t in kept:  # the rest as it is, copied in chunks
            swap.bytes_in += int(_external(t).get("length", 0)) if uses_external_data(t) else 0
            data.write(t)
        del graph.initializer[:]
        graph.initializer.extend(kept + new_inits)
        del graph.node[:]
        graph.node.extend(nodes)
        if not any(o.domain == "com.microsoft" for o in model.opset_import):
            model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    finally:
        data.close()
    onnx.save(model, str(out / "model.onnx"))  # the graph only: every tensor is external now
    return {"matmul_bits": {str(b): swap.quantized[b] for b in (4, 8)},
            "bytes_in": swap.bytes_in, "bytes_out": data.bytes_out,
            "largest_weight_bytes": swap.largest_weight_bytes}


class _Data:
    """The source folder's data files, read with seeks, and the one data file written, tensor by
    tensor, each page-aligned."""

    def __init__(self, src: Path, out: Path, data_name: str):
        self.src, self.name = src, data_name
        self.files: dict[str, object] = {}
        self.sink = open(out / data_name, "wb")  # noqa: SIM115 - closed by close(), on every path
        self.bytes_out = 0
        self.checkpoint = None  # (the streaming export's map, its CheckpointTensors), when read

    def _source(self, t):
        """The open source file holding external tensor ``t``, at its first byte."""
        e = _external(t)
        f = self.files.get(e["location"])
        if f is None:
            f = self.files[e["location"]] = open(self.src / e["location"], "rb")  # noqa: SIM115
        f.seek(int(e.get("offset", 0)))
        return f

    def read(self, t) -> "np.ndarray":
        """One initializer's values: from the checkpoint for a placeholder of the streaming
        export (FP32, ``[in, out]``), else from its external file or inline."""
        import numpy as np
        from onnx import helper, numpy_helper
        from onnx.external_data_helper import uses_external_data

        if not uses_external_data(t):
            return numpy_helper.to_array(t)
        if _external(t)["location"] == CHECKPOINT_MAP:
            return self._checkpoint_weight(t.name)
        f = self._source(t)
        dtype = helper.tensor_dtype_to_np_dtype(t.data_type)
        count = int(np.prod(t.dims)) if t.dims else 1
        return np.fromfile(f, dtype=dtype, count=count).reshape(tuple(t.dims))

    def _checkpoint_weight(self, name: str) -> "np.ndarray":
        """A MatMul weight as the builder writes it, from the checkpoint tensors it names."""
        import numpy as np

        if self.checkpoint is None:
            mapping = json.loads((self.src / CHECKPOINT_MAP).read_text())
            self.checkpoint = (mapping, CheckpointTensors(mapping["checkpoint"]))
        mapping, tensors = self.checkpoint
        rows = [tensors.read(k) for k in mapping["weights"][name]]
        w = rows[0] if len(rows) == 1 else np.concatenate(rows, axis=0)
        del rows
        return np.ascontiguousarray(w.T, dtype=np.float32)

    def write(self, t, array=None) -> None:
        """Append ``t``'s bytes (``array``'s, else its own, copied in chunks) to the data file
        and point ``t`` at them."""
        import numpy as np
        from onnx import TensorProto, numpy_helper
        from onnx.external_data_helper import uses_external_data

        sink = self.sink
        sink.write(b"\0" * (-sink.tell() % ALIGN))
        offset = sink.tell()
        if array is not None:
            sink.write(np.ascontiguousarray(array).tobytes())
        elif uses_external_data(t) and _external(t)["location"] == CHECKPOINT_MAP:
            sink.write(self.read(t).tobytes())  # a MatMul weight kept float, or shared
        elif uses_external_data(t):
            e, f = _external(t), self._source(t)
            left = int(e["length"])
            while left:
                chunk = f.read(min(left, COPY_CHUNK))
                if not chunk:
                    raise OSError(f"{e['location']} ends before tensor {t.name}")
                sink.write(chunk)
                left -= len(chunk)
        else:
            sink.write(t.raw_data or numpy_helper.to_array(t).tobytes())
        length = sink.tell() - offset
        t.ClearField("raw_data")
        for field in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
            t.ClearField(field)
        del t.external_data[:]
        for k, v in (("location", self.name), ("offset", str(offset)), ("length", str(length))):
            entry = t.external_data.add()
            entry.key, entry.value = k, v
        t.data_location = TensorProto.EXTERNAL
        self.bytes_out += length

    def close(self) -> None:
        self.sink.close()
        for f in self.files.values():
            f.close()


class _Swap:
    """Each planned MatMul replaced by its MatMulNBits node, its codes, scales (and zero points)
    written as they are made; counts what was read and quantized."""

    def __init__(self, data: _Data, quantizers: dict, block_size: int, symmetric: bool,
                 accuracy_level: int):
        self.data, self.quantizers = data, quantizers
        self.block_size, self.symmetric, self.accuracy_level = block_size, symmetric, accuracy_level
        self.quantized = {4: 0, 8: 0}
        self.bytes_in = self.largest_weight_bytes = 0

    def nodes(self, graph, plan: dict[str, int]) -> tuple[list, list, set[str]]:
        """The new node list, the new initializers, and the weights no node reads any more."""
        inits = {t.name: t for t in graph.initializer}
        users: dict[str, int] = {}  # a weight another node still reads is kept
        for n in graph.node:
            for i in n.input:
                users[i] = users.get(i, 0) + 1
        nodes, new_inits, dropped = [], [], set()
        for node in graph.node:
            bits = plan.get(node.name)
            weight = inits.get(node.input[1]) if node.op_type == "MatMul" and \
                len(node.input) > 1 else None
            if bits is None or weight is None or len(weight.dims) != 2:
                nodes.append(node)
                continue
            swapped, extra = self.matmul(node, weight, bits)
            nodes.append(swapped)
            new_inits += extra
            users[weight.name] -= 1
            if users[weight.name] == 0:
                dropped.add(weight.name)
        return nodes, new_inits, dropped

    def matmul(self, node, weight, bits: int):
        """One MatMul as MatMulNBits, named and laid out as onnxruntime's quantizer does."""
        import numpy as np
        from onnx import helper

        w = self.data.read(weight).astype(np.float32, copy=False)  # bf16/fp16: FP32 per tensor
        self.bytes_in += w.nbytes
        self.largest_weight_bytes = max(self.largest_weight_bytes, w.nbytes)
        packed, scales, zeros = self.quantizers[bits].qbits_block_quant(w)
        rows, cols = w.shape
        del w
        q = _described(packed, weight.name + f"_Q{bits}")
        s = _described(scales, weight.name + "_scales")
        self.data.write(q, packed)
        self.data.write(s, scales)
        extra = [q, s]
        inputs = [node.input[0], q.name, s.name]
        if not self.symmetric:
            z = _described(zeros, weight.name + "_zero_points")
            self.data.write(z, zeros)
            extra.append(z)
            inputs.append(z.name)
        attrs = {"K": rows, "N": cols, "bits": bits, "block_size": self.block_size}
        if self.accuracy_level:  # optional: absent means 0, as onnxruntime's quantizer writes it
            attrs["accuracy_level"] = self.accuracy_level
        self.quantized[bits] += 1
        return helper.make_node("MatMulNBits", inputs, list(node.output),
                                name=node.name + f"_Q{bits}", domain="com.microsoft",
                                **attrs), extra


def _described(array, name: str):
    """A tensor's name, type and shape, without its values (``numpy_helper.from_array`` would copy
    them into the proto: cleared when written, the memory stayed taken, 1.2x the quantized model
    at the end on a 64-layer test model)."""
    from onnx import TensorProto, helper

    return TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(array.dtype),
                       dims=array.shape)
