"""The local registry: a content-addressed store under ``artifacts/registry/``, laid out as an OCI
image layout, safe against crashes and concurrent publishers.

In: a ``Package`` (manifest, evidence and model, see ``package.py``). Out: immutable blobs under
``blobs/sha256/<hex>`` and one entry per version in ``index.json``. Layout::

    oci-layout                 {"imageLayoutVersion": "1.0.0"}
    index.json                 the only mutable file: versions, aliases, promotion records
    blobs/sha256/<hex>         model, evidence, manifests (written once, never changed)
    .tmp/  .gc.lock  .index.lock

A push writes its blobs (temporary file, fsync, rename) and then adds one descriptor to the index,
rewritten atomically under an exclusive ``flock``: until that rename nothing of the version is
visible, so a SIGKILL at any point leaves at most unreferenced blobs, which ``gc`` removes. Pushers
hold ``.gc.lock`` shared and ``gc`` holds it exclusively, so gc never deletes a blob whose index
entry is about to be written. Every read re-hashes what it returns. A version, once indexed, never
changes: a second push of it checks (and repairs from its own bytes) the stored blobs instead. The
aliases ``candidate`` and ``production`` move only through ``promote``. Not handled: a store shared
over NFS, and quotas.
"""
from __future__ import annotations

import io
import json
from pathlib import Path

from pipeline.core.errors import CorruptBlob, RegistryError
from pipeline.registry import atomic, transfer
from pipeline.registry.backend import Entry, Published
from pipeline.registry.names import ALIASES, check_alias, check_digest, check_name
from pipeline.registry.package import (INDEX_TYPE, MANIFEST_TYPE, P, Blob, Package, blobs_of,
                                       check_promotable, parse, promotion)

REF = "org.opencontainers.image.ref.name"
CREATED = "org.opencontainers.image.created"


