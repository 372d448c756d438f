"""Bytes a decoder reads per generated token, counted from its ONNX graph as the kernels read them.

In: a decoder ONNX file (with a KV cache: ``past_key_values.*`` inputs), read without its external
data (only shapes and types are needed). Out: a ``TokenBytes``: what every decode step reads in
full (weights, shared by all sequences of a batch), what it reads per sequence (one embedding row,
one rotary row per token) and the KV cache bytes per cached position; from these the bytes of a
step at a given cache length and batch, and the tokens/s bound from a measured read bandwidth.

How each tensor is read (onnxruntime's CPU kernels):
- ``MatMulNBits``: the packed codes, one scale per block (FP32 in an FP32 model), zero points
  when asymmetric, ``g_idx`` and bias when present: all of it, every step. At block 32 with FP32
  scales that is 0.625 byte per INT4 weight, not 0.5 (params x bits / 8 undercounts by 25 %).
- ``Gather`` on an initializer (the embedding): one row per token, not the table.
  ``GatherBlockQuantized``: one row of codes, scales and zero points. A table the graph only
  transposes before gathering from it (the builder's tied embedding: ``Transpose`` of the output
  layer's weight) is folded into a constant when the session loads, so it too is one row of the
  transposed table per token; the ``Transpose`` itself reads nothing per step.
- ``cos_cache`` / ``sin_cache`` of ``GroupQueryAttention`` / ``RotaryEmbedding``: one row per
  position.
- Any other initializer (float MatMul weights, norms, biases): in full, every step. An initializer
  read in full by one node and by rows by another counts once, in full.
- The output layer (the projection that produces ``logits``) is part of the weights and is also
  reported on its own: at small models it is a large share.
- KV cache: each ``past_key_values`` input's elements per position (KV heads x head dim, from the
  input's shape, else from ``genai_config.json`` beside the model) times its type's size; a step at
  cache length L reads L positions per sequence.
Deliberately not counted: activations (they stay in cache at decode), writes of the new K/V
position and of the logits (a few KB per token), and graph-level ``Constant`` nodes.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import onnx

ROW_READ_ROTARY = {"GroupQueryAttention": (7, 8), "RotaryEmbedding": (2, 3)}
PACKED = {onnx.TensorProto.INT4: 0.5, onnx.TensorProto.UINT4: 0.5}
NBITS_PARTS = {1: "codes", 2: "scales", 3: "zero_points", 4: "g_idx", 5: "bias"}


def _itemsize(data_type: int) -> float:
    if data_type in PACKED:
        return PACKED[data_type]
    return onnx.helper.tensor_dtype_to_np_dtype(data_type).itemsize


def tensor_bytes(t: onnx.TensorProto) -> int:
    n = 1
    for d in t.dims:
        n *= d
    return int(n * _itemsize(t.data_type) + 0.5)


def row_bytes(t: onnx.TensorProto) -> int:
    """One row (index along axis 0) of an initializer."""
    return tensor_bytes(t) // max(1, t.dims[0]) if t.dims else tensor_bytes(t)


@dataclass(frozen=True)
class TokenBytes:
    weights: int                # read in full every decode step, once for the whole batch
    rows_per_token: int         # embedding and rotary rows, per sequence per step
    kv_per_position: int        # K and V of one cached position, all layers, one sequence
    output_layer: int           # of ``weights``: the projection that produces the logits
    stored: int                 # every initializer in full: what the weights take in memory
    by_kind: dict = field(default_factory=dict)  # full-read bytes by kind (codes, scales, ...)
    layers: int = 0             # KV inputs / 2
    kv_heads: int = 0
    head_dim: int = 0

    def step(self, kv_len: int, streams: int = 1) -> int:
        """Bytes one decode step reads: the weights once, rows and ``kv_len`` cached positions
        per sequence."""
        return self.weights + streams * (self.rows_per_token + self.kv_per_position * kv_len)

    def per_token(self, kv_len: int, streams: int = 1) -> float:
        return self.step(kv_len, streams) / streams

    def kv_bytes(self, seq: int, streams: int = 1) -> int:
        """The KV cache of ``streams`` sequences of ``seq`` positions."""
        return self.kv_per_position * seq * streams


def bound_tokens_per_s(bandwidth_gbs: float, tb: TokenBytes, kv_len: int, streams: int = 1) -> float:
    """Decode tokens/s if every step only had to read its bytes at ``bandwidth_gbs`` (decimal)."""
    return streams * bandwidth_gbs * 1e9 / tb.step(kv_len, streams)


def _kv_shape(model: onnx.ModelProto, path: Path | None) -> tuple[int, int, int, int]:
    """(number of past inputs, KV heads, head dim, bytes per element) of the past inputs."""
    past = [i for i in model.graph.input if i.name.startswith("past_key_values")
            or i.name.startswith("past_key") or i.name.startswith("past_value")]
    if not past:
        return 0, 0, 0, 0
    dims = [d.dim_value if d.HasField("dim_value") else None
            for d in past[0].type.tensor_type.shape.dim]
    size = _itemsize(past[0].type.tensor_type.elem_type)
    heads, head_dim = (dims[1], dims[3]) if len(dims) == 4 else (None, None)
    if (heads is None or head_dim is None) and path is not None:
        cfg = path.parent / "genai_config.json"
        if cfg.exists():
            dec = json.loads(cfg.read_text())["model"]["decoder"]
            heads = heads or dec.get("num_key_value_heads")
            head_dim = head_dim or dec.get("head_size")
    if not heads or not head_dim:
        raise ValueError(f"{path or 'model'}: the KV inputs' heads and head size are not in the "
                         f"graph ({past[0].name}: {dims}) nor in a genai_config.json beside it")
    return len(past), int(heads), int(head_dim), int(size)


def _output_layer(model: onnx.ModelProto, inits: dict) -> set[str]:
    """Initializers of the MatMul-like node that produces the logits (walking back through at
    most three single-input nodes: a Cast, a bias Add)."""
    producer = {o: n for n in model.graph.node for o in n.output}
    name = next((o.name for o in model.graph.output if "logits" in o.name),
                model.graph.output[0].name if model.graph.output else None)
    for _ in range(4):
        node = producer.get(name)
        if node is None:
            return set()
        if node.op_type in ("MatMulNBits", "MatMul", "Gemm", "MatMulInteger"):
            return {i for i in node.input if i in inits}
        data = [i for i in node.input if i and i not in inits]
        if not data:
            return set()
        name = data[0]
    return set()


def count(model: onnx.ModelProto | str | Path) -> TokenBytes:
    """Count a decoder's bytes per token from its graph (see the module docstring)."""
    path = None
    if not isinstance(model, onnx.ModelProto):
        path = Path(model)
        model = onnx.load(str(path), load_external_data=False)
    inits = {t.name: t for t in model.graph.initializer}
    # transposes of an initializer: folded at load into a constant whose row is the product of
    # the dimensions left after the one moved to the front
    folded: dict[str, tuple[str, int]] = {}   # output -> (initializer, row bytes)
    for node in model.graph.node:
        if node.op_type == "Transpose" and node.input and node.input[0] in inits:
            t = inits[node.input[0]]
            perm = next((list(a.ints) for a in node.attribute if a.name == "perm"),
                        list(range(len(t.dims)))[::-1])
            first = t.dims[perm[0]] if t.dims else 1
            folded[node.output[0]] = (t.name, tensor_bytes(t) // max(1, first))
    full: dict[str, str] = {}      # initializer -> kind, read in full
    rows: set[str] = set()
    folded_rows = 0
    for node in model.graph.node:
        if node.op_type == "Transpose" and node.output[0] in folded:
            continue  # constant-folded at load: no read per step
        for k, name in enumerate(node.input):
            if name in folded:
                src, row = folded[name]
                if node.op_type == "Gather" and k == 0:
                    folded_rows += row
                else:  # the folded copy read in full: as many bytes as its source
                    full.setdefault(src, "float")
                continue
            if name not in inits:
                continue
            if node.op_type == "Gather" and k == 0:
                rows.add(name)
            elif node.op_type == "GatherBlockQuantized" and k in (0, 2, 3):
                rows.add(name)
            elif k in ROW_READ_ROTARY.get(node.op_type, ()):
                rows.add(name)
            elif node.op_type == "MatMulNBits":
                full[name] = NBITS_PARTS.get(k, "other")
            else:
                full.setdefault(name, "float" if inits[name].data_type in (
                    onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16,
                    onnx.TensorProto.DOUBLE) else "other")
    by_kind: dict[str, int] = {}
    for name, kind in full.items():
        by_kind[kind] = by_kind.get(kind, 0) + tensor_bytes(inits[name])
    head = _output_layer(model, inits)
    n_past, heads, head_dim, size = _kv_shape(model, path)
    return TokenBytes(weights=sum(by_kind.values()),
                      rows_per_token=sum(row_bytes(inits[n]) for n in rows - set(full))
                      + folded_rows,
                      kv_per_position=n_past * heads * head_dim * size,
                      output_layer=sum(tensor_bytes(inits[n]) for n in head if n in full),
                      stored=sum(tensor_bytes(t) for t in inits.values()),
                      by_kind=by_kind, layers=n_past // 2, kv_heads=heads, head_dim=head_dim)


def fit(tb: TokenBytes, budget_bytes: float, margin_bytes: float = 0.0, seq: int | None = None,
        streams: int | None = None) -> dict:
    """What fits a memory budget beside the stored weights and a margin: the most sequences of
    ``seq`` positions, and the longest sequence at ``streams`` sequences (KV cache only: the
    activations and runtime belong in the margin)."""
    free = budget_bytes - tb.stored - margin_bytes
    out = {"budget_bytes": budget_bytes, "weights_bytes": tb.stored, "margin_bytes": margin_bytes,
           "free_for_kv_bytes": free}
    if tb.kv_per_position and seq:
        out["max_streams_at_seq"] = {"seq": seq, "streams": max(0, int(free // (tb.kv_per_position * seq)))}
    if tb.kv_per_position and streams:
        out["max_seq_at_streams"] = {"streams": streams,
                                     "seq": max(0, int(free // (tb.kv_per_position * streams)))}
    return out
