"""Which MatMuls of a decoder lose most at 4 bits: a proxy computed once, no model rebuilt.

In: the FP32 decoder folder (as onnxruntime-genai's builder writes it), a few token sequences
(calibration text) and the block size. Out: per MatMul node (constant weight ``W``, K x N), the
error 4-bit round-to-nearest weights add to its output, relative to the output itself:

    E||x (W - Q4(W))||^2 / E||x W||^2  ~=  sum_k E[x_k^2] |dW_k|^2 / sum_k E[x_k^2] |W_k|^2

``E[x_k^2]`` is the mean square of input channel ``k`` over every position of the sequences
(one FP32 pass with every MatMul input as an extra output), ``|dW_k|^2`` the squared rounding
error of weight row ``k`` (the diagonal approximation: cross terms between channels are dropped,
as activation-weighted proxies such as AWQ's do). A channel that carries large activations
weighs its rows' error more, which is what makes a layer sensitive beyond its weights alone.
``Q4`` is symmetric round to nearest per block of ``block_size`` weights along K, as
MatMulNBits stores it (scale = the block's largest-magnitude weight / -8, codes -8..7).

Why a proxy: the mixed search used to score each transformer block alone at 4 bits (a rebuilt
and rescored model per block: 30 builds for a 30-block model); the proxy costs one forward pass
and a pass over the weights, and the search then spends its full-model trials on bisection.
A ranking, never a gate: every plan the search keeps is scored on the evaluation text.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np


def rtn_error(w: np.ndarray, bits: int = 4, block_size: int = 32) -> np.ndarray:
    """Squared rounding error per row of ``w`` (K x N, blocks of ``block_size`` along K):
    symmetric round to nearest, the block's scale from its largest-magnitude weight."""
    k, n = w.shape
    pad = (-k) % block_size
    wp = np.pad(w.astype(np.float32), ((0, pad), (0, 0)))
    blocks = wp.reshape(-1, block_size, n)
    idx = np.abs(blocks).argmax(axis=1)[:, None, :]
    extreme = np.take_along_axis(blocks, idx, axis=1)     # signed, one per block and column
    lo, hi = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    scale = extreme / lo
    scale = np.where(scale == 0, 1.0, scale)
    q = np.clip(np.rint(blocks / scale), lo, hi)
    err = (blocks - q * scale).reshape(-1, n)[:k]
    return (err.astype(np.float64) ** 2).sum(axis=1)


def input_energy(folder: Path, token_ids: Sequence[Sequence[int]], threads: int = 0
                 ) -> dict[str, np.ndarray]:
    """Mean square of each input channel of every constant-weight MatMul, by node name, over
    every position of ``token_ids`` (teacher-forced, no past), from one FP32 pass per sequence."""
    import onnx
    import onnxruntime as ort

    from pipeline.metrics.generation import empty_past, model_file

    path = model_file(folder)
    model = onnx.load(str(path), load_external_data=False)
    weights = {i.name for i in model.graph.initializer}
    nodes = [n for n in model.graph.node if n.op_type == "MatMul" and len(n.input) > 1
             and n.input[1] in weights]
    inputs = sorted({n.input[0] for n in nodes})
    have = {o.name for o in model.graph.output}
    model.graph.output.extend(onnx.helper.make_tensor_value_info(x, onnx.TensorProto.FLOAT, None)
                              for x in inputs if x not in have)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    # the graph with extra outputs beside hard links to the folder's weights (onnxruntime
    # refuses external data outside the model's folder, symbolic links included): a scratch
    # folder next to it, on the same file system, removed after; the folder is never written
    with tempfile.TemporaryDirectory(prefix=".sensitivity-", dir=Path(path).parent.parent
                                     ) as scratch:
        for f in Path(path).parent.iterdir():
            if f.is_file() and f.name != path.name:
                try:
                    os.link(f, Path(scratch) / f.name)
                except OSError:  # another file system after all: a copy
                    shutil.copy2(f, Path(scratch) / f.name)
        onnx.save(model, str(Path(scratch) / path.name))
        sess = ort.InferenceSession(str(Path(scratch) / path.name), opts,
                                    providers=["CPUExecutionProvider"])
    past = empty_past(folder, sess)
    sums: dict[str, np.ndarray] = {}
    positions = 0
    for ids in token_ids:
        a = np.asarray(ids, np.int64)[None, :]
        outs = sess.run(inputs, {"input_ids": a, "attention_mask": np.ones_like(a), **past})
        for name, x in zip(inputs, outs):
            x = np.asarray(x, np.float64).reshape(-1, x.shape[-1])
            sums[name] = sums.get(name, 0.0) + (x ** 2).sum(axis=0)
        positions += a.shape[1]
    if not positions:
        raise ValueError("no token to measure activations on")
    return {n.name: sums[n.input[0]] / positions for n in nodes}


def node_scores(folder: Path, token_ids: Sequence[Sequence[int]], block_size: int = 32,
                threads: int = 0) -> dict[str, float]:
    """Relative output error of each constant-weight MatMul at 4 bits (see the module's doc)."""
    import onnx
    from onnx import numpy_helper

    from pipeline.metrics.generation import model_file

    energy = input_energy(folder, token_ids, threads)
    model = onnx.load(str(model_file(folder)))
    init = {i.name: i for i in model.graph.initializer}
    out = {}
    for node in model.graph.node:
        if node.name not in energy:
            continue
        w = numpy_helper.to_array(init[node.input[1]])
        w = w.reshape(w.shape[-2], w.shape[-1])
        e = energy[node.name]
        signal = float(e @ (w.astype(np.float64) ** 2).sum(axis=1))
        out[node.name] = float(e @ rtn_error(w, 4, block_size)) / max(signal, 1e-30)
    return out


def group_scores(scores: dict[str, float], groups: dict[str, list[str]]) -> dict[str, float]:
    """A group's sensitivity: the sum of its MatMuls' relative output errors (each adds its own
    noise to the block's output)."""
    return {g: float(sum(scores.get(n, 0.0) for n in nodes)) for g, nodes in groups.items()}