class LocalStore:
    kind = "local"

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.blobs = self.root / "blobs" / "sha256"
        self.tmp = self.root / ".tmp"
        self.index_path = self.root / "index.json"

    # --- writing -------------------------------------------------------------------------------
    def push(self, pkg: Package) -> Published:
        self._init()
        with atomic.locked(self.root / ".gc.lock", shared=True):
            found = _find(self._read_index(), pkg.name, pkg.version)
            if found is not None:
                return self._republish(found, pkg)
            for blob in [*pkg.blobs, _manifest_blob(pkg)]:
                self._put(blob)
            with atomic.locked(self.root / ".index.lock"):
                index = self._read_index()
                found = _find(index, pkg.name, pkg.version)
                if found is not None:  # another process indexed it first: the first one wins
                    return self._republish(found, pkg)
                index["manifests"].append({
                    "mediaType": MANIFEST_TYPE, "digest": pkg.digest,
                    "size": len(pkg.manifest_bytes), "artifactType": pkg.manifest["artifactType"],
                    "annotations": {REF: f"{pkg.name}:{pkg.version}", f"{P}kind": "version",
                                    f"{P}name": pkg.name, f"{P}version": pkg.version,
                                    f"{P}gate.passed": "true" if pkg.passed else "false",
                                    CREATED: pkg.manifest["annotations"][CREATED]}})
                self._write_index(index)
        return Published(self.kind, pkg.name, pkg.version, pkg.digest, str(self.root))

    def promote(self, name: str, ref: str, alias: str, force: bool = False,
                reason: str = "") -> Entry:
        check_alias(alias)
        self._init()
        with atomic.locked(self.root / ".gc.lock", shared=True), \
                atomic.locked(self.root / ".index.lock"):
            index = self._read_index()
            desc = self._resolve_desc(index, name, ref)
            version = desc["annotations"][f"{P}version"]
            manifest, _ = self._manifest(desc["digest"], f"{name}:{version}")
            check_promotable(manifest, name, version, alias, force)
            old = _find(index, name, alias, kind="alias")
            previous = old["annotations"][f"{P}version"] if old else None
            record = promotion(name, version, desc, alias, force, previous, reason)
            for blob in [*record.blobs, _manifest_blob(record)]:
                self._put(blob)
            notes = {f"{P}name": name, f"{P}alias": alias, f"{P}version": version,
                     f"{P}forced": "true" if force else "false",
                     CREATED: record.manifest["annotations"][CREATED]}
            index["manifests"] = [d for d in index["manifests"] if d is not old]
            index["manifests"].append({
                "mediaType": MANIFEST_TYPE, "digest": desc["digest"], "size": desc["size"],
                "annotations": {REF: f"{name}:{alias}", f"{P}kind": "alias",
                                f"{P}promotion": record.digest, **notes}})
            index["manifests"].append({
                "mediaType": MANIFEST_TYPE, "digest": record.digest,
                "size": len(record.manifest_bytes), "artifactType": record.manifest["artifactType"],
                "annotations": {f"{P}kind": "promotion", **notes}})
            self._write_index(index)
        return self.resolve(name, alias)

    def gc(self) -> dict:
        """Delete blobs no index entry reaches, and temporary files of killed pushes."""
        if not self.index_path.exists():
            return {"removed_blobs": 0, "freed_bytes": 0, "removed_temp": 0, "kept_blobs": 0}
        self._init()
        with atomic.locked(self.root / ".gc.lock"), atomic.locked(self.root / ".index.lock"):
            keep = set()
            for desc in self._read_index()["manifests"]:
                where = desc.get("annotations", {}).get(REF, desc["digest"])
                manifest, _ = self._manifest(desc["digest"], where)  # refuses a corrupt manifest
                keep.add(desc["digest"])
                keep.update(b.digest for b in blobs_of(manifest))
                if "subject" in manifest:
                    keep.add(manifest["subject"]["digest"])
            removed = freed = 0
            for path in self.blobs.iterdir():
                if f"sha256:{path.name}" not in keep:
                    freed += path.stat().st_size
                    path.unlink()
                    removed += 1
            temp = 0
            for path in self.tmp.iterdir():  # no push is running: all of them are leftovers
                path.unlink()
                temp += 1
            atomic.fsync_dir(self.blobs)
        return {"removed_blobs": removed, "freed_bytes": freed, "removed_temp": temp,
                "kept_blobs": len(keep)}

    # --- reading -------------------------------------------------------------------------------
    def versions(self, name: str | None = None) -> list[Entry]:
        index = self._read_index()
        if name is not None:
            check_name(name)
        out = []
        for d in index["manifests"]:
            a = d["annotations"]
            if a.get(f"{P}kind") == "version" and name in (None, a[f"{P}name"]):
                out.append(self._entry(index, d))
        return out

    def resolve(self, name: str, ref: str | None) -> Entry:
        index = self._read_index()
        return self._entry(index, self._resolve_desc(index, name, ref))

    def manifest(self, entry: Entry) -> tuple[dict, bytes]:
        return self._manifest(entry.digest, f"{entry.name}:{entry.version}")

    def pull(self, name: str, ref: str | None, dest: Path, force: bool = False
             ) -> tuple[Entry, Path]:
        entry = self.resolve(name, ref)
        manifest, data = self.manifest(entry)
        where = f"{entry.name}:{entry.version}"
        return entry, transfer.pull_into(dest, where, manifest, data, self._opener(where),
                                         force=force, protect=self.root)

    def verify(self, name: str | None = None) -> tuple[int, list[str]]:
        """Re-hash every manifest and blob the index reaches: (versions checked, problems)."""
        index = self._read_index()
        digests = {d["digest"] for d in index["manifests"]
                   if d["annotations"].get(f"{P}kind") == "version"}
        problems, count = [], 0
        for d in index["manifests"]:
            a = d["annotations"]
            if name is not None and a.get(f"{P}name") != name:
                continue
            where = a.get(REF) or f"{a.get(f'{P}name')} promotion record {d['digest'][:19]}"
            count += a.get(f"{P}kind") == "version"
            if a.get(f"{P}kind") == "alias" and d["digest"] not in digests:
                problems.append(f"{where}: points at {d['digest']}, which is not an indexed "
                                "version")
            try:
                manifest, _ = self._manifest(d["digest"], where)
            except RegistryError as e:
                problems.append(str(e))
                continue
            if a.get(f"{P}kind") != "alias":  # an alias shares its version's blobs
                problems += transfer.verify_blobs(where, manifest, self._opener(where))
        return count, problems

    # --- internals -----------------------------------------------------------------------------
    def _init(self) -> None:
        self.blobs.mkdir(parents=True, exist_ok=True)
        self.tmp.mkdir(exist_ok=True)
        layout = self.root / "oci-layout"
        if not layout.exists():
            atomic.write_bytes(layout, b'{"imageLayoutVersion":"1.0.0"}', self.tmp)

    def _blob_path(self, digest: str) -> Path:
        return self.blobs / check_digest(digest).split(":", 1)[1]

    def _put(self, blob: Blob) -> None:
        """Store one blob unless an intact copy is there; a corrupt copy is replaced."""
        path = self._blob_path(blob.digest)
        if path.exists() and atomic.sha256_path(path) == blob.digest:
            return
        src = open(blob.path, "rb") if blob.path is not None else io.BytesIO(blob.data)
        with src:
            actual, _ = atomic.write_stream(path, src, self.tmp, expected=blob.digest)
        if actual != blob.digest:
            raise RegistryError(f"blob {blob.digest} ({blob.title or blob.media_type}) changed "
                                f"while it was being pushed (read {actual}); nothing published")

    def _republish(self, desc: dict, pkg: Package) -> Published:
        """A version is never rewritten; its stored blobs are checked and, from this push's own
        identical bytes, repaired."""
        where = f"{pkg.name}:{pkg.version}"
        manifest, _ = self._manifest(desc["digest"], where, repair_from=pkg)
        problems = transfer.verify_blobs(where, manifest, self._opener(where))
        if problems:
            for blob in pkg.blobs:
                self._put(blob)
            problems = transfer.verify_blobs(where, manifest, self._opener(where))
        if problems:
            raise CorruptBlob(problems[0])
        return Published(self.kind, pkg.name, pkg.version, desc["digest"], str(self.root),
                         existed=True)

    def _manifest(self, digest: str, where: str, repair_from: Package | None = None):
        """The manifest's bytes, re-hashed; ``repair_from`` (a push of the very same manifest)
        first rewrites it if it is missing or corrupt."""
        if repair_from is not None and repair_from.digest == digest:
            self._put(_manifest_blob(repair_from))
        try:
            data = self._blob_path(digest).read_bytes()
        except FileNotFoundError:
            raise RegistryError(f"manifest {digest} of {where} is missing from "
                                f"{self.blobs}") from None
        return parse(data, digest, where), data

    def _opener(self, where: str):
        def open_blob(blob: Blob):
            try:
                return open(self._blob_path(blob.digest), "rb")
            except FileNotFoundError:
                raise RegistryError(f"blob {blob.digest} ({blob.title or blob.media_type}) of "
                                    f"{where} is missing from {self.blobs}") from None
        return open_blob

    def _read_index(self) -> dict:
        try:
            data = self.index_path.read_bytes()
        except FileNotFoundError:
            return {"schemaVersion": 2, "mediaType": INDEX_TYPE, "manifests": []}
        try:
            index = json.loads(data)
            for d in index["manifests"]:
                check_digest(d["digest"])
                if not isinstance(d["annotations"], dict):
                    raise ValueError("descriptor without annotations")
        except (ValueError, KeyError, TypeError) as e:
            raise RegistryError(f"{self.index_path} is not a valid index: "
                                f"{str(e).splitlines()[0]}") from None
        return index

    def _write_index(self, index: dict) -> None:
        atomic.write_bytes(self.index_path, json.dumps(index, indent=1, sort_keys=True).encode(),
                           self.tmp)

    def _resolve_desc(self, index: dict, name: str, ref: str | None) -> dict:
        check_name(name)
        versions = [d for d in index["manifests"] if d["annotations"].get(f"{P}kind") == "version"
                    and d["annotations"][f"{P}name"] == name]
        if not versions:  # not "no version promoted" or "no such version": no such model at all
            known = sorted({d["annotations"][f"{P}name"] for d in index["manifests"]
                            if d["annotations"].get(f"{P}kind") == "version"})
            raise RegistryError(f"{name}: no model of that name in {self.root}; models: "
                                f"{', '.join(known) or 'none (nothing published yet)'}")
        if ref is None:
            raise RegistryError(f"{name}: give a version, an alias ({', '.join(ALIASES)}) or "
                                f"@sha256:...; versions: {_names(versions)}")
        if ref.startswith("sha256:"):
            hit = next((d for d in versions if d["digest"] == ref), None)
        elif ref in ALIASES:
            alias = _find(index, name, ref, kind="alias")
            hit = alias and next((d for d in versions if d["digest"] == alias["digest"]), None)
            if alias is None:
                raise RegistryError(f"{name}:{ref}: no version has been promoted to {ref} in "
                                    f"{self.root}")
        else:
            hit = _find(index, name, ref)
        if hit is None:
            raise RegistryError(f"{name}:{ref}: no such version in {self.root}; versions: "
                                f"{_names(versions)}")
        return hit

    def _entry(self, index: dict, desc: dict) -> Entry:
        a = desc["annotations"]
        name = a[f"{P}name"]
        aliases = {d["annotations"][f"{P}alias"]: d["annotations"].get(f"{P}forced") == "true"
                   for d in index["manifests"] if d["annotations"].get(f"{P}kind") == "alias"
                   and d["annotations"][f"{P}name"] == name and d["digest"] == desc["digest"]}
        return Entry(name, a[f"{P}version"], desc["digest"], desc["size"],
                     a.get(f"{P}gate.passed") == "true", a.get(CREATED, ""), aliases)


def _find(index: dict, name: str, tag: str, kind: str = "version") -> dict | None:
    for d in index["manifests"]:
        a = d["annotations"]
        if (a.get(f"{P}kind"), a.get(f"{P}name"), a.get(REF)) == (kind, name, f"{name}:{tag}"):
            return d
    return None


def _manifest_blob(pkg: Package) -> Blob:
    return Blob(pkg.digest, len(pkg.manifest_bytes), MANIFEST_TYPE, data=pkg.manifest_bytes)


def _names(descs: list[dict]) -> str:
    names = [d["annotations"][f"{P}version"] for d in descs]
    return ", ".join(names[-8:]) + (f" (and {len(names) - 8} more)" if len(names) > 8 else "") \
        if names else "none"

