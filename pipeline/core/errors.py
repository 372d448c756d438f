"""Expected failures, each with the exit code ``python -m pipeline`` ends with.

Anything raised as a ``PipelineError`` is printed as one readable line, without a traceback.
So is an ``OSError`` (permission denied, not a directory, no space left, a read-only filesystem):
a fault of the machine, not of the code, named by its path and cause, exit code 3.
Anything else is a bug and keeps its traceback.
"""
from __future__ import annotations

import errno
import io


class PipelineError(Exception):
    exit_code = 3


class ConfigError(PipelineError):
    """A bad config value or override: nothing has run yet."""
    exit_code = 2


class StageError(PipelineError):
    """A stage failed (bad input, runtime crash, parity mismatch); nothing half-written is kept."""
    exit_code = 3


class GateFailed(PipelineError):
    """The candidate was built and measured but does not pass; it and its report are kept."""
    exit_code = 1


class RegistryError(PipelineError):
    """A registry failed or refused an operation (unreachable, missing version, bad reply)."""
    exit_code = 3


class CorruptBlob(RegistryError):
    """Bytes read from a registry do not match their digest; nothing was handed out."""
    exit_code = 3


class PromotionRefused(RegistryError):
    """An alias was asked to point at a version whose gate failed, without ``--force``."""
    exit_code = 1


OS_ERROR_EXIT = 3  # like a failed stage: the machine refused, nothing half-written is trusted


def describe_os_error(e: OSError) -> str:
    """``PATH: cause (ENAME)`` in one line. A failed ``write`` carries no file name, so the file
    is looked up in the frames the error passed through (the open file object being written)."""
    path = e.filename if e.filename is not None else _file_in_traceback(e.__traceback__)
    cause = e.strerror or str(e) or type(e).__name__
    code = errno.errorcode.get(e.errno, "") if e.errno else ""
    where = f"{path}" + (f" -> {e.filename2}" if e.filename2 is not None else "")
    return (f"{where}: " if path is not None else "") + cause + (f" ({code})" if code else "")


def _file_in_traceback(tb):
    """The name of the file being written in the innermost frame that holds one (a copy's source,
    open for reading in the same frame, is not the file that failed), else None."""
    name = None
    while tb is not None:
        for value in tb.tb_frame.f_locals.values():
            if (isinstance(value, io.IOBase) and isinstance(getattr(value, "name", None), str)
                    and any(c in str(getattr(value, "mode", "")) for c in "wax+")):
                name = value.name
                break
        tb = tb.tb_next
    return name


BUG_EXIT = 4  # an unexpected exception: distinct from 1 (gate failed), 2 (config), 3 (stage)


def cli(run, argv: list[str], doc: str) -> int:
    """A command line's shell: ``-h`` prints ``doc``; a ``PipelineError`` becomes one line on
    stderr and its exit code, an ``OSError`` one line naming the path and cause with exit code 3,
    an interrupted run (``pipeline.core.interrupt``) one line and 130 or 143; ``run(argv)`` gives the
    exit code otherwise. Anything else is a bug: it keeps its traceback and ends with
    ``BUG_EXIT``, never 1, which scripts read as "the gate failed"."""
    import sys

    from pipeline.core.interrupt import Interrupted

    if argv and argv[0] in ("-h", "--help"):
        print(doc)
        return 0
    try:
        return run(argv)
    except Interrupted as e:  # SIGINT/SIGTERM where ``run`` handles them (pipeline.core.interrupt)
        print(e.line(), file=sys.stderr)
        return e.exit_code
    except PipelineError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except OSError as e:  # the machine's fault (permissions, a file for a folder, a full disk)
        print(f"error: {describe_os_error(e)}", file=sys.stderr)
        return OS_ERROR_EXIT
    except Exception:  # noqa: BLE001 - a bug: shown in full, with its own exit code
        import traceback

        traceback.print_exc()
        print("error: an unexpected failure (a bug in pipeline; the traceback is above)",
              file=sys.stderr)
        return BUG_EXIT
