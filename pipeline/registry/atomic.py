"""Crash-safe file writes and advisory locks for the local store and the Triton export.

In: bytes or a readable stream, and a final path. Out: a file that is either absent or complete
at that path: the data goes to a temporary file on the same filesystem, is fsynced, renamed over
the final name (``os.replace`` is atomic on POSIX) and the folder is fsynced so the rename itself
survives a power cut. Locks are ``fcntl.flock`` on a lock file: the kernel drops them when the
holder dies, so a SIGKILLed writer never leaves a lock behind. Not handled: network filesystems
whose flock or rename is not atomic (NFS before v4), and Windows.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator

CHUNK = 1 << 20


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_path(folder: Path, hint: str) -> Path:
    return folder / f".tmp-{hint}-{uuid.uuid4().hex[:12]}"


def write_bytes(path: Path, data: bytes, tmp_dir: Path | None = None) -> None:
    """Write ``data`` to ``path`` atomically (temporary file in ``tmp_dir`` or beside it)."""
    tmp = temp_path(tmp_dir or path.parent, path.name)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_stream(path: Path, stream: BinaryIO | Iterator[bytes], tmp_dir: Path,
                 expected: str | None = None) -> tuple[str, int]:
    """Copy a stream to ``path`` atomically, hashing as it goes: ``(sha256:hex, size)``.

    With ``expected`` set, a mismatch leaves nothing at ``path`` and returns the actual digest, so
    the caller can name the blob in its own error. The final name is only taken by bytes whose hash
    was computed from what was written, never from what a sender claimed.
    """
    tmp = temp_path(tmp_dir, path.name[:16])
    h, size = hashlib.sha256(), 0
    chunks = iter(lambda: stream.read(CHUNK), b"") if hasattr(stream, "read") else stream
    try:
        with open(tmp, "wb") as f:
            for chunk in chunks:
                if chunk:
                    h.update(chunk)
                    f.write(chunk)
                    size += len(chunk)
            f.flush()
            os.fsync(f.fileno())
        digest = f"sha256:{h.hexdigest()}"
        if expected is not None and digest != expected:
            tmp.unlink()
            return digest, size
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return digest, size


def sha256_path(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
    return f"sha256:{h.hexdigest()}"


@contextmanager
def locked(path: Path, shared: bool = False):
    """Hold ``flock`` on ``path`` (created if missing) for the ``with`` block."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock
