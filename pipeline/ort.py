"""ONNX Runtime sessions for the stages that check conversions (export, optimize, fp16).

The sessions themselves are made by the onnxruntime backend of ``pipeline.runtimes``: one
process-global thread pool shared by every session in the process (per-session pools make two
identical models read 0.67x against each other on 2 cores). Stages that evaluate or time a model
on its target runtime use ``pipeline.runtimes.load`` instead. Call only inside a child process.
"""
from __future__ import annotations

from pipeline.runtimes.onnxruntime import run, session

__all__ = ["run", "session"]
