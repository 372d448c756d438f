"""The OCI backend against a real registry: Debian's docker-registry (CNCF Distribution) started
on 127.0.0.1 with a config written here, its storage in a temporary folder."""
from __future__ import annotations

import json
import random
import signal
import subprocess
import time

import pytest

from pipeline.config import RegistryBackend, RegistryConfig
from pipeline.core.errors import CorruptBlob
from pipeline.registry import open_backend, publish
from pipeline.registry.local import LocalStore
from pipeline.registry.package import build
from tests.registry_support import (candidate, env, evidence, flip_byte, htpasswd_line,
                                    make_model, publish_cmd, registry_cli, start_docker_registry,
                                    version_of)


@pytest.fixture(scope="module")
def oci(tmp_path_factory):
    """(url, storage folder) of a registry that lives as long as this module's tests."""
    url, storage, server = start_docker_registry(tmp_path_factory.mktemp("docker-registry"))
    yield url, storage
    server.stop()


def cfg(url: str, repository: str) -> RegistryConfig:
    return RegistryConfig(backend=RegistryBackend.oci, url=url, repository=repository)


def overrides(url: str, repository: str) -> list[str]:
    return ["registry=oci", f"registry.url={url}", f"registry.repository={repository}"]


def stored_blob(storage, digest: str):
    hexd = digest.split(":", 1)[1]
    return storage / "docker/registry/v2/blobs/sha256" / hexd[:2] / hexd / "data"


@pytest.mark.slow  # seconds: out of make test-fast's edit loop
def test_same_manifest_and_bytes_as_the_local_store(oci, tmp_path):
    url, _ = oci
    model = make_model(tmp_path / "m.onnx", seed=21, floats=5000)
    pkg = build("ocr", version_of(model), model, evidence())
    local = LocalStore(tmp_path / "store").push(pkg)
    remote = open_backend(cfg(url, "roundtrip")).push(pkg)
    assert remote.digest == local.digest == pkg.digest and not remote.existed
    again = publish(cfg(url, "roundtrip"), model_name="ocr", mode="int8",
                    candidate=candidate(model), manifest=evidence(passed=False))
    assert again.existed and again.digest == pkg.digest  # immutable: the first stays
    out = tmp_path / "pulled"
    proc = registry_cli("pull", f"ocr:{pkg.version}", "--out", out,
                        *overrides(url, "roundtrip"))
    assert proc.returncode == 0, proc.stderr
    assert (out / "model.onnx").read_bytes() == model.read_bytes()
    assert (out / "oci-manifest.json").read_bytes() == pkg.manifest_bytes
    local_out = tmp_path / "local"
    LocalStore(tmp_path / "store").pull("ocr", pkg.version, local_out)
    for f in ("model.onnx", "manifest.json", "oci-manifest.json"):
        assert (out / f).read_bytes() == (local_out / f).read_bytes(), f
    proc = registry_cli("list", "--json", *overrides(url, "roundtrip"))
    [entry] = json.loads(proc.stdout)
    assert entry["digest"] == pkg.digest and entry["passed"] is True


@pytest.mark.slow  # seconds: out of make test-fast's edit loop
def test_promote_needs_a_passed_gate_and_records_force(oci, tmp_path):
    url, _ = oci
    o = overrides(url, "promote")
    good = publish(cfg(url, "promote"), model_name="ocr", mode="int8",
                   candidate=candidate(make_model(tmp_path / "a.onnx", seed=22)),
                   manifest=evidence())
    bad = publish(cfg(url, "promote"), model_name="ocr", mode="int8",
                  candidate=candidate(make_model(tmp_path / "b.onnx", seed=23)),
                  manifest=evidence(passed=False))
    proc = registry_cli("promote", f"ocr:{bad.version}", "production", *o)
    assert proc.returncode == 1 and "gate did not pass" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert registry_cli("promote", f"ocr:{good.version}", "production", *o).returncode == 0
    assert registry_cli("promote", f"ocr:{bad.version}", "candidate", "--force", *o).returncode == 0
    backend = open_backend(cfg(url, "promote"))
    assert backend.resolve("ocr", "production").digest == good.digest
    assert backend.resolve("ocr", "candidate").digest == bad.digest
    tags = backend._tags("promote/ocr")
    [forced] = [t for t in tags if t.startswith("promotion-candidate-")]
    record = json.loads(backend._get("promote/ocr", forced))
    assert record["subject"]["digest"] == bad.digest
    assert record["annotations"]["io.pipeline.forced"] == "true"
    assert {e.version for e in backend.versions("ocr")} == {good.version, bad.version}


