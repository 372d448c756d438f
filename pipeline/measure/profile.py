"""explain's helpers: onnxruntime's per-node profile, node names traced back to the model, the
fusion groups FP32 runs as one kernel and INT8 as several, and the optimized graph's summary.

In: ONNX model paths, the target's settings and a real batch. Out: per-node mean kernel times
(ms, with op type), {host: members} fusion groups with their times, and what ONNX Runtime's
graph optimizations left: unfused Q/DQ, INT8 kernels, float compute ops. Every file (the
profile, the optimized graph) goes to ``tempfile``'s folder, which inside a stage is the stage's
own scratch folder, and is removed before the stage returns.
"""
from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np

from pipeline.core.errors import StageError
from pipeline.runtimes.ops import ACTIVATIONS, FORMAT_OPS, INT8_KERNELS, SHAPE_OPS


def base_name(profiled: str) -> str:
    name = profiled[:-len("_kernel_time")] if profiled.endswith("_kernel_time") else profiled
    return re.sub(r"(_token_\d+)+$", "", name)


def namer(model: Path):
    """Map a profiled kernel name back to the model's own node name.

    ONNX Runtime renames what it rewrites: NCHWc kernels are named after their output tensor
    plus ``_nchwc`` (for Conv+ReLU, the ReLU's output), and the dynamic quantizer names nodes
    ``<node>_quant``. Both are traced back to the node (for a fused activation, the conv feeding
    it) so FP32 and INT8 times of one module line up.
    """
    import onnx

    graph = onnx.load(str(model), load_external_data=False).graph
    names = {n.name for n in graph.node}
    producer = {o: n for n in graph.node for o in n.output}

    def resolve(name: str) -> str:
        if name.endswith("_quant"):  # the dynamic quantizer's rename of a float node
            return name[:-len("_quant")]
        if name in names:
            return name
        for suffix in ("_nchwc",):
            if name.endswith(suffix):
                stem = name[:-len(suffix)]
                if stem in names:
                    return stem
                node = producer.get(stem)
                if node is not None:
                    if node.op_type in ACTIVATIONS and node.input[0] in producer:
                        node = producer[node.input[0]]
                    return node.name
        return name
    return resolve


def profile(model: Path, hardware, batch, runs: int) -> dict[str, dict]:
    """Mean kernel time per (base) node name, with its op type, in ms."""
    import onnxruntime as ort

    from pipeline.runtimes import onnxruntime as pipeline_ort

    so = ort.SessionOptions()
    so.enable_profiling = True
    so.log_severity_level = 3
    so.intra_op_num_threads = hardware.intra_op_threads
    # tempfile's folder: in a stage, the runner points it inside the stage's own output folder
    scratch = Path(tempfile.mkdtemp(prefix="profile-"))
    so.profile_file_prefix = str(scratch / "profile")
    sess = pipeline_ort.session(model, hardware, options=so)
    for _ in range(3):  # warm-up, excluded below by taking the last `runs` calls
        pipeline_ort.run(sess, batch)
    for _ in range(runs):
        pipeline_ort.run(sess, batch)
    path = Path(sess.end_profiling())
    try:
        events = json.loads(path.read_text())
    except ValueError as e:  # onnxruntime does not report a failed write: say what it means
        raise StageError(f"onnxruntime's profile {path} is not valid JSON ({e}); it is "
                         f"truncated when the disk is full ({_free(path.parent)} left)") from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    per: dict[str, list] = defaultdict(list)
    ops = {}
    resolve = namer(model)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            name = resolve(base_name(e["name"]))
            per[name].append(e["dur"] / 1000.0)
            ops[name] = e["args"].get("op_name", "?")
    # Each node ran 3 + runs times: keep the last `runs` (after warm-up).
    return {n: {"op": ops[n], "ms": float(np.mean(v[-runs:]))} for n, v in per.items()}


def _free(folder: Path) -> str:
    return f"{shutil.disk_usage(folder).free / 1e6:.1f} MB"


