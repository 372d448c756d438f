"""The cache's secret key and the seal on each entry, so that an entry edited by hand is never trusted.

In: the cache folder (``<workdir>/cache``) and an entry's manifest (``artifact.json``). Out: the
store's key, made on first use, and an HMAC-SHA256 over the manifest (its files' sha256, its
metadata, its lineage, the key it was built under) made with it. A sha256 alone proves nothing:
whoever edits a cached number can recompute it. An HMAC can only be recomputed by someone who can
read the key, so the runner reuses an entry only when its seal verifies.

The key is ``<cache>/.hmac-key``: 32 random bytes (hex), mode 0600, owned by whoever made the
cache. Two runs that start together on a new cache must agree on one key: each writes its own
candidate to a temporary file (``O_EXCL``, fsynced), then ``link``s it to the final name. A link,
unlike a rename, never replaces a file that is there, so the first one wins and the other reads
it (on a filesystem without hard links the key is written in place with ``O_EXCL``, and a reader
that finds it still short waits a moment). A key that other users may change, or that every user
may read, is refused: anyone who can read it can forge entries, and anyone who can write the
cache's folder can put a key of their own there (docs/stages.md, "Trust").
"""
from __future__ import annotations

import errno
import hashlib
import hmac
import json
import os
import secrets
import stat
import time
import uuid
from pathlib import Path

from pipeline.core.errors import PipelineError

KEY_FILE = ".hmac-key"
KEY_BYTES = 32
_NO_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV, errno.EMLINK}
_WRITING_S = 10.0  # how long a short key may still be being written by the run that made it


def store_key(cache: Path) -> bytes:
    """The key of the cache at ``cache``, made now if it has none."""
    path = Path(cache) / KEY_FILE
    deadline = time.monotonic() + _WRITING_S
    while True:
        try:
            key = _read(path)
        except FileNotFoundError:
            _make(path)
            continue
        if key is not None:
            return key
        if time.monotonic() > deadline:  # short for longer than any writer takes
            raise PipelineError(f"cache key {path} is damaged (not {2 * KEY_BYTES} hex digits): "
                                "delete it, and every entry of this cache is rebuilt")
        time.sleep(0.05)


def _read(path: Path) -> bytes | None:
    """The key, or None while it is still short (being written in place)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as e:
        if e.errno != errno.ELOOP:  # what O_NOFOLLOW says of a link, dangling or not
            raise
        raise PipelineError(f"cache key {path} is a symbolic link (to {os.readlink(path)}), "
                            "not the cache's own file: a link lets whoever can change where it "
                            f"points choose the key, and so forge entries; remove it (rm {path}) "
                            "and a new key is made") from None
    try:
        st = os.fstat(fd)
        text = os.read(fd, 4 * KEY_BYTES)
    finally:
        os.close(fd)
    if not stat.S_ISREG(st.st_mode):
        raise PipelineError(f"cache key {path} is not a regular file")
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o022 or mode & 0o004:
        who = "changed by other users" if mode & 0o022 else "read by every user"
        raise PipelineError(f"cache key {path} can be {who} (mode {mode:04o}), so anyone could "
                            f"forge cache entries: chmod 600 {path} (640 to share the cache with "
                            "a group you trust)")
    try:
        key = bytes.fromhex(text.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        key = b""
    return key if len(key) == KEY_BYTES else None


def folders(path: Path) -> None:
    """``mkdir -p path``, each folder made here writable by its owner and group only, whatever
    the umask: under ``umask 000`` the cache was 0777 while its key's mode was checked, and in a
    folder every user can write, anyone can replace the key or an entry. A folder that was
    already there is left as its owner set it."""
    path = Path(path)
    made = [p for p in (path, *path.parents) if not p.exists()]
    path.mkdir(parents=True, exist_ok=True)
    for p in made:
        try:
            mode = stat.S_IMODE(p.stat().st_mode)
            if mode & 0o002:
                p.chmod(mode & ~0o002)
        except FileNotFoundError:  # made and removed by a concurrent run meanwhile
            pass


def _make(path: Path) -> None:
    """Offer a new key; if another run's is there first, theirs stays."""
    folders(path.parent)
    text = (secrets.token_hex(KEY_BYTES) + "\n").encode()
    tmp = path.with_name(f".tmp-key-{os.getpid()}-{uuid.uuid4().hex[:6]}")
    _write_new(tmp, text)
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass  # another run's key won: it is read next
    except OSError as e:
        if e.errno not in _NO_LINKS:
            raise
        try:  # no hard links here: in place (readers wait while it is short)
            _write_new(path, text)
        except FileExistsError:
            pass
    finally:
        os.unlink(tmp)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the name as well as the bytes survive a crash
    finally:
        os.close(dir_fd)


def _write_new(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)  # exactly, whatever the umask
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def seal(key: bytes, manifest: dict) -> str:
    """HMAC-SHA256 over the manifest (without its seal), canonically serialized."""
    body = {k: v for k, v in manifest.items() if k != "hmac"}
    blob = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(key, blob, hashlib.sha256).hexdigest()


def verifies(key: bytes, manifest: dict) -> bool:
    given = manifest.get("hmac")
    return isinstance(given, str) and hmac.compare_digest(given, seal(key, manifest))
