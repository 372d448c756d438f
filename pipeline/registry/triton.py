"""Export a pulled version as a Triton Inference Server model: ``<repo>/<name>/<n>/model.onnx``
plus ``<repo>/<name>/config.pbtxt``.

In: a folder written by a pull (``model.onnx``, ``manifest.json``), already re-hashed. Out: the
model repository entry. ``onnx`` reads the graph's inputs and outputs (names, element types, dims;
a symbolic dim becomes -1); the evidence supplies the batch sizes that were benchmarked (the
largest becomes ``max_batch_size``, the others ``preferred_batch_size``; 0 when an input declares
a batch of 1, which the graph alone runs) and the ONNX Runtime thread
counts the latency was measured with. Triton version folders are integers, so the registry version
and digest are kept in the version folder's ``manifest.json`` and in a comment of the config; an
export of a digest that is already there is a no-op. Writes are atomic: a new model folder, or a
new version folder, is built beside the repository and renamed in, and ``config.pbtxt`` is replaced
by rename, so a Triton polling the repository never loads half a model. The backend follows the
runtime the version was gated on (``runtime.deployed`` in the evidence): ``onnxruntime`` with its
thread counts, or Triton's ``openvino`` backend reading ``model.onnx`` with the same threads,
performance hint and, for bf16, ``HINT_BF16`` (a comment records engine, version and precision).
Not handled: ensembles, TensorRT plans, and inputs whose first dim is not the batch.
"""
from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

from pipeline.core.errors import RegistryError
from pipeline.registry import atomic
from pipeline.registry.names import check_name
from pipeline.registry.package import EVIDENCE_FILE, MODEL_FILE
from pipeline.runtimes.record import Deployed

TYPES = {"FLOAT": "TYPE_FP32", "FLOAT16": "TYPE_FP16", "BFLOAT16": "TYPE_BF16",
         "DOUBLE": "TYPE_FP64", "INT8": "TYPE_INT8", "UINT8": "TYPE_UINT8", "INT16": "TYPE_INT16",
         "UINT16": "TYPE_UINT16", "INT32": "TYPE_INT32", "UINT32": "TYPE_UINT32",
         "INT64": "TYPE_INT64", "UINT64": "TYPE_UINT64", "BOOL": "TYPE_BOOL",
         "STRING": "TYPE_STRING"}


def export(pulled: Path, name: str, repository: Path, ref: str, digest: str,
           max_batch_size: int | None = None, instances: int = 1, kind: str = "KIND_CPU",
           version: int | None = None) -> Path:
    """Lay out ``pulled`` under ``repository``; the version folder written (or already there)."""
    check_name(name)
    if instances < 1:
        raise RegistryError(f"--instances={instances}: must be >= 1")
    if kind not in ("KIND_CPU", "KIND_GPU", "KIND_AUTO"):
        raise RegistryError(f"--kind={kind}: valid choices: KIND_CPU, KIND_GPU, KIND_AUTO")
    evidence = json.loads((pulled / EVIDENCE_FILE).read_text())
    inputs, outputs = _signature(pulled / MODEL_FILE)
    if max_batch_size is None:  # a graph that declares a batch of 1 runs that alone: Triton's
        # batching off (0), the 1 kept in dims; else the largest batch benchmarked
        fixed = any(dims[:1] == [1] for _, _, dims in inputs)
        max_batch_size = 0 if fixed else max(_batch_sizes(evidence) or [0])
    text = config_pbtxt(name, inputs, outputs, max_batch_size, instances, kind, evidence,
                        f"{name}:{ref}@{digest}")
    repository.mkdir(parents=True, exist_ok=True)
    model_dir = repository / name
    existing = _exported(model_dir, digest)
    if existing is not None:
        return existing
    taken = [int(p.name) for p in model_dir.glob("*") if p.name.isdigit()] \
        if model_dir.exists() else []
    if version is None:
        version = max(taken, default=0) + 1
    elif version < 1 or version in taken:
        raise RegistryError(f"Triton version {version} of {name}: "
                            + ("already taken" if version in taken else "must be >= 1"))
    # Built beside the repository (never inside it: Triton would see a stray model folder).
    stage = repository.parent / f".{repository.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        vdir = stage / name / str(version)
        vdir.mkdir(parents=True)
        for f in (MODEL_FILE, EVIDENCE_FILE):
            shutil.copyfile(pulled / f, vdir / f)
        (vdir / "registry.json").write_text(json.dumps({"ref": f"{name}:{ref}",
                                                        "digest": digest}) + "\n")
        if not model_dir.exists():
            atomic.write_bytes(stage / name / "config.pbtxt", text.encode())
            _rename(stage / name, model_dir)
        else:
            _rename(vdir, model_dir / str(version))
            atomic.write_bytes(model_dir / "config.pbtxt", text.encode())
        atomic.fsync_dir(repository)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return model_dir / str(version)


