"""The local content-addressed store: layout, immutability, promotion, corruption, crashes and
concurrent publishers, name validation, and the CLI's one-line errors."""
from __future__ import annotations

import json
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from pipeline.config import RegistryConfig
from pipeline.core.errors import ConfigError, CorruptBlob, PromotionRefused
from pipeline.registry import publish
from pipeline.registry.local import LocalStore
from pipeline.registry.names import check_name, check_version, parse_ref
from pipeline.registry.package import build
from tests.registry_support import (candidate, env, evidence, flip_byte, make_model, publish_cmd,
                                    registry_cli, version_of)


def pub(root: Path, model: Path, passed: bool = True):
    return publish(RegistryConfig(root=str(root)), model_name="ocr", mode="int8",
                   candidate=candidate(model), manifest=evidence(passed))


def one_line_error(proc: subprocess.CompletedProcess, code: int, *needles: str) -> str:
    assert proc.returncode == code, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def test_layout_manifest_and_round_trip(tmp_path):
    model = make_model(tmp_path / "m.onnx", seed=1)
    root = tmp_path / "store"
    published = pub(root, model)
    assert published.version == version_of(model) and not published.existed
    assert json.loads((root / "oci-layout").read_text()) == {"imageLayoutVersion": "1.0.0"}
    index = json.loads((root / "index.json").read_text())
    assert index["mediaType"] == "application/vnd.oci.image.index.v1+json"
    [desc] = index["manifests"]
    assert desc["digest"] == published.digest
    assert desc["annotations"]["org.opencontainers.image.ref.name"] == f"ocr:{published.version}"
    blobs = {p.name for p in (root / "blobs" / "sha256").iterdir()}
    assert len(blobs) == 3  # model, evidence, manifest
    manifest = json.loads((root / "blobs" / "sha256" / published.digest[7:]).read_bytes())
    notes = manifest["annotations"]
    for key in ("lineage", "config", "calibration_set", "tools", "environment", "metrics",
                "verdict", "gate.passed"):
        assert notes[f"io.pipeline.{key}"], key
    assert notes["io.pipeline.calibration_set"] == "c" * 64
    assert manifest["layers"][0]["digest"] == f"sha256:{candidate(model).digest}"

    out = tmp_path / "pulled"
    proc = registry_cli("pull", f"ocr:{published.version}", "--out", out, f"registry.root={root}")
    assert proc.returncode == 0, proc.stderr
    assert (out / "model.onnx").read_bytes() == model.read_bytes()
    body = json.loads((out / "manifest.json").read_text())
    assert body["files"]["model.onnx"] == candidate(model).digest
    assert body["verdict"]["passed"] is True and body["version"] == published.version
    proc = registry_cli("list", "--json", f"registry.root={root}")
    assert [e["version"] for e in json.loads(proc.stdout)] == [published.version]
    proc = registry_cli("show", f"ocr@{published.digest}", "--json", f"registry.root={root}")
    assert json.loads(proc.stdout)["evidence"]["metrics"]["sequence_accuracy"] == 97.5


def test_versions_are_immutable(tmp_path):
    model, root = make_model(tmp_path / "m.onnx", seed=2), tmp_path / "store"
    first = pub(root, model)
    again = pub(root, model, passed=False)  # other evidence, same model: the first one stays
    assert again.existed and again.digest == first.digest
    assert len(json.loads((root / "index.json").read_text())["manifests"]) == 1
    assert LocalStore(root).resolve("ocr", first.version).passed


