"""A user's files: everything a model or a data set is read from lies inside the folder the user
named, and one digest covers it all.

In: the folder (or file) a config key names (``data.path``, ``model.path``) and, per format, the
names its own files give of other files (a saved data set's shards, a sharded checkpoint's index,
an ONNX model's external data). Out: those names resolved, and a sha256 over the content of every
file under the folder, so a file edited in place changes every cache key that reads it.
A name that leads out of the folder (``..``, an absolute path, a symbolic link to elsewhere, at
any depth) is refused in one line naming the key, the file that names it and where it leads,
before any stage and before any library opens it: a folder someone else made could otherwise
make a run read, and publish evidence about, any file the process can read, and a file outside
the digest would change without anything being rebuilt.
Each loader knows which of its files name others (``pipeline.data.load``,
``pipeline.models.hf_folder``, ``pipeline.models.onnx_file``); the checks are these functions.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from pipeline.core.artifact import sha256_file
from pipeline.core.errors import ConfigError

WHY = "every file a model or data set reads must lie inside the folder named"


def _refuse(key: str, what: str, target: Path, base: Path):
    raise ConfigError(f"{key}: {what}, which resolves to {target}, outside {base}; refused ({WHY})")


def inside(root: Path, name: str | Path, key: str, source: str, start: Path | None = None) -> Path:
    """``name`` joined to ``start`` (default ``root``), every symbolic link resolved; refused
    unless it lies in ``root``. ``source`` says which file gave the name (``state.json``)."""
    base = Path(root).resolve()
    target = (Path(start or base).resolve() / name).resolve()  # an absolute name stays itself
    if target != base and base not in target.parents:
        _refuse(key, f"{source} names {str(name)!r}", target, base)
    return target


def files(root: Path, key: str) -> list[Path]:
    """Every file under ``root`` (``root`` itself when it is a file), walked without following
    links; a symbolic link anywhere in it (to a file or a folder) must resolve inside ``root``.
    Links inside the folder are fine: what they reach is walked anyway."""
    root = Path(root)
    if not root.is_dir():
        return [root]
    base = root.resolve()
    found = []
    for folder, dirs, names in os.walk(base, followlinks=False):
        here = Path(folder)
        for name in dirs + names:
            p = here / name
            if p.is_symlink():
                target = p.resolve()
                if target != base and base not in target.parents:
                    _refuse(key, f"{p.relative_to(base)} is a symbolic link (copy the files "
                            "in, e.g. cp -rL, or name the folder that holds them)", target, base)
        found += [here / n for n in names if (here / n).is_file()]
    return sorted(found)


def digest(root: Path, key: str, *extra: Path) -> str:
    """sha256 over (relative name, sha256 of bytes) of every file under ``root`` (or of ``root``
    itself), plus any ``extra`` files (a labels file the user named beside the folder): the
    content's identity, whatever its timestamps say."""
    h = hashlib.sha256()
    for top in (Path(root), *map(Path, extra)):
        base = top.resolve() if top.is_dir() else None
        for f in files(top, key):
            name = str(f.relative_to(base)) if base is not None else f.name
            h.update(json.dumps([name, sha256_file(f)]).encode())
    return h.hexdigest()


def digest_of(named: dict[str, Path]) -> str:
    """The same digest over chosen files, each under the name given (an ONNX model file and its
    external data, by the names the model gives them)."""
    h = hashlib.sha256()
    for name, f in sorted(named.items()):
        h.update(json.dumps([name, sha256_file(Path(f))]).encode())
    return h.hexdigest()


def stamp_of(named: dict[str, Path]) -> tuple:
    """(name, size, mtime in ns, inode) of each file: what says a file was replaced or edited
    without reading it again. A stage that needs the very bytes a run's key was hashed from
    compares this instead of hashing the file a second time."""
    out = []
    for name, f in sorted(named.items()):
        s = Path(f).stat()
        out.append((name, s.st_size, s.st_mtime_ns, s.st_ino))
    return tuple(out)

