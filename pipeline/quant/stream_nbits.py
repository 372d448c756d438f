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

from pipeline.models.checkpoint_tensors import CheckpointTensors

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
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from onnx.external_data_helper import uses_external_data
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig, DefaultWeightOnlyQuantizer)

    src, out = Path(src), Path(out)
    model = onnx.load(str(src / "model.onnx"), load_external_data=False)
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    users: dict[str, int] = {}
    for n in graph.node:
        for i in n.input:
            users[i] = users.get(i, 0) + 1
    quantizers = {b: DefaultWeightOnlyQuantizer(DefaultWeightOnlyQuantConfig(
        block_size=block_size, is_symmetric=symmetric, accuracy_level=accuracy_level or None,
        bits=b)) for b in (4, 8)}
    files: dict[str, object] = {}
    written = {"bytes_in": 0, "bytes_out": 0, "largest_weight_bytes": 0}

    def read(t) -> "np.ndarray":
        """One initializer's values: from the checkpoint for a placeholder of the streaming
        export (FP32, ``[in, out]``), else from its external file or inline."""
        if not uses_external_data(t):
            return numpy_helper.to_array(t)
        e = _external(t)
        if e["location"] == CHECKPOINT_MAP:
            return checkpoint_weight(t.name)
        f = files.get(e["location"])
        if f is None:
            f = files[e["location"]] = open(src / e["location"], "rb")  # noqa: SIM115
        f.seek(int(e.get("offset", 0)))
        dtype = helper.tensor_dtype_to_np_dtype(t.data_type)
        count = int(np.prod(t.dims)) if t.dims else 1
        return np.fromfile(f, dtype=dtype, count=count).reshape(tuple(t.dims))

    checkpoint = None

    def checkpoint_weight(name: str) -> "np.ndarray":
        """A MatMul weight as the builder writes it, from the checkpoint tensors it names."""
        nonlocal checkpoint
        if checkpoint is None:
            checkpoint = (json.loads((src / CHECKPOINT_MAP).read_text()), None)
            checkpoint = (checkpoint[0], CheckpointTensors(checkpoint[0]["checkpoint"]))
        mapping, tensors = checkpoint
        rows = [tensors.read(k) for k in mapping["weights"][name]]
        w = rows[0] if len(rows) == 1 else np.concatenate(rows, axis=0)
        del rows
        return np.ascontiguousarray(w.T, dtype=np.float32)

    def described(array, name: str):
        """A tensor's name, type and shape, without its values (``numpy_helper.from_array``
        would copy them into the proto: cleared when written, the memory stayed taken, 1.2x the
        quantized model at the end on a 64-layer test model)."""
        return TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(array.dtype),
                           dims=array.shape)

    sink = open(out / data_name, "wb")  # noqa: SIM115 - closed below, on every path

    def write(t, array=None) -> None:
        """Append ``t``'s bytes (``array``'s, else its own, copied in chunks) to the data file
        and point ``t`` at them."""
        pad = -sink.tell() % ALIGN
        sink.write(b"\0" * pad)
        offset = sink.tell()
        if array is not None:
            sink.write(np.ascontiguousarray(array).tobytes())
        elif uses_external_data(t) and _external(t)["location"] == CHECKPOINT_MAP:
            sink.write(read(t).tobytes())  # a MatMul weight kept float, or shared
        elif uses_external_data(t):
            e = _external(t)
            f = files.get(e["location"])
            if f is None:
                f = files[e["location"]] = open(src / e["location"], "rb")  # noqa: SIM115
            f.seek(int(e.get("offset", 0)))
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
        for k, v in (("location", data_name), ("offset", str(offset)), ("length", str(length))):
            entry = t.external_data.add()
            entry.key, entry.value = k, v
        t.data_location = TensorProto.EXTERNAL
        written["bytes_out"] += length

    try:
        nodes, new_inits, quantized = [], [], {4: 0, 8: 0}
        dropped: set[str] = set()
        for node in graph.node:
            bits = plan.get(node.name)
            weight = inits.get(node.input[1]) if node.op_type == "MatMul" and \
                len(node.input) > 1 else None
            if bits is None or weight is None or len(weight.dims) != 2:
                nodes.append(node)
                continue
            w = read(weight).astype(np.float32, copy=False)  # bf16/fp16 graphs: FP32 per tensor
            written["bytes_in"] += w.nbytes
            written["largest_weight_bytes"] = max(written["largest_weight_bytes"], w.nbytes)
            packed, scales, zeros = quantizers[bits].qbits_block_quant(w)
            rows, cols = w.shape
            del w
            q = described(packed, weight.name + f"_Q{bits}")
            s = described(scales, weight.name + "_scales")
            write(q, packed)
            write(s, scales)
            extra = [q, s]
            inputs = [node.input[0], q.name, s.name]
            if not symmetric:
                z = described(zeros, weight.name + "_zero_points")
                write(z, zeros)
                extra.append(z)
                inputs.append(z.name)
            new_inits += extra
            attrs = {"K": rows, "N": cols, "bits": bits, "block_size": block_size}
            if accuracy_level:  # optional: absent means 0, as onnxruntime's quantizer writes it
                attrs["accuracy_level"] = accuracy_level
            nodes.append(helper.make_node("MatMulNBits", inputs, list(node.output),
                                          name=node.name + f"_Q{bits}", domain="com.microsoft",
                                          **attrs))
            quantized[bits] += 1
            users[weight.name] -= 1
            if users[weight.name] == 0:
                dropped.add(weight.name)
        missing = sorted(set(plan) - {n.name for n in graph.node if n.op_type == "MatMul"})
        if missing:
            raise ValueError(f"no MatMul named {missing[0]} in the graph")
        kept = [t for t in graph.initializer if t.name not in dropped]
        for t in kept:
            written["bytes_in"] += int(_external(t).get("length", 0)) \
                if uses_external_data(t) else 0
            write(t)
        del graph.initializer[:]
        graph.initializer.extend(kept + new_inits)
        del graph.node[:]
        graph.node.extend(nodes)
        if not any(o.domain == "com.microsoft" for o in model.opset_import):
            model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    finally:
        sink.close()
        for f in files.values():
            f.close()
    onnx.save(model, str(out / "model.onnx"))  # the graph only: every tensor is external now
    return {"matmul_bits": {str(b): quantized[b] for b in (4, 8)}, **written}
