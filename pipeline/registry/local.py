"""The local registry: ``<root>/<model>/<version>/{model.onnx, manifest.json}``.

In: a candidate artifact that passed its gate and the evidence about it. Out: an immutable
version folder, written to a temporary sibling and renamed into place, named after the quant mode
and the artifact's content digest, so the same model is never published twice under two names and
a version never changes once visible. Re-publishing an existing version checks its bytes instead.
"""
from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

from pipeline.artifact import sha256_file
from pipeline.errors import StageError


def publish(root: str, model_name: str, mode: str, candidate, manifest: dict) -> Path:
    version = f"{mode}-{candidate.digest[:16]}"
    final = Path(root) / model_name / version
    if final.exists():
        recorded = json.loads((final / "manifest.json").read_text())["files"]
        for name, digest in recorded.items():
            if sha256_file(final / name) != digest:
                raise StageError(f"registry version {final} is corrupt: {name} changed")
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".tmp-{version}-{uuid.uuid4().hex[:8]}")
    tmp.mkdir()
    try:
        shutil.copyfile(candidate.model, tmp / "model.onnx")
        files = {"model.onnx": sha256_file(tmp / "model.onnx")}
        body = {**manifest, "name": model_name, "version": version, "files": files}
        (tmp / "manifest.json").write_text(json.dumps(body, indent=2, sort_keys=True))
        tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final
