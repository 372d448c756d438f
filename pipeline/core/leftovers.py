"""Temporary folders of killed runs: named so their owner can be told, and removed once it is dead.

In: a folder holding ``.tmp-*`` entries (``<workdir>/cache/<stage>/``, ``<workdir>/runs/``) and
``.corrupt-*`` entries (cache entries that failed verification, moved aside). Out: those entries
removed when nobody can be using them, and a count.

A stage's output and a run's report are written into ``.tmp-<hint>-<pid>-<random>`` and renamed
into place when complete; a SIGKILLed run leaves its temporary folder behind. One is removed only
when its owner is certainly gone: the process with that pid is not alive on this machine *and*
nothing in the folder changed for ``STALE_AFTER_S`` (pids are reused, and a workdir shared with
another machine or PID namespace holds pids this one cannot see). A live run's folder is never
removed. ``.corrupt-*`` folders are kept ``CORRUPT_KEPT_S`` (a week, counted from when they were
set aside) so the damage can be inspected, then removed. Not handled: a workdir shared over a
network filesystem by runs on several machines that pause for longer than ``STALE_AFTER_S``.
"""
from __future__ import annotations

import os
import re
import shutil
import time
import uuid
from pathlib import Path

STALE_AFTER_S = 15 * 60
CORRUPT_KEPT_S = 7 * 24 * 3600
_TMP = re.compile(r"^\.tmp-.+-(\d+)-[0-9a-f]{6}$")


def temp_name(hint: str) -> str:
    """``.tmp-<hint>-<pid>-<random>``: a temporary sibling whose owner can be checked later."""
    return f".tmp-{hint}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def set_aside(path: Path, hint: str) -> Path:
    """Move a corrupt entry to ``.corrupt-<hint>-<random>``, dated now (its removal counts from
    here, not from when it was built)."""
    aside = path.with_name(f".corrupt-{hint}-{uuid.uuid4().hex[:6]}")
    shutil.move(str(path), str(aside))
    os.utime(aside)
    return aside


def pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def last_change(path: Path) -> float:
    """The newest mtime of the folder and everything in it."""
    newest = path.lstat().st_mtime
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            try:
                newest = max(newest, os.lstat(os.path.join(root, name)).st_mtime)
            except FileNotFoundError:
                pass
    return newest


def sweep(folder: Path, now: float | None = None) -> int:
    """Remove dead runs' ``.tmp-*`` and old ``.corrupt-*`` entries directly under ``folder``."""
    now = time.time() if now is None else now
    removed = 0
    try:
        entries = list(Path(folder).iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return 0
    for entry in entries:
        try:
            m = _TMP.match(entry.name)
            if m:
                if pid_alive(int(m.group(1))) or now - last_change(entry) < STALE_AFTER_S:
                    continue
            elif not (entry.name.startswith(".corrupt-")
                      and now - entry.lstat().st_mtime >= CORRUPT_KEPT_S):
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
            removed += 1
        except FileNotFoundError:  # another run swept it first
            continue
        except OSError:  # a read-only workdir: the run itself will say so if it matters
            continue
    return removed
