"""What every registry backend offers, and the small records they return.

In: nothing (types only). Out: the ``Backend`` protocol that ``local``, ``oci`` and ``mlflow``
implement, ``Entry`` (one version as a listing shows it) and ``Published`` (what a push returns and
``python -m pipeline`` prints). A Protocol rather than a base class: the backends share no state,
only the package format (``package.py``) and the pull logic (``transfer.py``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from pipeline.registry.package import Package


@dataclass
class Entry:
    name: str
    version: str
    digest: str                  # the manifest's sha256
    size: int
    passed: bool                 # the gate verdict recorded at publish time
    created: str = ""
    aliases: dict[str, bool] = field(default_factory=dict)   # alias -> was it forced

    def line(self) -> str:
        tags = ", ".join(a + (" (forced)" if f else "") for a, f in sorted(self.aliases.items()))
        return (f"{self.name}:{self.version}  {self.digest[:19]}  "
                f"gate={'passed' if self.passed else 'FAILED'}  {self.created}"
                + (f"  [{tags}]" if tags else ""))

    def to_json(self) -> dict:
        return {"name": self.name, "version": self.version, "digest": self.digest,
                "size": self.size, "passed": self.passed, "created": self.created,
                "aliases": self.aliases}


@dataclass
class Published:
    backend: str
    name: str
    version: str
    digest: str
    where: str                   # the store, registry or tracking server, without credentials
    existed: bool = False        # the version was already there: nothing was written

    @property
    def ref(self) -> str:
        return f"{self.name}:{self.version}@{self.digest}"

    def __str__(self) -> str:
        return f"{self.ref} ({self.backend} {self.where}" + \
            (", already published)" if self.existed else ")")


class Backend(Protocol):
    kind: str

    def push(self, pkg: Package) -> Published: ...

    def versions(self, name: str | None = None) -> list[Entry]: ...

    def resolve(self, name: str, ref: str | None) -> Entry: ...

    def manifest(self, entry: Entry) -> tuple[dict, bytes]: ...

    def pull(self, name: str, ref: str | None, dest: Path, force: bool = False
             ) -> tuple[Entry, Path]: ...

    def verify(self, name: str | None = None) -> tuple[int, list[str]]: ...

    def promote(self, name: str, ref: str, alias: str, force: bool = False,
                reason: str = "") -> Entry: ...
