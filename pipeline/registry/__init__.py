"""Registry backends by ``registry.backend``: where gated artifacts are published and pulled from.

In: a ``RegistryConfig`` and, for ``publish``, the candidate artifact plus the evidence that
``python -m pipeline`` gathered. Out: a ``Published`` record (printable: ``name:version@digest``
and where). The backends are a plain dict; the OCI and MLflow ones import ``oras`` and ``mlflow``
only when chosen, so the local default needs neither. The version name is the quant mode plus the
artifact's content digest: the same model is never published under two names.
"""
from __future__ import annotations

from pipeline.core.errors import ConfigError

BACKENDS = {"local": "pipeline.registry.local:LocalStore",
            "oci": "pipeline.registry.oci:OciRegistry",
            "mlflow": "pipeline.registry.mlflow_backend:MlflowRegistry"}


def open_backend(registry_cfg):
    """The backend object for a ``RegistryConfig``."""
    import importlib

    from pipeline.registry.names import check_repository

    check_repository(registry_cfg.repository)  # a RegistryConfig built without compose
    kind = getattr(registry_cfg.backend, "value", registry_cfg.backend)
    if kind not in BACKENDS:
        raise ConfigError(f"registry.backend={kind!r}: unknown; valid choices: "
                          f"{', '.join(BACKENDS)}")
    module, cls = BACKENDS[kind].split(":")
    backend = getattr(importlib.import_module(module), cls)
    return backend(registry_cfg.root) if kind == "local" else backend(registry_cfg)


def publish(registry_cfg, model_name: str, mode: str, candidate, manifest: dict,
            extra: dict | None = None):
    """Push the candidate (``.model``, ``.files_digest``) with its evidence as one immutable
    version. The version is named by the files alone: the artifact's own digest also covers its
    metadata, and the same model must never be published under two names. ``extra``: the
    model's other files by name (a decoder's folder)."""
    from pipeline.registry.package import build

    backend = open_backend(registry_cfg)
    pkg = build(model_name, f"{mode}-{candidate.files_digest[:16]}", candidate.model, manifest,
                extra)
    return backend.push(pkg)
