"""One registry version as an OCI manifest: the bytes every backend stores and every pull re-hashes.

In: a model name, a version, the ONNX file and the evidence ``python -m pipeline`` gathers (config,
lineage, verdict, metrics, latency, environment, calibration and evaluation set digests). Out: a
``Package``: the evidence as the manifest's config blob (``manifest.json`` when pulled), the model
as its one layer, and the manifest itself, serialized once to canonical JSON so the local store,
an OCI registry and MLflow all hold the same bytes under the same digest. Each top-level evidence
key is also copied into an ``io.pipeline.<key>`` annotation, so ``oras manifest fetch`` or
``skopeo inspect`` show the lineage without pulling a blob. Promotion records (who moved an alias,
whether ``--force`` was used) are small manifests whose ``subject`` is the version they promote.
A model of several files (a decoder's folder: external data, generation config, tokenizer) has
one layer per file, each titled with its name. Not handled: signatures.
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.core.errors import CorruptBlob, PromotionRefused, RegistryError
from pipeline.registry.names import check_digest, check_name, check_version

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
INDEX_TYPE = "application/vnd.oci.image.index.v1+json"
ARTIFACT_TYPE = "application/vnd.pipeline.model.v1"
EVIDENCE_TYPE = "application/vnd.pipeline.evidence.v1+json"
ONNX_TYPE = "application/vnd.pipeline.onnx.v1"
FILE_TYPE = "application/vnd.pipeline.file.v1"  # another file of a multi-file model
PROMOTION_TYPE = "application/vnd.pipeline.promotion.v1"
EMPTY_TYPE = "application/vnd.oci.empty.v1+json"
EMPTY = b"{}"                       # OCI's empty descriptor content
TITLE = "org.opencontainers.image.title"
P = "io.pipeline."                  # our annotation prefix
MODEL_FILE, EVIDENCE_FILE = "model.onnx", "manifest.json"


def canonical(obj) -> bytes:
    """Sorted keys, no whitespace: the same evidence always serializes to the same bytes."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def sha256_bytes(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass
class Blob:
    digest: str
    size: int
    media_type: str
    title: str | None = None       # file name when pulled (layers and the evidence)
    path: Path | None = None       # where its bytes are, for a file ...
    data: bytes | None = None      # ... or the bytes themselves

    def descriptor(self) -> dict:
        d = {"mediaType": self.media_type, "digest": self.digest, "size": self.size}
        if self.title:
            d["annotations"] = {TITLE: self.title}
        return d


@dataclass
class Package:
    name: str
    version: str
    manifest: dict
    manifest_bytes: bytes
    blobs: list[Blob] = field(default_factory=list)   # config first, then the layers

    @property
    def digest(self) -> str:
        return sha256_bytes(self.manifest_bytes)

    @property
    def passed(self) -> bool:
        return gate_passed(self.manifest)


def build(name: str, version: str, model: Path, evidence: dict,
          extra: dict[str, Path] | None = None) -> Package:
    """The package for ``model`` and its evidence; reads the model once to hash it. ``extra``:
    more files of the same model by the name they are pulled as (a decoder's external data,
    ``genai_config.json``, tokenizer files), one layer each."""
    check_name(name)
    check_version(version)
    layers = [_layer(Path(model), ONNX_TYPE, MODEL_FILE)]
    for title, path in sorted((extra or {}).items()):
        layers.append(_layer(Path(path), FILE_TYPE, title))
    body = {**evidence, "name": name, "version": version,
            "files": {b.title: b.digest.split(":", 1)[1] for b in layers}}
    config_bytes = canonical(body)
    config = Blob(sha256_bytes(config_bytes), len(config_bytes), EVIDENCE_TYPE, EVIDENCE_FILE,
                  data=config_bytes)
    verdict = evidence.get("verdict") or {}
    notes = {f"{P}{key}": value if isinstance(value, str) else canonical(value).decode()
             for key, value in evidence.items() if value is not None}
    tools = (evidence.get("environment") or {}).get("tools")
    if tools:
        notes[f"{P}tools"] = canonical(tools).decode()
    notes.update({f"{P}name": name, f"{P}version": version,
                  f"{P}gate.passed": "true" if verdict.get("passed") is True else "false",
                  f"{P}gate.summary": str(verdict.get("summary", "no verdict")),
                  "org.opencontainers.image.title": name,
                  "org.opencontainers.image.version": version,
                  "org.opencontainers.image.created": now()})
    manifest = {"schemaVersion": 2, "mediaType": MANIFEST_TYPE, "artifactType": ARTIFACT_TYPE,
                "config": config.descriptor(), "layers": [b.descriptor() for b in layers],
                "annotations": notes}
    return Package(name, version, manifest, canonical(manifest), [config, *layers])


