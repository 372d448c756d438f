"""The ONNX Runtime backend: sessions created the one way this project allows.

In: an ONNX file and the target's settings (provider, thread counts). Out: a loaded model whose
``run`` returns the first output, and whose ``describe`` names the provider, the thread settings
and, from one profiled run of ONNX Runtime's own profiler, the input type each compute kernel
executed with (``QLinearConv`` on uint8 is INT8; ``Conv`` on float is FP32, even in an FP16 model,
where ONNX Runtime inserts casts around its FP32 kernels).

Every session in a process shares one process-global thread pool. With a pool per session, two
sessions timed alternately on 2 cores slow each other through spinning workers (two identical
models read 0.67x against each other, measured here); with one shared pool they read 1.00x.
Call only inside a child process (``pipeline.core.isolate``): the pool size can be set once per process.
ONNX Runtime's CPU provider computes float ops in FP32 (no BF16 or FP16 inference precision on
x86), so ``precision`` other than fp32 is refused.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from pipeline.core.errors import StageError

NAME = "onnxruntime"
_pool_set = False
# Input element types in ONNX Runtime's profile -> the precision the kernel computed in.
_TYPES = {"uint8": "int8", "int8": "int8", "float": "fp32", "float16": "fp16",
          "bfloat16": "bf16", "double": "fp64"}


def version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("onnxruntime")
    except metadata.PackageNotFoundError:
        return None


def precisions() -> tuple[str, ...]:
    return ("fp32",)


# onnxruntime's log severities: 3 = errors, 4 = fatal only. A probe's errors are raised to the
# caller as exceptions all the same; only the duplicate on stderr goes.
QUIET = 4


def _options(hardware, optimize: bool = True):
    import onnxruntime as ort
    from onnxruntime.capi._pybind_state import set_global_thread_pool_sizes

    global _pool_set
    if not _pool_set:
        set_global_thread_pool_sizes(hardware.intra_op_threads, hardware.inter_op_threads)
        _pool_set = True
    so = ort.SessionOptions()
    so.use_per_session_threads = False
    so.log_severity_level = 3  # warnings about unused initializers are noise here
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return so


# The key under which a model's own metadata names ONNX Runtime graph optimizers to leave off:
# a property of the model (the quantize stage sets it), honoured by every session made here.
DISABLED_OPTIMIZERS = "onnxruntime.disabled_optimizers"


def disabled_optimizers(model: Path) -> list[str]:
    import onnx

    props = {p.key: p.value for p in onnx.load(str(model), load_external_data=False).metadata_props}
    return [name for name in props.get(DISABLED_OPTIMIZERS, "").split(",") if name]


def session(model: Path, hardware, optimize: bool = True, options=None, probe: bool = False):
    """``probe``: a graph the pipeline wrote and is checking (a rewrite, a fusion), whose refusal
    by the runtime is an expected answer that the caller records in one line; the runtime's own
    error log (a red ``[E:onnxruntime ...]`` line on the user's terminal) is turned off for it."""
    import onnxruntime as ort

    so = options or _options(hardware, optimize)
    if probe:
        so.log_severity_level = QUIET
    return ort.InferenceSession(str(model), so, providers=[hardware.provider],
                                disabled_optimizers=disabled_optimizers(model) or None)


def feeds_for(sess, batch) -> dict:
    """A batch as ONNX Runtime's feeds: a dict (input name -> array) as it is, a bare array as
    the first input."""
    return batch if isinstance(batch, dict) else {sess.get_inputs()[0].name: batch}


def run(sess, batch):
    """The first output for one batch (feeds by input name, or one array for the first input)."""
    return sess.run(None, feeds_for(sess, batch))[0]


class OrtModel:
    def __init__(self, model: Path, settings):
        self.model, self.settings = model, settings
        self.sess = session(model, settings)
        self._input = self.sess.get_inputs()[0].name

    def run(self, batch):
        return self.sess.run(None, batch if isinstance(batch, dict) else {self._input: batch})[0]

    def describe(self, example=None) -> dict:
        s = self.settings
        out = {"runtime": NAME, "version": version(), "precision": "fp32",
               "settings": {"provider": s.provider, "intra_op_threads": s.intra_op_threads,
                            "inter_op_threads": s.inter_op_threads, "global_thread_pool": True,
                            "disabled_optimizers": disabled_optimizers(self.model)}}
        if example is not None:
            out["executed"] = executed(self.model, s, example)
        return out


def _profile(path: Path) -> list:
    """The events onnxruntime's profiler wrote to ``path``. It reports no failed write: a full
    disk leaves a cut-off file (a JSONDecodeError, naming nothing). Such a file is never used;
    a write of our own beside it says why, in one line naming the folder (ENOSPC), else the
    file is named as not whole."""
    import errno

    try:
        return json.loads(path.read_text())
    except ValueError:
        pass
    probe = path.with_name(".space-probe")
    try:
        with open(probe, "wb") as f:  # about what the profile needed: a full disk says so
            f.write(b"\0" * max(65536, path.stat().st_size))
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise OSError(e.errno or errno.ENOSPC, e.strerror or "No space left on device",
                      str(path.parent)) from None
    finally:
        probe.unlink(missing_ok=True)
    raise StageError(f"{path}: onnxruntime's profile is not whole JSON "
                     f"({path.stat().st_size} bytes); nothing was read from it")


def executed(model: Path, settings, example) -> dict:
    """Per compute op type, the precision its kernels ran in: one profiled run of a separate
    session with the same options (profiling slows every run, so never the timed session)."""
    from pipeline.runtimes.ops import COMPUTE_OPS, executed_summary

    so = _options(settings)
    so.enable_profiling = True
    with tempfile.TemporaryDirectory(prefix="ort-profile-") as tmp:
        so.profile_file_prefix = os.path.join(tmp, "profile")
        sess = session(model, settings, options=so)
        sess.run(None, feeds_for(sess, example))
        events = _profile(Path(sess.end_profiling()))
    ops: dict[str, dict[str, int]] = {}
    for e in events:
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time"):
            continue
        op = e["args"].get("op_name", "")
        base = op.removeprefix("QLinear").removeprefix("Fused").replace("Integer", "")
        base = base.replace("ToFloat", "").removeprefix("DynamicQuantize")
        if base not in COMPUTE_OPS:
            continue
        types = e["args"].get("input_type_shape") or [{}]
        dtype = _TYPES.get(next(iter(types[0]), ""), next(iter(types[0]), "?"))
        if op.startswith("DynamicQuantize"):  # float in, quantized inside the kernel
            dtype = "int8"
        ops.setdefault(op, {}).setdefault(dtype, 0)
        ops[op][dtype] += 1
    return executed_summary(ops)


def load(model: Path, settings) -> OrtModel:
    from pipeline.runtimes.failure import RuntimeFailure

    if settings.precision != "fp32":
        raise RuntimeFailure(f"{NAME} {settings.precision}: its CPU provider computes float ops "
                             "in fp32 only")
    return OrtModel(model, settings)
