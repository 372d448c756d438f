"""Count the times a file is opened, by any process, with Linux's inotify (``IN_OPEN``).

The security tests use it to show that a file outside the user's folder is never opened: unlike
a permission bit (root reads anyway) or an audit hook (C++ readers such as Arrow's never call
Python's ``open``), inotify sees every open of the file by anyone. ``watch(path)`` is a context
manager whose ``count()`` drains the events so far; the caller opens the file once itself first,
to show the watch works.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import struct
from pathlib import Path

IN_OPEN = 0x20
IN_NONBLOCK = 0o4000
EVENT = struct.Struct("iIII")  # wd, mask, cookie, len (then len bytes of name)


class Watch:
    def __init__(self, fd: int):
        self.fd = fd
        self.opens = 0

    def count(self) -> int:
        """Every open seen so far (the events are read without blocking)."""
        while True:
            try:
                buf = os.read(self.fd, 65536)
            except BlockingIOError:
                return self.opens
            k = 0
            while k < len(buf):
                _, mask, _, n = EVENT.unpack_from(buf, k)
                self.opens += bool(mask & IN_OPEN)
                k += EVENT.size + n


@contextlib.contextmanager
def watch(path: Path):
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(IN_NONBLOCK)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "inotify_init1")
    try:
        if libc.inotify_add_watch(fd, os.fsencode(str(path)), IN_OPEN) < 0:
            raise OSError(ctypes.get_errno(), f"inotify_add_watch {path}")
        yield Watch(fd)
    finally:
        os.close(fd)