@pytest.mark.slow  # seconds: out of make test-fast's edit loop
def test_flipped_byte_in_registry_storage_is_refused_naming_the_blob(oci, tmp_path):
    url, storage = oci
    model = make_model(tmp_path / "m.onnx", seed=24, floats=2000)
    published = publish(cfg(url, "corrupt"), model_name="ocr", mode="int8",
                        candidate=candidate(model), manifest=evidence())
    layer = f"sha256:{candidate(model).digest}"
    flip_byte(stored_blob(storage, layer), offset=700)  # the registry still serves it, HTTP 200
    with pytest.raises(CorruptBlob, match=layer):
        open_backend(cfg(url, "corrupt")).pull("ocr", published.version, tmp_path / "direct")
    out = tmp_path / "pulled"
    proc = registry_cli("pull", f"ocr:{published.version}", "--out", out,
                        *overrides(url, "corrupt"))
    assert proc.returncode == 3 and not out.exists()
    [line] = proc.stderr.strip().splitlines()
    assert layer in line and "model.onnx" in line and "does not match" in line
    proc = registry_cli("verify", "ocr", *overrides(url, "corrupt"))
    assert proc.returncode == 3 and layer in proc.stdout
    flip_byte(stored_blob(storage, published.digest), offset=10)  # and the manifest itself
    proc = registry_cli("show", f"ocr:{published.version}", *overrides(url, "corrupt"))
    assert proc.returncode == 3 and f"manifest {published.digest}" in proc.stderr


@pytest.mark.slow
def test_sigkill_during_push_never_leaves_a_visible_version(oci, tmp_path):
    url, _ = oci
    rng = random.Random(7)
    model = make_model(tmp_path / "big.onnx", seed=25, floats=3_000_000)
    fields = {"backend": "oci", "url": url, "repository": "killed"}
    t0 = time.monotonic()
    subprocess.run(publish_cmd(model, **{**fields, "repository": "probe"}), env=env(), check=True,
                   capture_output=True)
    full = time.monotonic() - t0
    backend = open_backend(cfg(url, "killed"))
    # A killed push cannot remove its scratch folder: keep it in this test's folder, not /tmp.
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    for _ in range(3):
        child = subprocess.Popen(publish_cmd(model, **fields),
                                 env={**env(), "TMPDIR": str(scratch)},
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.4, 0.95) * full)
        child.send_signal(signal.SIGKILL)
        child.wait()
        listed = backend.versions("ocr")
        assert [e.version for e in listed] in ([], [version_of(model)])
        assert backend.verify("ocr")[1] == []
    subprocess.run(publish_cmd(model, **fields), env=env(), check=True, capture_output=True)
    proc = registry_cli("verify", "ocr", *overrides(url, "killed"))
    assert proc.returncode == 0 and "verified 1 version(s)" in proc.stdout, proc.stderr


def test_unreachable_registry_is_one_line(tmp_path):
    proc = registry_cli("list", "ocr", *overrides("http://127.0.0.1:9", "x"))
    assert proc.returncode == 3 and "unreachable" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_credentials_come_from_the_environment_or_netrc_and_are_never_written(tmp_path):
    """A registry that wants basic auth (htpasswd): anonymous access is one line; environment
    variables or a netrc entry get in; the secret is in no output, manifest or evidence."""
    secret = "pw-7f3a9c"
    line = htpasswd_line("ci", secret)
    if line is None:
        pytest.skip("this Python has no crypt module with bcrypt to write the htpasswd file")
    (tmp_path / "htpasswd").write_text(line)
    url, storage, server = start_docker_registry(tmp_path, htpasswd=tmp_path / "htpasswd")
    try:
        o = overrides(url, "auth")
        anonymous = {k: v for k, v in env().items() if not k.startswith("PIPELINE_REGISTRY_")}
        anonymous["NETRC"] = str(tmp_path / "absent")
        proc = subprocess.run([*registry_cli_cmd(), "list", "ocr", *o], env=anonymous,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 3 and "wants credentials" in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
        model = make_model(tmp_path / "m.onnx", seed=26)
        with_env = {**anonymous, "PIPELINE_REGISTRY_USERNAME": "ci",
                    "PIPELINE_REGISTRY_PASSWORD": secret}
        pushed = subprocess.run(publish_cmd(model, backend="oci", url=url, repository="auth"),
                                env=with_env, capture_output=True, text=True, timeout=60)
        assert pushed.returncode == 0, pushed.stderr
        netrc = tmp_path / "netrc"
        netrc.write_text(f"machine 127.0.0.1:{url.rsplit(':', 1)[1]} login ci password {secret}\n")
        netrc.chmod(0o600)
        out = tmp_path / "pulled"
        proc = subprocess.run([*registry_cli_cmd(), "pull", f"ocr:{version_of(model)}", "--out",
                               str(out), *o], env={**anonymous, "NETRC": str(netrc)},
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert (out / "model.onnx").read_bytes() == model.read_bytes()
        for text in (pushed.stdout + pushed.stderr, proc.stdout + proc.stderr,
                     (out / "manifest.json").read_text(),
                     (out / "oci-manifest.json").read_text()):
            assert secret not in text
    finally:
        server.stop()


def registry_cli_cmd() -> list[str]:
    import sys

    return [sys.executable, "-m", "pipeline.registry"]