def _layer(path: Path, media_type: str, title: str) -> Blob:
    h, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
            size += len(chunk)
    return Blob(f"sha256:{h.hexdigest()}", size, media_type, title, path=path)


def promotion(name: str, version: str, subject: dict, alias: str, forced: bool,
              previous: str | None, reason: str = "") -> Package:
    """A record of one alias move, pointing (``subject``) at the version it promotes."""
    empty = Blob(sha256_bytes(EMPTY), len(EMPTY), EMPTY_TYPE, data=EMPTY)
    notes = {f"{P}kind": "promotion", f"{P}name": name, f"{P}version": version,
             f"{P}alias": alias, f"{P}forced": "true" if forced else "false",
             f"{P}previous": previous or "", f"{P}reason": reason,
             "org.opencontainers.image.created": now()}
    manifest = {"schemaVersion": 2, "mediaType": MANIFEST_TYPE, "artifactType": PROMOTION_TYPE,
                "config": {"mediaType": EMPTY_TYPE, "digest": empty.digest, "size": empty.size},
                "layers": [{"mediaType": EMPTY_TYPE, "digest": empty.digest, "size": empty.size}],
                "subject": {"mediaType": MANIFEST_TYPE, "digest": subject["digest"],
                            "size": subject["size"]},
                "annotations": notes}
    return Package(name, version, manifest, canonical(manifest), [empty])


def parse(data: bytes, digest: str, where: str) -> dict:
    """Check ``data`` against ``digest`` and its shape; the manifest as a dict."""
    actual = sha256_bytes(data)
    if actual != digest:
        raise CorruptBlob(f"manifest {digest} of {where} does not match its digest "
                          f"(read {actual}): refused")
    try:
        manifest = json.loads(data)
        blobs = [manifest["config"], *manifest["layers"]]
        for d in blobs:
            check_digest(d["digest"], f"blob digest in {where}")
            if not isinstance(d["size"], int) or d["size"] < 0:
                raise ValueError(f"bad size {d['size']!r}")
    except (ValueError, KeyError, TypeError) as e:
        raise RegistryError(f"manifest {digest} of {where} is malformed: {e}") from None
    return manifest


def blobs_of(manifest: dict) -> list[Blob]:
    """Every blob a manifest references, the config first, titled as they are written on pull."""
    out = []
    for i, d in enumerate([manifest["config"], *manifest["layers"]]):
        title = (d.get("annotations") or {}).get(TITLE) or (EVIDENCE_FILE if i == 0 else None)
        if title is not None and (title != title.strip() or "/" in title or "\\" in title
                                  or title in (".", "..") or title.startswith(".")):
            raise RegistryError(f"blob {d['digest']}: unsafe file name {title!r} in its manifest")
        out.append(Blob(d["digest"], d["size"], d["mediaType"], title))
    return out


def gate_passed(manifest: dict) -> bool:
    return (manifest.get("annotations") or {}).get(f"{P}gate.passed") == "true"


def check_promotable(manifest: dict, name: str, version: str, alias: str, force: bool) -> None:
    """The promotion gate, the same for every backend: a version whose gate did not pass moves
    no alias unless forced (and a forced promotion is recorded by the backend)."""
    if not gate_passed(manifest) and not force:
        summary = manifest["annotations"].get(f"{P}gate.summary", "no verdict")
        raise PromotionRefused(f"{name}:{version}: its gate did not pass ({summary}); "
                               f"not promoted to {alias} (--force overrides, and is recorded)")


def evidence_from_annotations(manifest: dict) -> dict:
    """The evidence keys decoded back from the annotations (for ``show`` without a blob read)."""
    out = {}
    for key, value in (manifest.get("annotations") or {}).items():
        if key.startswith(P):
            try:
                out[key[len(P):]] = json.loads(value)
            except ValueError:
                out[key[len(P):]] = value
    return out
