"""How a runtime says it cannot run a model: ``RuntimeFailure``, and the one informative line of
an engine's error.

In: an engine's exception. Out: ``RuntimeFailure`` (a ``StageError`` naming the runtime, which
callers record per runtime before going on with the others) and ``first_line``. Kept apart from
``pipeline.runtimes`` so the backends, which that package imports by name, never import it back.
"""
from __future__ import annotations

from pipeline.core.errors import StageError


class RuntimeFailure(StageError):
    """A runtime cannot run this model (missing, unsupported operator, compile failure)."""


def first_line(e: BaseException) -> str:
    """The informative line of an engine's multi-line error (OpenVINO's end in a summary)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    for ln in reversed(lines):
        if ln.startswith("-- ") or "not support" in ln.lower() or "No conversion" in ln:
            return ln.lstrip("- ")
    return lines[-1] if lines else type(e).__name__
