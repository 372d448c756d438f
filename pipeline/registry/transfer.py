"""Pulling and verifying a version, the same way for every backend: hash every byte handed out.

In: a verified manifest and a function that streams one blob's bytes from wherever the backend
keeps it (a file, an HTTP response, an MLflow download). Out: a folder with ``model.onnx``,
``manifest.json`` (the evidence) and ``oci-manifest.json``, written to a temporary sibling and
renamed into place only when every blob matched its digest and size; or, for ``verify``, the list
of blobs that did not. A mismatch raises ``CorruptBlob`` naming the blob's digest and file, so a
flipped byte served with HTTP 200 is never handed to a caller. Not handled: resuming a partial pull.
"""
from __future__ import annotations

import hashlib
import shutil
import uuid
from pathlib import Path
from typing import BinaryIO, Callable, Iterable

from pipeline.errors import CorruptBlob, RegistryError
from pipeline.registry import atomic
from pipeline.registry.package import blobs_of, Blob

Opener = Callable[[Blob], "BinaryIO | Iterable[bytes]"]


def pull_into(dest: Path, where: str, manifest: dict, manifest_bytes: bytes,
              open_blob: Opener) -> Path:
    dest = Path(dest)
    if dest.exists() and not dest.is_dir():
        raise RegistryError(f"pull destination {dest} exists and is not a folder")
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
        atomic.write_bytes(tmp / "oci-manifest.json", manifest_bytes)
        old = None
        if dest.exists():  # a previous pull: moved aside, replaced, then removed
            old = dest.parent / f".old-pull-{dest.name}-{uuid.uuid4().hex[:8]}"
            dest.rename(old)
        tmp.rename(dest)
        atomic.fsync_dir(dest.parent)
        if old is not None:
            shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


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
