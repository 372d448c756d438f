"""Child processes: a child's own children start fast (they preload only the runtime)."""
from __future__ import annotations

import importlib
import sys

from pipeline import isolate


def _loaded() -> set[str]:
    return {m for m in ("torch", "onnxruntime") if m in sys.modules}


def _nested():
    return isolate.call("inner", _loaded), isolate._modules()


def test_a_childs_own_children_preload_only_the_runtime():
    importlib.import_module("torch")  # the run has torch loaded, as a torch model's run has

    # a stage's child (the fp16 stage probing op types) isolates work of its own; that child's
    # forkserver must not preload torch again (1.4 s per stage on 2 cores)
    inner, modules = isolate.call("outer", _nested)
    assert modules == isolate.ALWAYS
    assert inner == {"onnxruntime"}