@pytest.mark.slow  # seconds: out of make test-fast's edit loop
def test_flipped_byte_is_refused_naming_the_blob_and_repaired_by_a_push(tmp_path):
    model, root = make_model(tmp_path / "m.onnx", seed=3, floats=1000), tmp_path / "store"
    published = pub(root, model)
    layer = f"sha256:{candidate(model).digest}"
    flip_byte(root / "blobs" / "sha256" / layer[7:], offset=500)
    with pytest.raises(CorruptBlob, match=layer):
        LocalStore(root).pull("ocr", published.version, tmp_path / "direct")
    out = tmp_path / "pulled"
    proc = registry_cli("pull", f"ocr:{published.version}", "--out", out, f"registry.root={root}")
    one_line_error(proc, 3, layer, "model.onnx", "does not match")
    assert not out.exists() and not list(tmp_path.glob(".tmp-pull-*"))
    proc = registry_cli("verify", f"registry.root={root}")
    assert proc.returncode == 3 and layer in proc.stdout
    assert pub(root, model).existed  # the same bytes, pushed again, replace the corrupt blob
    assert registry_cli("verify", f"registry.root={root}").returncode == 0

    flip_byte(root / "blobs" / "sha256" / published.digest[7:])  # now the manifest itself
    proc = registry_cli("show", f"ocr:{published.version}", f"registry.root={root}")
    one_line_error(proc, 3, f"manifest {published.digest}", "does not match")


@pytest.mark.slow
def test_promote_moves_aliases_only_to_passed_versions_unless_forced(tmp_path):
    root = tmp_path / "store"
    good = pub(root, make_model(tmp_path / "a.onnx", seed=4))
    bad = pub(root, make_model(tmp_path / "b.onnx", seed=5), passed=False)
    r = f"registry.root={root}"
    one_line_error(registry_cli("promote", f"ocr:{bad.version}", "production", r), 1,
                   bad.version, "gate did not pass", "--force")
    with pytest.raises(PromotionRefused):
        LocalStore(root).promote("ocr", bad.version, "production")
    assert registry_cli("promote", f"ocr:{good.version}", "production", r).returncode == 0
    assert registry_cli("promote", "ocr:production", "candidate", r).returncode == 0
    store = LocalStore(root)
    assert store.resolve("ocr", "production").version == good.version
    proc = registry_cli("promote", f"ocr:{bad.version}", "candidate", "--force", "--reason",
                        "rollback drill", r)
    assert proc.returncode == 0 and "forced" in proc.stdout
    entry = store.resolve("ocr", "candidate")
    assert entry.version == bad.version and entry.aliases == {"candidate": True}
    index = json.loads((root / "index.json").read_text())["manifests"]
    records = [d for d in index if d["annotations"]["io.pipeline.kind"] == "promotion"]
    assert len(records) == 3
    record = json.loads((root / "blobs" / "sha256" / records[-1]["digest"][7:]).read_bytes())
    assert record["subject"]["digest"] == bad.digest
    assert record["annotations"]["io.pipeline.forced"] == "true"
    assert record["annotations"]["io.pipeline.previous"] == good.version
    assert record["annotations"]["io.pipeline.reason"] == "rollback drill"
    one_line_error(registry_cli("promote", f"ocr:{good.version}", "staging", r), 2,
                   "candidate, production")
    assert registry_cli("verify", r).returncode == 0


@pytest.mark.parametrize("bad", ["../evil", "a/b", "..", "a\\b", "Ocr", "a b", "", "-x", "a..b"])
def test_names_are_validated(tmp_path, bad):
    with pytest.raises(ConfigError):
        check_name(bad)
    with pytest.raises(ConfigError):
        publish(RegistryConfig(root=str(tmp_path / "store")), model_name=bad, mode="int8",
                candidate=candidate(make_model(tmp_path / "m.onnx", seed=6)),
                manifest=evidence())
    assert not (tmp_path / "store").exists()


@pytest.mark.parametrize("ref", ["../x:int8-1", "ocr/../x", "ocr:../../etc", "ocr:a..b",
                                 "ocr@sha256:xyz", "ocr:production/x"])
def test_cli_refuses_bad_refs_in_one_line(tmp_path, ref):
    proc = registry_cli("pull", ref, "--out", tmp_path / "o", f"registry.root={tmp_path}")
    one_line_error(proc, 2)
    assert not (tmp_path / "o").exists()


def test_versions_and_refs_parse():
    assert parse_ref("ocr:production") == ("ocr", "production")
    assert parse_ref("ocr_tiny:int8-0123456789abcdef") == ("ocr_tiny", "int8-0123456789abcdef")
    assert parse_ref(f"ocr@sha256:{'0' * 64}") == ("ocr", f"sha256:{'0' * 64}")
    assert parse_ref("ocr") == ("ocr", None)
    with pytest.raises(ConfigError, match="reserved"):
        check_version("production")