def config_pbtxt(name, inputs, outputs, max_batch_size, instances, kind, evidence, origin) -> str:
    batched = max_batch_size > 0
    target = deployed(evidence)
    openvino = target.runtime == "openvino"
    threads = target.intra_op_threads if target.intra_op_threads is not None else "?"
    lines = [f"# {origin}, written by python -m pipeline.registry export-triton",
             f"# gated on: {' '.join(filter(None, (target.runtime, target.version)))}, precision "
             f"{target.precision}, {threads} threads"
             + (f", hint {target.performance_hint}" if openvino else ""),
             f'name: "{name}"']
    if openvino:  # Triton's openvino backend reads ONNX files too
        lines += ['backend: "openvino"', 'default_model_filename: "model.onnx"']
        if target.precision == "fp32":
            lines.append("# INFERENCE_PRECISION_HINT f32 was gated, and this backend has no key "
                         "for it (only HINT_BF16): on a CPU with AVX512-BF16 or AMX OpenVINO's "
                         "default is bf16, so serve this where it computes f32 or re-gate in bf16")
    else:
        lines += ['platform: "onnxruntime_onnx"', 'backend: "onnxruntime"']
        if target.disabled_optimizers:
            lines.append(f"# gated with ONNX Runtime's {', '.join(target.disabled_optimizers)} "
                         "off (named in the model's metadata), which this config cannot set: serve "
                         "where the session honours it, or re-gate with it on")
    lines.append(f"max_batch_size: {max_batch_size}")
    for title, tensors in (("input", inputs), ("output", outputs)):
        lines.append(f"{title} [")
        for i, (tname, ttype, dims) in enumerate(tensors):
            if batched:
                if not dims or dims[0] != -1:
                    raise RegistryError(f"{title} {tname!r} has dims {dims}: its first dim is not "
                                        "a dynamic batch; export with --max-batch-size 0")
                dims = dims[1:]
            lines += ["  {", f'    name: "{tname}"', f"    data_type: {ttype}",
                      f"    dims: [ {', '.join(map(str, dims))} ]",
                      "  }" + ("," if i < len(tensors) - 1 else "")]
        lines.append("]")
    if batched:
        preferred = [b for b in _batch_sizes(evidence) if 1 < b <= max_batch_size]
        lines += ["dynamic_batching {"]
        if preferred:
            lines.append(f"  preferred_batch_size: [ {', '.join(map(str, preferred))} ]")
        lines += ["  max_queue_delay_microseconds: 100", "}"]
    lines += ["instance_group [", "  {", f"    count: {instances}", f"    kind: {kind}", "  }",
              "]"]
    threads = ((evidence.get("config") or {}).get("hardware") or {})
    if openvino:  # the compile settings the accuracy and latency were measured with
        params = {"INFERENCE_NUM_THREADS": threads.get("intra_op_threads"), "NUM_STREAMS": 1,
                  "PERFORMANCE_HINT": str(target.performance_hint).upper()}
        if target.precision == "bf16":
            params["HINT_BF16"] = "YES"
        for key, value in params.items():
            if value is not None:
                lines += ["parameters {", f'  key: "{key}"',
                          f'  value: {{ string_value: "{value}" }}', "}"]
        return "\n".join(lines) + "\n"
    for key, field in (("intra_op_thread_count", "intra_op_threads"),
                       ("inter_op_thread_count", "inter_op_threads")):
        if isinstance(threads.get(field), int):  # as benchmarked, so the latency carries over
            lines += ["parameters {", f'  key: "{key}"',
                      f'  value: {{ string_value: "{threads[field]}" }}', "}"]
    return "\n".join(lines) + "\n"


def deployed(evidence: dict) -> Deployed:
    """The runtime the version was gated on (``runtime.deployed`` in its evidence, filled from
    its config's ``hardware`` where evidence from before runtimes were recorded lacks it)."""
    return Deployed.read((evidence.get("runtime") or {}).get("deployed"),
                         (evidence.get("config") or {}).get("hardware"))


def _signature(model: Path):
    import onnx

    m = onnx.load(str(model), load_external_data=False)
    inits = {i.name for i in m.graph.initializer}

    def describe(values):
        out = []
        for v in values:
            t = v.type.tensor_type
            elem = onnx.TensorProto.DataType.Name(t.elem_type)
            if elem not in TYPES:
                raise RegistryError(f"tensor {v.name!r}: element type {elem} has no Triton type")
            dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else -1
                    for d in t.shape.dim]
            out.append((v.name, TYPES[elem], dims))
        return out
    return describe([i for i in m.graph.input if i.name not in inits]), describe(m.graph.output)


def _batch_sizes(evidence: dict) -> list[int]:
    sizes = ((evidence.get("config") or {}).get("bench") or {}).get("batch_sizes") or []
    return sorted({int(b) for b in sizes if isinstance(b, int) and b > 0})


def _exported(model_dir: Path, digest: str) -> Path | None:
    for meta in model_dir.glob("*/registry.json") if model_dir.exists() else []:
        try:
            if json.loads(meta.read_text()).get("digest") == digest:
                return meta.parent
        except ValueError:
            continue
    return None


def _rename(src: Path, dst: Path) -> None:
    try:
        src.rename(dst)
    except OSError as e:
        raise RegistryError(f"cannot move {src} to {dst} ({e.strerror}); the staging folder "
                            "and the repository must be on one filesystem") from None
