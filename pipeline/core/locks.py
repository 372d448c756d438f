"""Locks that let concurrent jobs share one cache and one machine without spoiling each other.

In: a cache entry's folder, or a stage about to run. Out: context managers built on
``fcntl.flock``, which the kernel releases when the holding process dies, so a killed job never
leaves a lock behind (flock also works across machines on NFS, where Linux maps it to the
server's byte-range locks).

- ``key_lock(final)``: one builder per cache key. The lock file ``.lock-<key>`` lies beside the
  key's folder while a job builds it; a second job that needs the same stage waits, then finds it
  built and reuses it.
- ``machine_slot(timed)``: a machine-wide readers-writer lock per host. Compile stages share it;
  a timed stage (benchmark, load test, the INT8 profile and the end-to-end comparison) holds it
  alone, so no other job's work runs on the cores while it measures. A waiting timed stage also
  holds a turnstile that new compile stages must pass, so a stream of compile work cannot starve
  it. The slot records where and when it ran and how long it waited, for the report.
The lock files live in ``$PIPELINE_LOCK_DIR`` (default: the system temp folder), named after the
host: every job on this machine sees them whatever its workdir.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import tempfile
import time
from pathlib import Path

# Stages whose numbers are timings: they must not share the cores with another job's work.
TIMED = frozenset({"benchmark", "loadtest", "explain", "compare"})


def is_timed(stage) -> bool:
    return getattr(stage, "timed", stage.name in TIMED)


def _open(path: Path) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except PermissionError as e:  # another user's lock file in a sticky /tmp: flock needs no write
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:  # no lock file to share: the folder itself is not writable
            raise e from None
    return fd


@contextlib.contextmanager
def _flock(path: Path, mode: int):
    """Hold ``flock(mode)`` on ``path``; yields the seconds spent waiting for it."""
    fd = _open(path)
    try:
        t0 = time.monotonic()
        fcntl.flock(fd, mode)
        yield time.monotonic() - t0
    finally:
        os.close(fd)  # closing releases the lock


def key_lock(final: Path, log=None):
    """One builder per cache key: ``final`` is ``<cache>/<stage>/<key>``. The holder removes the
    lock file when done, so the cache keeps no trace of it; a waiter that then holds the lock of
    a removed file (its inode is no longer at the path) takes the path's new one instead."""
    path = final.with_name(f".lock-{final.name}")

    @contextlib.contextmanager
    def held():
        told = False
        while True:
            fd = _open(path)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if log and not told:
                    log(f"  waiting: another job is building {final.parent.name} {final.name[:12]}")
                    told = True
                fcntl.flock(fd, fcntl.LOCK_EX)
            mine = os.fstat(fd)
            try:
                now = os.stat(path)
            except FileNotFoundError:
                now = None
            if now is not None and (now.st_ino, now.st_dev) == (mine.st_ino, mine.st_dev):
                break
            os.close(fd)
        try:
            yield
        finally:
            try:
                os.unlink(path)  # while still holding it: see above
            except OSError:
                pass
            os.close(fd)

    return held()


def lock_dir() -> Path:
    return Path(os.environ.get("PIPELINE_LOCK_DIR") or tempfile.gettempdir())


@contextlib.contextmanager
def machine_slot(timed: bool, log=None):
    """The machine-wide lock: shared for compile work, exclusive for a timed stage. Yields a dict
    filled in on exit: host, pid, kind, waited_s, start and end (epoch seconds)."""
    host = socket.gethostname()
    base = lock_dir() / f"pipeline-machine-{host}"
    slot = {"host": host, "pid": os.getpid(), "kind": "exclusive" if timed else "shared"}
    t0 = time.monotonic()
    with contextlib.ExitStack() as stack:
        if timed:
            # Take the turnstile first and keep it while waiting: new compile stages queue
            # behind us instead of overtaking us forever.
            stack.enter_context(_flock(base.with_suffix(".turnstile"), fcntl.LOCK_EX))
            fd = _open(base.with_suffix(".lock"))
            stack.callback(os.close, fd)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if log:
                    log("  waiting: other jobs' work on this machine must finish before timing")
                fcntl.flock(fd, fcntl.LOCK_EX)
        else:
            with _flock(base.with_suffix(".turnstile"), fcntl.LOCK_EX):
                pass  # passes at once unless a timed stage is waiting
            stack.enter_context(_flock(base.with_suffix(".lock"), fcntl.LOCK_SH))
        slot["waited_s"] = round(time.monotonic() - t0, 3)
        slot["start"] = time.time()
        try:
            yield slot
        finally:
            slot["end"] = time.time()
