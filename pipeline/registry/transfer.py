"""Pulling and verifying a version, the same way for every backend: hash every byte handed out.

In: a verified manifest and a function that streams one blob's bytes from wherever the backend
keeps it (a file, an HTTP response, an MLflow download). Out: a folder with ``model.onnx``,
``manifest.json`` (the evidence) and ``oci-manifest.json``, written to a temporary sibling and
renamed into place only when every blob matched its digest and size; or, for ``verify``, the list
of blobs that did not. A mismatch raises ``CorruptBlob`` naming the blob's digest and file, so a
flipped byte served with HTTP 200 is never handed to a caller. Not handled: resuming a partial pull.

The destination is never emptied blindly: a folder is replaced only when it holds exactly an
earlier, unmodified pull of the same model (its ``oci-manifest.json`` names the model and every
file matches its recorded digest); any other non-empty folder is refused, and with ``force`` it
is moved aside (``DIR.replaced-<time>``), never deleted. A destination that is, contains or lies
inside the registry's own folder is refused even with ``force``.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import BinaryIO, Callable, Iterable

from pipeline.core.errors import ConfigError, CorruptBlob, RegistryError
from pipeline.registry import atomic
from pipeline.registry.package import P, blobs_of, Blob

OCI_MANIFEST = "oci-manifest.json"

Opener = Callable[[Blob], "BinaryIO | Iterable[bytes]"]


def pull_into(dest: Path, where: str, manifest: dict, manifest_bytes: bytes,
              open_blob: Opener, force: bool = False, protect: Path | None = None) -> Path:
    """Pull into ``dest``; ``protect`` is a folder the destination may not touch (the store)."""
    dest = Path(dest)
    if dest.is_symlink() and not dest.exists():  # renaming the pull onto it says ENOTDIR
        raise ConfigError(f"pull --out {dest}: a symbolic link to {os.readlink(dest)}, which does "
                          "not exist; nothing was pulled (give a folder, or make the one the "
                          "link names)")
    if dest.exists() and not dest.is_dir():
        raise RegistryError(f"pull destination {dest} exists and is not a folder")
    check_destination(dest, manifest, force, protect)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".tmp-pull-{dest.name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        for blob in blobs_of(manifest):
            name = blob.title or blob.digest.replace(":", "-")
            stream = open_blob(blob)
            try:
                actual, size = atomic.write_stream(tmp / name, stream, tmp, expected=blob.digest)
            finally:
                getattr(stream, "close", lambda: None)()
            _check(where, blob, actual, size)
        atomic.write_bytes(tmp / OCI_MANIFEST, manifest_bytes)
        old = None
        if dest.exists() and any(dest.iterdir()):
            # checked again now that the blobs are here: the folder may have changed meanwhile
            replaceable = check_destination(dest, manifest, force, protect)
            if replaceable:  # an earlier pull of ours: moved aside, replaced, then removed
                old = dest.parent / f".old-pull-{dest.name}-{uuid.uuid4().hex[:8]}"
            else:  # --force on someone's folder: kept beside the pull, never deleted
                kept = dest.with_name(f"{dest.name}.replaced-{time.strftime('%Y%m%d-%H%M%S')}"
                                      f"-{uuid.uuid4().hex[:4]}")
                print(f"pull: moved the previous contents of {dest} to {kept}")
            dest.rename(old or kept)
        elif dest.exists():
            dest.rmdir()  # an empty folder: nothing to keep
        tmp.rename(dest)
        atomic.fsync_dir(dest.parent)
        if old is not None:
            shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def check_destination(dest: Path, manifest: dict, force: bool, protect: Path | None) -> bool:
    """Whether ``dest`` may be replaced as it is (absent, empty or an earlier pull of the same
    model); raises when it may not be, unless ``force`` (then it is to be moved aside)."""
    if protect is not None:
        d, root = dest.resolve(), Path(protect).resolve()
        if root.is_relative_to(d) or d.is_relative_to(root):
            how = "is" if d == root else "contains" if root.is_relative_to(d) else "lies inside"
            raise ConfigError(f"pull --out {dest}: {how} the registry's own folder {protect}; "
                              "choose another folder")
    if not dest.is_dir() or not any(dest.iterdir()):
        return True
    name = (manifest.get("annotations") or {}).get(f"{P}name")
    why = not_a_pull_of(dest, name)
    if why is None:
        return True
    if force:
        return False
    raise ConfigError(f"pull --out {dest}: the folder is not empty and {why}; nothing was "
                      "changed (choose an empty or new folder, or --force to move its contents "
                      "aside)")


def not_a_pull_of(dest: Path, name: str | None) -> str | None:
    """None if ``dest`` holds exactly an unmodified pull of model ``name``, else the reason."""
    try:
        old = json.loads((dest / OCI_MANIFEST).read_bytes())
        old_name = (old.get("annotations") or {}).get(f"{P}name")
        blobs = blobs_of(old)
    except OSError:  # absent, or not a file (a folder, a dangling link)
        return f"holds no {OCI_MANIFEST} of an earlier pull"
    except (ValueError, KeyError, TypeError, AttributeError, RegistryError):
        return f"its {OCI_MANIFEST} is not a pull's"
    if old_name != name:
        return f"holds a pull of another model ({old_name})"
    expected = {b.title or b.digest.replace(":", "-"): b.digest for b in blobs}
    present = {str(p.relative_to(dest)) for p in dest.rglob("*")}
    extra = sorted(present - set(expected) - {OCI_MANIFEST})
    if extra:
        return f"holds files a pull did not write ({', '.join(extra[:3])})"
    for fname, digest in expected.items():
        path = dest / fname
        if not path.is_file() or atomic.sha256_path(path) != digest:
            return f"its {fname} was changed or removed since it was pulled"
    return None


def verify_blobs(where: str, manifest: dict, open_blob: Opener) -> list[str]:
    """One line per blob that is missing or does not match; an empty list when all match."""
    problems = []
    for blob in blobs_of(manifest):
        try:
            stream = open_blob(blob)
            h, size = hashlib.sha256(), 0
            try:
                chunks = iter(lambda: stream.read(atomic.CHUNK), b"") \
                    if hasattr(stream, "read") else stream
                for chunk in chunks:
                    h.update(chunk)
                    size += len(chunk)
            finally:
                getattr(stream, "close", lambda: None)()
            _check(where, blob, f"sha256:{h.hexdigest()}", size)
        except RegistryError as e:
            problems.append(str(e))
    return problems


def _check(where: str, blob: Blob, actual: str, size: int) -> None:
    label = f"blob {blob.digest}" + (f" ({blob.title})" if blob.title else "")
    if actual != blob.digest:
        raise CorruptBlob(f"{label} of {where} does not match its digest (read {actual}): "
                          "refused")
    if size != blob.size:
        raise CorruptBlob(f"{label} of {where} has {size} bytes, its manifest says {blob.size}: "
                          "refused")
