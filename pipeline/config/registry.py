"""The ``registry=`` group's schema (``conf/registry/``): where a passing candidate is published.

In: nothing (typed config). Out: ``RegistryConfig`` (a local OCI layout, an OCI registry or an
MLflow server; its URL, repository and timeout) and ``RegistryBackend``. Credentials never come
from the config: a URL that holds them is refused.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Optional

from pipeline.core.errors import ConfigError


class RegistryBackend(str, Enum):
    local = "local"      # content-addressed OCI image layout under `root`
    oci = "oci"          # an OCI registry (CNCF Distribution, Harbor, GHCR ...) through oras
    mlflow = "mlflow"    # an MLflow tracking server and its model registry


@dataclass
class RegistryConfig:
    backend: RegistryBackend = RegistryBackend.local
    root: str = "artifacts/registry"        # local store, relative to the working directory
    url: Optional[str] = None               # oci: http(s)://host:port; mlflow: tracking server
    repository: str = "pipeline"            # oci: <repository>/<model>; mlflow: the experiment
    timeout_s: float = 60.0                 # per request to a remote registry

    def __post_init__(self):
        from urllib.parse import urlsplit

        # registry.repository's grammar is the registry's (pipeline.registry.names): compose
        # checks it after reading the config, and the backends when opened.
        if self.timeout_s <= 0:
            raise ConfigError(f"registry.timeout_s={self.timeout_s}: must be > 0")
        if self.backend != RegistryBackend.local and not self.url:
            raise ConfigError(f"registry.url is required for registry.backend="
                              f"{self.backend.value}, e.g. http://127.0.0.1:5000")
        if self.url:
            parts = urlsplit(self.url)
            if "@" in parts.netloc:  # never echo it: the part before '@' is a secret
                raise ConfigError("registry.url: credentials in the URL are refused (config and "
                                  "manifests are published); set PIPELINE_REGISTRY_USERNAME and "
                                  "PIPELINE_REGISTRY_PASSWORD or a netrc entry")
            if parts.scheme not in ("http", "https") or not parts.hostname or parts.query:
                raise ConfigError(f"registry.url={self.url!r}: expected http(s)://host[:port]"
                                  "[/path]")
