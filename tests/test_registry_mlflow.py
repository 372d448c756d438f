"""The MLflow backend against a real ``mlflow server`` (SQLite backend, artifacts in a temporary
folder) on 127.0.0.1: run contents, model version tags, aliases, round-trip bytes."""
from __future__ import annotations

import importlib.util
import json

import pytest

from pipeline.config import RegistryBackend, RegistryConfig
from pipeline.core.errors import CorruptBlob, PromotionRefused
from pipeline.registry import open_backend, publish
from pipeline.registry.local import LocalStore
from pipeline.registry.package import build
from tests.registry_support import (candidate, evidence, flip_byte, make_model, registry_cli,
                                    start_mlflow, version_of)

# the server runs from the same environment; found, not imported: importing mlflow is 2 s of
# every xdist worker's collection, whether or not the worker runs these tests
if importlib.util.find_spec("mlflow") is None:  # pragma: no cover
    pytest.fail("mlflow is not installed: pip install -e '.[registry]' (make does)",
                pytrace=False)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mlflow")
    url, srv = start_mlflow(tmp)
    yield url, tmp / "artifacts"
    srv.stop()


def cfg(url: str) -> RegistryConfig:
    return RegistryConfig(backend=RegistryBackend.mlflow, url=url, repository="pipeline")


@pytest.mark.slow
def test_publish_logs_run_registers_version_and_round_trips(server, tmp_path):
    from mlflow import MlflowClient

    url, artifacts = server
    model = make_model(tmp_path / "m.onnx", seed=31, floats=5000)
    pkg = build("ocr", version_of(model), model, evidence())
    backend = open_backend(cfg(url))
    published = backend.push(pkg)
    assert published.digest == pkg.digest and not published.existed
    assert LocalStore(tmp_path / "store").push(pkg).digest == published.digest

    client = MlflowClient(tracking_uri=url, registry_uri=url)
    [mv] = client.search_model_versions("name = 'pipeline.ocr'")
    assert mv.tags["sha256"] == candidate(model).digest
    assert mv.tags["manifest_digest"] == pkg.digest and mv.tags["gate_passed"] == "true"
    run = client.get_run(mv.run_id)
    assert run.data.params["quant.mode"] == "int8"
    assert run.data.metrics["metrics.sequence_accuracy"] == 97.5
    assert run.data.metrics["latency.8.p50"] == 2.5
    assert run.data.tags["gate.passed"] == "true" and run.data.tags["gate.summary"] == "PASS"
    assert run.data.tags["calibration_set.digest"] == "c" * 64
    assert run.info.status == "FINISHED"

    again = publish(cfg(url), model_name="ocr", mode="int8", candidate=candidate(model),
                    manifest=evidence(passed=False))
    assert again.existed and again.digest == pkg.digest
    assert len(client.search_model_versions("name = 'pipeline.ocr'")) == 1

    out = tmp_path / "pulled"
    proc = registry_cli("pull", f"ocr:{pkg.version}", "--out", out, "registry=mlflow",
                        f"registry.url={url}")
    assert proc.returncode == 0, proc.stderr
    assert (out / "model.onnx").read_bytes() == model.read_bytes()
    assert (out / "oci-manifest.json").read_bytes() == pkg.manifest_bytes
    assert json.loads((out / "manifest.json").read_text())["version"] == pkg.version

    # the artifact store is not trusted: a flipped byte there is refused, naming the blob
    [stored] = [p for p in artifacts.rglob("model.onnx")]
    flip_byte(stored, offset=300)
    with pytest.raises(CorruptBlob, match=f"sha256:{candidate(model).digest}"):
        backend.pull("ocr", pkg.version, tmp_path / "again")


@pytest.mark.slow
def test_aliases_move_only_through_promote_and_only_to_passed_versions(server, tmp_path):
    from mlflow import MlflowClient

    url, _ = server
    c = cfg(url)
    c.repository = "aliases"
    good = publish(c, model_name="ocr", mode="int8",
                   candidate=candidate(make_model(tmp_path / "a.onnx", seed=32)),
                   manifest=evidence())
    bad = publish(c, model_name="ocr", mode="int8",
                  candidate=candidate(make_model(tmp_path / "b.onnx", seed=33)),
                  manifest=evidence(passed=False))
    backend = open_backend(c)
    client = MlflowClient(tracking_uri=url, registry_uri=url)
    assert client.get_registered_model("aliases.ocr").aliases == {}  # publishing sets none
    with pytest.raises(PromotionRefused):
        backend.promote("ocr", bad.version, "production")
    o = ["registry=mlflow", f"registry.url={url}", "registry.repository=aliases"]
    backend.promote("ocr", good.version, "production")
    proc = registry_cli("promote", f"ocr:{bad.version}", "candidate", "--force", *o)
    assert proc.returncode == 0, proc.stderr
    aliases = client.get_registered_model("aliases.ocr").aliases
    assert set(aliases) == {"production", "candidate"}
    assert backend.resolve("ocr", "production").digest == good.digest
    forced = client.get_model_version_by_alias("aliases.ocr", "candidate")
    assert forced.tags["promotion.candidate.forced"] == "true"
    proc = registry_cli("list", "--json", *o)
    listed = {e["version"]: e for e in json.loads(proc.stdout)}
    assert listed[bad.version]["aliases"] == {"candidate": True}
    assert listed[good.version]["aliases"] == {"production": False}
    assert backend.verify() == (2, [])
