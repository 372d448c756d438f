"""Run a function in a child process, so that a crashing runtime fails a stage, not the pipeline.

In: a picklable function and arguments. Out: its return value, or a ``StageError`` that names
the stage and the signal (for a segfault) or the child's exception. ONNX Runtime has been seen to
segfault while creating a session for an FP16 model with an LSTM on the CPU provider; every session
on a candidate model is therefore created in a child. ``forkserver`` gives each child a clean
process (no inherited thread pools) while preloading the heavy imports once. Signals: only the
parent decides when a child stops (``pipeline.core.interrupt``); an interrupted parent kills the child
and all it started before the exception goes on.
"""
from __future__ import annotations

import multiprocessing as mp
import signal
import sys
import traceback

from pipeline.core import interrupt
from pipeline.core.errors import PipelineError, StageError, describe_os_error

_ctx = None
ALWAYS = ["numpy", "onnx", "onnxruntime"]
# Imported by every child once the run needs them, and slow to import (1.5 to 3 s each): a run
# on the user's data reads it through ``datasets`` in every stage, a torch model loads torch.
# The forkserver imports them once when the parent already has (it checked the model and data
# before the first stage), instead of every child paying for them again.
IF_LOADED = ["datasets", "torch", "transformers"]
# Imported by several stages of nearly every pipeline run, whatever the parent holds: torch by a
# torch model's load and export and by every INT8 run's prepare (onnxruntime.tools, which its shape
# inference imports, imports torch whenever it is installed); sympy by export and by that shape
# inference; onnxscript by export and optimize. The runner asks for them (``preload``), once a
# run: the tiny OCR run imported torch three times, sympy and onnxscript twice each, 2.5 of its
# 18 CPU-seconds. A lone ``call`` (a probe, a unit test) does not pay for them. One that is not
# installed is skipped: the forkserver passes over a preload that raises ImportError.
STAGE_IMPORTS = ["torch", "sympy", "onnxscript"]
# Asked for by a task whose every stage imports more than these (model=hf: transformers' model
# and tokenizer code, seconds per child): ``preload``.
ASKED: list[str] = []
# Set in a child. A child that isolates work of its own (the fp16 stage tries its converted graphs)
# starts a forkserver of its own (multiprocessing does not hand the parent's to a forkserver's
# children), which then preloads only the runtime.
_IN_CHILD = False


def preload(modules) -> None:
    """Have the forkserver import ``modules`` too, once for all children. Asked before the first
    child starts; afterwards the server runs and this changes nothing (children then import what
    they need themselves, as before)."""
    ASKED.extend(m for m in modules if m not in ASKED)
    if _ctx is not None:
        _ctx.set_forkserver_preload(_modules())


def _modules() -> list[str]:
    if _IN_CHILD:  # a child's own children only probe a runtime: 0.4 s to start, not 1.4 with torch
        return ALWAYS
    # each once, in order: torch is both loaded by the parent and asked for by the runner
    return list(dict.fromkeys(ALWAYS + [m for m in IF_LOADED if m in sys.modules] + ASKED))


def context():
    """The forkserver context every child of the pipeline is started from."""
    global _ctx
    if _ctx is None:
        _ctx = mp.get_context("forkserver")
        _ctx.set_forkserver_preload(_modules())
    return _ctx


def _child(conn, fn, args, kwargs):
    global _IN_CHILD
    _IN_CHILD = True
    interrupt.as_child()
    try:
        conn.send(("ok", fn(*args, **kwargs)))
    except PipelineError as e:
        conn.send(("expected", (type(e).__name__, str(e))))
    except OSError as e:  # a full disk or a read-only folder: the machine's fault, one line
        conn.send(("expected", (type(e).__name__, describe_os_error(e))))
    except BaseException as e:  # noqa: BLE001 - reported to the parent in one line
        conn.send(("error", f"{type(e).__name__}: {_first_line(e)}{_where(e)}"))
    finally:
        conn.close()


def call(what: str, fn, *args, **kwargs):
    """Run ``fn(*args, **kwargs)`` in a child; ``what`` names the work in error messages."""
    ctx = context()
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child, fn, args, kwargs), daemon=False)
    try:
        with interrupt.deferred():  # the child starts with signals blocked; it unblocks them
            proc.start()
        child.close()
        status, payload = parent.recv()
    except EOFError:
        proc.join()
        code = proc.exitcode
        if code is not None and -code in interrupt.SIGNALS:  # SLURM signals every process
            raise interrupt.interrupted(-code) from None
        if code is not None and code < 0:
            name = signal.Signals(-code).name
            raise StageError(f"{what}: the runtime crashed ({name}) in its child process") from None
        raise StageError(f"{what}: child process exited with code {code} without a result") from None
    except BaseException:  # interrupted (or a failure here): the child must not outlive this
        interrupt.kill_group(proc)
        raise
    finally:
        parent.close()
        # On success the child is already leaving (an interrupted one was killed above).
        if proc.pid is not None:  # started
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
                proc.join()
    if status == "ok":
        return payload
    if status == "expected":
        raise StageError(f"{what}: {payload[1]}")
    raise StageError(f"{what}: {payload}")


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0] if lines else ""


def _where(e: BaseException) -> str:
    """`` (at file:line in function)``: the innermost frame the error was raised in, read from the
    traceback's frames (its printed text ends with Python 3.11's caret line, no place at all)."""
    frames = traceback.extract_tb(e.__traceback__)
    if not frames:
        return ""
    f = frames[-1]
    return f" (at {f.filename}:{f.lineno} in {f.name})"
