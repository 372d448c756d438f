"""Which exact version a server names (``pipeline.serve.artifact``): from a run's report, what it
published (nothing when it published nothing); from a pulled folder, the manifest's name and
the sha256 of the OCI manifest beside it, which is the digest the registry names it by."""
from __future__ import annotations

import hashlib
import json

from pipeline.serve.artifact import published_as, pulled_version

REF = "ocr:int8-0123456789abcdef@sha256:" + "ab" * 32


def test_a_run_names_what_it_published_and_nothing_else():
    assert published_as({"publish": {"status": "published", "backend": "local",
                                      "ref": f"{REF} (local artifacts/registry)"}}) == REF
    assert published_as({"publish": {"status": "published", "ref": f"{REF} (oci "
                                      "127.0.0.1:5000, already published)"}}) == REF
    # a report from before the publish record: its "published" line alone
    assert published_as({"published": f"{REF} (local artifacts/registry)"}) == REF
    for unpublished in ({}, {"publish": None}, {"publish": {"status": "pending"}},
                        {"publish": {"status": "failed", "error": "disk full"}},
                        {"publish": {"status": "interrupted", "ref": REF}},
                        {"publish": {"status": "published", "ref": ""}}):
        assert published_as(unpublished) is None, unpublished


def test_a_pulled_folder_is_named_by_its_digest_only_while_it_is_what_was_pulled(tmp_path,
                                                                                capsys):
    model, evidence = b"model bytes", json.dumps({"name": "ocr"}).encode()
    (tmp_path / "model.onnx").write_bytes(model)
    (tmp_path / "manifest.json").write_bytes(evidence)
    manifest = {"name": "ocr", "version": "int8-0123456789abcdef"}
    assert pulled_version(tmp_path, manifest) == "ocr:int8-0123456789abcdef"  # no OCI manifest
    assert "holds no oci-manifest.json" in capsys.readouterr().out

    def blob(title, data):
        return {"mediaType": "application/octet-stream", "size": len(data),
                "digest": f"sha256:{hashlib.sha256(data).hexdigest()}",
                "annotations": {"org.opencontainers.image.title": title}}

    oci = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                      "config": blob("manifest.json", evidence),
                      "layers": [blob("model.onnx", model)],
                      "annotations": {"io.pipeline.name": "ocr"}}).encode()
    (tmp_path / "oci-manifest.json").write_bytes(oci)
    exact = f"ocr:int8-0123456789abcdef@sha256:{hashlib.sha256(oci).hexdigest()}"
    assert pulled_version(tmp_path, manifest) == exact
    (tmp_path / "model.onnx").write_bytes(b"edited since the pull")
    assert pulled_version(tmp_path, manifest) == "ocr:int8-0123456789abcdef"
    assert "model.onnx was changed" in capsys.readouterr().out
    assert pulled_version(tmp_path, {"name": "ocr"}) is None  # not a manifest the pipeline wrote