def fusion_groups(fp32_model: Path, int8_model: Path, f32: dict, i8: dict) -> dict:
    """The nodes ONNX Runtime fuses into a neighbour in FP32 but runs on their own in INT8.

    FP32 runs a Conv and the HardSwish after it (HardSigmoid and Mul once inlined) as one kernel;
    INT8 has no fused form, so the activation runs as its own kernels, with a DequantizeLinear
    and a QuantizeLinear around the float HardSigmoid. Compared one by one, the Conv looks faster
    in INT8 and the Mul has no FP32 time at all; the honest comparison is the group: the FP32
    kernel against all of the group's INT8 kernels. A node of the float model that has a kernel
    in the INT8 profile and none in the FP32 one belongs to the nearest node upstream that has
    one (its ``host``). Returns {"host": {member: host}, "members": {host: [members]},
    "fp32_ms": {host: ms}, "int8_ms": {host: ms of host, members and the Q/DQ of their tensors}}.
    """
    import onnx

    graph = onnx.load(str(fp32_model), load_external_data=False).graph
    producer = {o: n.name for n in graph.node for o in n.output}
    inputs = {n.name: [i for i in n.input if i in producer] for n in graph.node}

    def upstream_kernel(name: str) -> str | None:
        seen, frontier = {name}, [name]
        while frontier:
            nxt = []
            for n in frontier:
                for i in inputs.get(n, ()):
                    p = producer[i]
                    if p in f32:
                        return p
                    if p not in seen:
                        seen.add(p)
                        nxt.append(p)
            frontier = nxt
        return None

    host: dict[str, str] = {}
    for name in i8:
        if name not in f32 and name in inputs:
            h = upstream_kernel(name)
            if h is not None:
                host[name] = h
    members: dict[str, list] = defaultdict(list)
    for m, h in host.items():
        members[h].append(m)
    int8_ms = {h: i8.get(h, {}).get("ms", 0.0) + sum(i8[m]["ms"] for m in ms) for h, ms in members.items()}
    # Unfused Q/DQ of a tensor the group produces exist only because the group was split.
    qgraph = onnx.load(str(int8_model), load_external_data=False).graph
    qproducer = {o: n for n in qgraph.node for o in n.output}
    for n in qgraph.node:
        if n.name not in i8 or n.op_type not in ("QuantizeLinear", "DequantizeLinear"):
            continue
        src = qproducer.get(n.input[0])
        tensor = src.input[0] if n.op_type == "DequantizeLinear" and src is not None and \
            src.op_type == "QuantizeLinear" else n.input[0]
        p = producer.get(tensor)
        h = p if p in members else host.get(p)
        if h is not None:
            int8_ms[h] += i8[n.name]["ms"]
    return {"host": host, "members": dict(members), "int8_ms": int8_ms,
            "fp32_ms": {h: f32[h]["ms"] for h in members}}


def op_types(model: Path) -> dict[str, str]:
    import onnx

    return {n.name: n.op_type for n in onnx.load(str(model), load_external_data=False).graph.node}


def optimized_graph_summary(model: Path, hardware) -> dict:
    import onnx
    import onnxruntime as ort

    from pipeline.runtimes.onnxruntime import disabled_optimizers

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    with tempfile.TemporaryDirectory(prefix="explain-") as scratch:  # the stage's own folder
        so.optimized_model_filepath = str(Path(scratch) / "optimized.onnx")
        ort.InferenceSession(str(model), so, providers=[hardware.provider],
                             disabled_optimizers=disabled_optimizers(model) or None)
        try:
            graph = onnx.load(so.optimized_model_filepath).graph
        except Exception as e:  # noqa: BLE001 - protobuf's DecodeError: a truncated write
            raise StageError(f"onnxruntime's optimized graph {so.optimized_model_filepath} is "
                             f"unreadable ({type(e).__name__}); it is truncated when the disk "
                             f"is full ({_free(Path(scratch))} left)") from None
    float_ops = sorted({f"{n.name} ({n.op_type})" for n in graph.node
                        if not n.op_type.startswith(INT8_KERNELS) and n.op_type not in FORMAT_OPS
                        and n.op_type not in SHAPE_OPS})
    return {"unfused_quantize": sum(n.op_type == "QuantizeLinear" for n in graph.node),
            "unfused_dequantize": sum(n.op_type == "DequantizeLinear" for n in graph.node),
            "int8_kernels": sorted({n.op_type for n in graph.node if n.op_type.startswith(INT8_KERNELS)}),
            "float_compute": float_ops}
