"""Registry backends by ``registry.backend``: where gated artifacts are published."""
from __future__ import annotations

from pipeline.errors import ConfigError


def publish(registry_cfg, **kwargs):
    if registry_cfg.backend == "local":
        from pipeline.registry.local import publish as local_publish

        return local_publish(registry_cfg.root, **kwargs)
    raise ConfigError(f"registry.backend={registry_cfg.backend!r}: unknown; valid choices: local")