def test_gc_removes_only_what_no_entry_reaches(tmp_path):
    root = tmp_path / "store"
    kept = pub(root, make_model(tmp_path / "a.onnx", seed=7))
    orphan = build("ocr", "int8-orphan", make_model(tmp_path / "b.onnx", seed=8), evidence())
    store = LocalStore(root)
    for blob in orphan.blobs:  # what a push killed before its index write leaves behind
        store._put(blob)
    (root / ".tmp" / ".tmp-half-written").write_bytes(b"x" * 100)
    proc = registry_cli("gc", f"registry.root={root}")
    assert proc.returncode == 0, proc.stderr
    assert "removed 2 blob(s)" in proc.stdout and "1 temporary file(s)" in proc.stdout
    assert not list((root / ".tmp").iterdir())
    assert registry_cli("verify", f"registry.root={root}").returncode == 0
    assert store.resolve("ocr", kept.version).digest == kept.digest


@pytest.mark.slow
def test_sigkill_during_push_never_leaves_a_partial_version(tmp_path):
    """Children pushing a 12 MB model are killed at random points: after a random delay from
    their start, or a random few milliseconds after their first temporary file appears. Each
    time the index stays valid and lists only complete versions; then every push succeeds."""
    root, rng = tmp_path / "store", random.Random(6)
    models = [make_model(tmp_path / f"big{i}.onnx", seed=10 + i, floats=3_000_000)
              for i in range(6)]
    t0 = time.monotonic()
    subprocess.run(publish_cmd(models[0], root=tmp_path / "probe"), env=env(), check=True,
                   capture_output=True)
    full = time.monotonic() - t0
    complete = set()
    for i, model in enumerate(models):
        child = subprocess.Popen(publish_cmd(model, root=root), env=env(),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if i % 2 == 0:
            time.sleep(rng.uniform(0.3, 1.0) * full)
        else:  # inside the blob writes
            deadline = time.monotonic() + 30
            while child.poll() is None and time.monotonic() < deadline and not (
                    (root / ".tmp").exists() and any((root / ".tmp").iterdir())):
                time.sleep(0.001)
            time.sleep(rng.uniform(0, 0.02))
        child.send_signal(signal.SIGKILL)
        child.wait()
        store = LocalStore(root)
        listed = {e.version for e in store.versions()}  # the index parses
        count, problems = store.verify()
        assert not problems, problems
        assert listed - complete <= {version_of(model)}
        complete = listed
    for model in models:  # the next push of each succeeds, and everything verifies
        subprocess.run(publish_cmd(model, root=root), env=env(), check=True, capture_output=True)
    assert {e.version for e in LocalStore(root).versions()} == {version_of(m) for m in models}
    assert registry_cli("gc", f"registry.root={root}").returncode == 0
    proc = registry_cli("verify", f"registry.root={root}")
    assert proc.returncode == 0 and "verified 6 version(s)" in proc.stdout, proc.stderr
    assert not list((root / ".tmp").iterdir())


def test_eight_publishers_at_once(tmp_path):
    root, go = tmp_path / "store", tmp_path / "go"
    models = [make_model(tmp_path / f"m{i}.onnx", seed=100 + i) for i in range(8)]
    runs = models + models[:2]  # two of them race a twin publishing the same version
    procs = [subprocess.Popen(publish_cmd(m, root=root), env={**env(), "PUBLISH_GO": str(go)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for m in runs]
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("go.ready-*"))) < len(procs) and time.monotonic() < deadline:
        time.sleep(0.01)
    go.touch()
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    index = json.loads((root / "index.json").read_text())
    versions = [d["annotations"]["io.pipeline.version"] for d in index["manifests"]]
    assert sorted(versions) == sorted(version_of(m) for m in models)  # each once, none lost
    count, problems = LocalStore(root).verify()
    assert count == 8 and not problems
