"""Registry credentials, from the environment or a netrc file and nowhere else.

In: the registry's host (and port). Out: ``(username, password)`` or ``None`` for anonymous access.
Looked up in order: ``PIPELINE_REGISTRY_USERNAME`` and ``PIPELINE_REGISTRY_PASSWORD``; then the
netrc file (``$NETRC`` or ``~/.netrc``), ``machine host:port`` before ``machine host``. Config
files, manifests and URLs never carry them (``RegistryConfig`` refuses a URL with a user part), and
no message here includes a secret: a malformed netrc is reported by file and line only.
Not handled: docker's ``config.json`` and credential helpers, token exchange (oras does that).
"""
from __future__ import annotations

import netrc
import os
from pathlib import Path

from pipeline.core.errors import ConfigError

USER_ENV, PASSWORD_ENV = "PIPELINE_REGISTRY_USERNAME", "PIPELINE_REGISTRY_PASSWORD"


def lookup(host: str, port: int | None = None) -> tuple[str, str] | None:
    user, password = os.environ.get(USER_ENV), os.environ.get(PASSWORD_ENV)
    if user or password:
        if not (user and password):
            raise ConfigError(f"set both {USER_ENV} and {PASSWORD_ENV}, or neither")
        return user, password
    path = Path(os.environ.get("NETRC") or Path.home() / ".netrc")
    if not path.is_file():
        return None
    try:
        rc = netrc.netrc(str(path))
    except netrc.NetrcParseError as e:
        raise ConfigError(f"netrc file {path}: cannot be parsed near line {e.lineno}") from None
    except OSError as e:
        raise ConfigError(f"netrc file {path}: cannot be read ({e.strerror})") from None
    for machine in ([f"{host}:{port}"] if port else []) + [host]:
        found = rc.authenticators(machine)
        if found and found[0] and found[2]:
            return found[0], found[2]
    return None
