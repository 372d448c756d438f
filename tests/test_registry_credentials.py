"""Registry config and credentials: the backend enum, required URLs, secrets never taken from a
URL and never echoed, credentials from the environment or a netrc file."""
from __future__ import annotations

import pytest

from pipeline.engine.compose import compose
from pipeline.config import RegistryBackend
from pipeline.core.errors import ConfigError
from pipeline.registry import credentials
from tests.conftest import run_cli


@pytest.mark.parametrize("option, backend", [("local", RegistryBackend.local),
                                             ("oci", RegistryBackend.oci),
                                             ("mlflow", RegistryBackend.mlflow)])
def test_each_option_selects_its_backend(option, backend):
    cfg = compose([f"registry={option}"]).registry
    assert cfg.backend is backend and (cfg.url is None) == (option == "local")


@pytest.mark.parametrize("overrides, expected", [
    (["registry.backend=s3"], "expected one of [local, oci, mlflow]"),
    (["registry=oci", "registry.url=null"], "registry.url is required"),
    (["registry=oci", "registry.url=ftp://host"], "expected http(s)://host"),
    (["registry=oci", "registry.repository=../x"], "'..' are not allowed"),
    (["registry=mlflow", "registry.timeout_s=0"], "must be > 0"),
])
def test_bad_registry_config_is_one_line(overrides, expected):
    with pytest.raises(ConfigError) as e:
        compose(overrides)
    assert expected in str(e.value) and "\n" not in str(e.value)


def test_a_secret_in_the_url_is_refused_and_never_echoed(tmp_path):
    proc = run_cli("registry=oci", "registry.url=https://bob:hunter2@registry.example",
                   f"workdir={tmp_path}")
    assert proc.returncode == 2 and "credentials in the URL are refused" in proc.stderr
    assert "hunter2" not in proc.stdout + proc.stderr


def test_credentials_from_environment_then_netrc(tmp_path, monkeypatch):
    monkeypatch.delenv(credentials.USER_ENV, raising=False)
    monkeypatch.delenv(credentials.PASSWORD_ENV, raising=False)
    rc = tmp_path / "netrc"
    rc.write_text("machine registry.example:5000 login alice password s3cret\n"
                  "machine other.example login carol password pw2\n")
    rc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(rc))
    assert credentials.lookup("registry.example", 5000) == ("alice", "s3cret")
    assert credentials.lookup("other.example", 443) == ("carol", "pw2")
    assert credentials.lookup("unknown.example", None) is None
    monkeypatch.setenv(credentials.USER_ENV, "dave")
    with pytest.raises(ConfigError, match="set both"):
        credentials.lookup("registry.example", 5000)
    monkeypatch.setenv(credentials.PASSWORD_ENV, "pw3")
    assert credentials.lookup("registry.example", 5000) == ("dave", "pw3")


def test_a_broken_netrc_is_reported_without_its_contents(tmp_path, monkeypatch):
    monkeypatch.delenv(credentials.USER_ENV, raising=False)
    monkeypatch.delenv(credentials.PASSWORD_ENV, raising=False)
    rc = tmp_path / "netrc"
    rc.write_text("machine x login a password topsecret\nbogus-token topsecret2\n")
    monkeypatch.setenv("NETRC", str(rc))
    with pytest.raises(ConfigError) as e:
        credentials.lookup("x", None)
    assert "topsecret" not in str(e.value) and str(rc) in str(e.value)
