"""ONNX Runtime sessions created the one way this project allows.

Every session in a process shares one process-global thread pool. With a pool per session, two
sessions timed alternately on 2 cores slow each other through spinning workers (two identical
models read 0.67x against each other, measured here); with one shared pool they read 1.00x.
Call only inside a child process (``pipeline.isolate``): the pool size can be set once per process.
"""
from __future__ import annotations

from pathlib import Path

_pool_set = False


def session(model: Path, hardware, optimize: bool = True):
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
    return ort.InferenceSession(str(model), so, providers=[hardware.provider])


def run(sess, images):
    """Logits for one float32 batch."""
    return sess.run(None, {sess.get_inputs()[0].name: images})[0]
