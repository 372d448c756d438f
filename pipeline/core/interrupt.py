"""Ctrl-C and SIGTERM: how a run stops when asked to, in one place.

In: SIGINT (Ctrl-C, sent by a terminal to every process of the foreground group) or SIGTERM
(``timeout``, ``docker stop``, SLURM). Out: an ``Interrupted`` exception raised in the main
process, which unwinds the run like any failure: the runner removes the stage's temporary folder
and its key lock, the stage's child process is killed, and the command line writes a report with
``status: interrupted``, prints one line and exits 128 + the signal's number (130, 143).

Who decides: only the main process. Child processes (``pipeline.core.isolate``) never handle a signal
themselves, so none prints a traceback of its own:
- the forkserver and each child start with SIGINT and SIGTERM blocked (``deferred`` around the
  start), so a Ctrl-C that reaches them while they import their libraries is never delivered;
- a child (``as_child``) then moves to a process group of its own (a terminal's Ctrl-C reaches
  only the main process), ignores SIGINT, takes SIGTERM's default (dies silently, and the main
  process reports the run as interrupted), and is killed by the kernel if its parent dies;
- on an interrupt the main process kills the child's whole group (``kill_group``) and waits for
  it, so nothing writes into a folder being removed.

Code that wants to say where a run was stopped (a long search, say) catches ``Interrupted``,
adds what it knows and re-raises it; nothing else should catch it. ``e.at("in the mixed search")``
names the place unless an inner one already did (the runner names the stage); to add to the
stage's name, extend ``e.where`` (``"in stage quantize[mixed 12]"`` + ``", candidate 12 of 40"``).
A second signal during the clean-up is ignored, so the clean-up finishes.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys

SIGNALS = (signal.SIGINT, signal.SIGTERM)
_raised = False  # an Interrupted is unwinding: later signals are ignored until it has
_deferring = False  # inside ``deferred``: a signal is noted, and raised when it ends
_pending: int | None = None


class Interrupted(BaseException):
    """A run stopped by a signal. A ``BaseException`` (as ``KeyboardInterrupt`` is), so no
    ``except Exception`` along the way mistakes it for a failure to report and carry on from."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.where: str | None = None   # "in stage quantize": set by the innermost code that knows
        self.report: str | None = None  # the interrupted run's report, once written

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # what a shell shows for a process its signal ended

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    def at(self, where: str) -> "Interrupted":
        self.where = self.where or where
        return self

    def line(self) -> str:
        return (f"interrupted {self.where + ' ' if self.where else ''}({self.name}); "
                "cached stages are kept, rerun to resume"
                + (f"; report {self.report}" if self.report else ""))


def interrupted(signum: int) -> Interrupted:
    """The exception for a signal the run received (directly, or through its child's death)."""
    global _raised
    _raised = True
    return Interrupted(signum)


def _handler(signum, frame):
    global _pending
    if _raised:
        return  # the first signal's clean-up is under way: let it finish
    if _deferring:
        _pending = _pending or signum
        return
    raise interrupted(signum)


# A child killed on an interrupt cannot release the semaphores a library made in it; the
# resource tracker, a process multiprocessing starts beside the run, removes them once the run has
# ended and warns about each on stderr, after the run's one line. Its warnings are passed to it on
# its command line, from this list, when it starts (before the first child).
_QUIET_TRACKER = "ignore::UserWarning:multiprocessing.resource_tracker"


@contextlib.contextmanager
def handled():
    """In the main process: SIGINT and SIGTERM raise ``Interrupted`` while this is entered."""
    global _raised, _pending
    _raised, _pending = False, None
    if _QUIET_TRACKER not in sys.warnoptions:
        sys.warnoptions.append(_QUIET_TRACKER)
    old = {s: signal.signal(s, _handler) for s in SIGNALS}
    hook, sys.unraisablehook = sys.unraisablehook, _redelivering(sys.unraisablehook)
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        sys.unraisablehook = hook
        _raised = False


def _redelivering(previous):
    """The handler runs wherever the main thread is, and that may be a weakref callback or a
    ``__del__`` (a garbage collection), where Python prints the exception and drops it. The run
    then went on, deaf: later signals are ignored once one was raised (seen: a SIGTERM while a
    push waited on a registry that never answered, and the run hung). Such an Interrupted is
    raised again, silently, once the main thread is back in ordinary code: another thread sends
    the signal again a moment later (sent from here, its handler would run inside this hook,
    where an exception is dropped too; one that lands in a finalizer again comes back again)."""
    import threading

    def hook(unraisable):
        global _raised
        if not isinstance(unraisable.exc_value, Interrupted):
            return previous(unraisable)
        _raised = False
        threading.Thread(target=_send_again, args=(unraisable.exc_value.signum,),
                         daemon=True).start()
    return hook


def _send_again(signum: int) -> None:
    import time

    time.sleep(0.05)  # the hook and the finalizer it reports on have returned by then
    os.kill(os.getpid(), signum)


@contextlib.contextmanager
def deferred():
    """SIGINT and SIGTERM held back (raised on exit): around starting a child, so that the
    forkserver and the child inherit them blocked, and an interrupt never lands half-way through
    the start, with a child running that nobody would kill. Blocking is per thread, and the
    kernel hands a signal to any thread that does not block it (a runtime's thread pool), after
    which Python still runs the handler in the main thread: the handler itself defers too."""
    global _deferring, _pending
    # multiprocessing's resource tracker unblocks these signals after starting itself: start it
    # first, outside, so it cannot undo the block.
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    old = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    outer, _deferring = _deferring, True
    try:
        yield
    finally:
        _deferring = outer
        signal.pthread_sigmask(signal.SIG_SETMASK, old)  # a blocked one's handler runs now
        if _pending is not None and not outer and not _raised:
            signum, _pending = _pending, None
            raise interrupted(signum)


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def as_child() -> None:
    """First thing in a child process: the main process alone decides when it stops (above)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.setpgid(0, 0)
    parent = os.getppid()
    with contextlib.suppress(OSError, AttributeError):  # Linux only; elsewhere best effort
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the line above: follow it now
        os._exit(1)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)


def kill_group(proc) -> None:
    """Kill a child started by ``pipeline.core.isolate`` and everything it started, and reap it."""
    if proc.pid is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # its group: as_child made it the leader
    with contextlib.suppress(ProcessLookupError, PermissionError):
        proc.kill()  # in case it was stopped before it could make a group of its own
    proc.join()
