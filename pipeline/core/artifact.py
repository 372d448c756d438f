"""An artifact: a folder of files plus ``artifact.json`` describing where it came from.

In: a folder written by a stage. Out: an ``Artifact`` with the sha256 of every file, the stage's
metadata (metrics, timings, config) and its lineage (parent and reference digests). The digest of
an artifact is a sha256 over its content: its files' names and digests *and* its metadata
(``meta``: accuracy, latencies, speedups, verdict inputs; not what it observed of the machine,
``meta["observed"]``), so two stages that write the same bytes and the same numbers produce the
same digest, and an artifact without files (a benchmark's
numbers) has a digest of its own numbers. Reading re-hashes the files and the metadata: a cache
entry whose bytes or numbers changed is reported as corrupt rather than trusted (editing one
cached speedup would otherwise pass a gate). The key it was built under must be its folder's name.
A sha256 can be recomputed by whoever edits the entry, so the runner also seals every manifest
with the cache's secret (``pipeline.core.seal``) and reuses an entry only when its seal verifies:
``read(path, secret)``. Without ``secret`` (inspecting an entry, not reusing it) the seal is not
checked.
"""
from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.core import seal
from pipeline.core.errors import StageError

MANIFEST = "artifact.json"


class SealMismatch(StageError):
    """An entry whose seal does not verify with the cache's key: edited, or sealed with a key
    the cache no longer has (``Runner`` tells the two apart when it made the key itself)."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def digest_files(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): sha256_file(p)
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != MANIFEST}


FORMAT = 2  # 2: metadata is part of the digest (runner keys carry it, so older entries are not read)


def canonical_meta(meta: dict) -> dict:
    """The metadata as ``artifact.json`` gives it back (JSON types: str keys, lists), so a digest
    made when building equals the one re-made when reading."""
    return json.loads(json.dumps(meta or {}))


# The metadata key of what a stage observed of the machine that ran it (peak memory, how many
# batches it streamed): reported, but not part of the digest, so equal content gets an equal
# digest however it was made, and nothing downstream rebuilds for a different RSS.
OBSERVED = "observed"


def content_digest(files: dict[str, str], meta: dict) -> str:
    """sha256 over the files (name, sha256) and the metadata, canonically serialized (without
    its ``OBSERVED`` part)."""
    meta = {k: v for k, v in canonical_meta(meta).items() if k != OBSERVED}
    blob = {"files": sorted(files.items()), "meta": meta}
    return hashlib.sha256(json.dumps(blob, sort_keys=True, separators=(",", ":"))
                          .encode()).hexdigest()


def files_digest(files: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(sorted(files.items())).encode()).hexdigest()


@dataclass
class Artifact:
    path: Path
    stage: str
    key: str                      # the cache key it was built under
    digest: str                   # sha256 over its files and its metadata
    files: dict[str, str]
    meta: dict = field(default_factory=dict)   # metrics, counts, parity, timings ...
    parent: str | None = None     # parent artifact digest
    refs: dict[str, str] = field(default_factory=dict)  # other inputs by role -> digest
    config: dict = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def model(self) -> Path:
        return self.path / "model.onnx"

    @property
    def files_digest(self) -> str:
        """sha256 over the files alone: what names a published version, so the same bytes are
        published under one name whatever numbers their measurement produced."""
        return files_digest(self.files)

    def to_json(self) -> dict:
        return {"stage": self.stage, "key": self.key, "digest": self.digest, "files": self.files,
                "parent": self.parent, "refs": self.refs, "config": self.config,
                "seconds": self.seconds, "meta": self.meta}

    def write(self, secret: bytes) -> None:
        """``artifact.json``, sealed with the cache's ``secret``."""
        data = json.loads(json.dumps(self.to_json()))  # sealed as it will be read back
        data["hmac"] = seal.seal(secret, data)
        (self.path / MANIFEST).write_text(json.dumps(data, indent=2, sort_keys=True))

    @classmethod
    def read(cls, path: Path, secret: bytes | None = None, verify: bool = True) -> "Artifact":
        """The entry at ``path``; with ``secret``, only if its seal verifies (what reusing
        needs), and with ``verify`` only if its files and metadata match their digests."""
        try:
            data = json.loads((path / MANIFEST).read_text())
        except (OSError, ValueError) as e:
            raise StageError(f"artifact {path}: unreadable {MANIFEST} ({e})") from None
        try:
            art = cls(path=path, stage=data["stage"], key=data["key"], digest=data["digest"],
                      files=data["files"], meta=data.get("meta", {}), parent=data.get("parent"),
                      refs=data.get("refs", {}), config=data.get("config", {}),
                      seconds=data.get("seconds", 0.0))
        except (KeyError, TypeError, AttributeError):
            raise StageError(f"artifact {path} is corrupt: its {MANIFEST} is not an artifact's "
                             "manifest") from None
        if verify:
            actual = digest_files(path)
            if actual != art.files:
                changed = sorted(set(actual.items()) ^ set(art.files.items()))
                raise StageError(f"artifact {path} is corrupt: {changed[0][0]} does not match its "
                                 "recorded sha256")
            if content_digest(actual, art.meta) != art.digest:
                raise StageError(f"artifact {path} is corrupt: the metadata in its {MANIFEST} does "
                                 "not match its recorded digest")
            if art.key != path.name:
                raise StageError(f"artifact {path} is corrupt: its {MANIFEST} names key "
                                 f"{str(art.key)[:16]}..., not its folder's")
        if secret is not None:  # last: a plain edit is named more precisely above
            if "hmac" not in data:
                raise StageError(f"artifact {path} is not sealed (made before cache entries were "
                                 "sealed, or not by the pipeline): not trusted")
            if not seal.verifies(secret, data):
                raise SealMismatch(f"artifact {path} is corrupt: its seal does not verify with this "
                                 "cache's key (edited after it was built, or sealed with another "
                                 "key)")
        return art


def plain(obj):
    """Dataclasses and enums as JSON-ready values (for keys and manifests). Not
    ``json_record.to_json``, though the walk is alike: a cache key must not follow what a record
    does for its JSON (a ``to_json``/``as_dict`` method, ``omitted``/``rest``/``key`` fields, an
    untyped payload's int keys, which ``sort_keys`` orders differently from their strings), or
    adding one to a config class for a report would change every key made from it."""
    if dataclasses.is_dataclass(obj):
        # A field marked key_omit_default is left out at its default, so adding such a field
        # (a runtime setting) keeps every key made before it valid.
        return {f.name: plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)
                if not (f.metadata.get("key_omit_default") and getattr(obj, f.name) == f.default)}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    if isinstance(obj, dict):
        return {str(k): plain(v) for k, v in obj.items()}
    return obj
