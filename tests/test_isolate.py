"""Child processes: a child's own children start fast (they preload only the runtime)."""
from __future__ import annotations

import importlib
import os
import subprocess
import sys

from pipeline.core import isolate


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


def _preloaded() -> list[str]:
    return sorted(m for m in isolate.STAGE_IMPORTS if m in sys.modules)


def test_a_run_without_torch_in_its_parent_still_preloads_what_most_stages_import(tmp_path):
    """torch, sympy and onnxscript are imported once in the forkserver, not in each stage (a
    torch model's load, export and prepare each imported torch: 2.5 CPU-s of a tiny run's 18)."""
    from tests.conftest import ROOT

    code = ("import sys; from pipeline.core import isolate; from pipeline.engine.runner import "
            f"Runner; from tests.test_isolate import _preloaded; Runner({str(tmp_path)!r}, None, "
            "log=print); assert 'torch' not in sys.modules; "
            "print(isolate.call('probe', _preloaded))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(sorted(isolate.STAGE_IMPORTS)), proc.stdout


def _fails_in_an_expression(names):
    return len(names) + names["missing"]  # Python 3.11 prints carets under the subscript


def test_a_childs_error_is_one_line_naming_where_it_was_raised():
    import pytest

    from pipeline.core.errors import StageError

    with pytest.raises(StageError) as e:
        isolate.call("stage evaluate", _fails_in_an_expression, {"present": 1})
    message = str(e.value)
    line = _fails_in_an_expression.__code__.co_firstlineno + 1
    assert message == (f"stage evaluate: KeyError: 'missing' (at {__file__}:{line} in "
                       "_fails_in_an_expression)")
    assert "^" not in message and "\n" not in message
