"""Names, versions, aliases and digests that may enter a registry, checked before any path or URL
is built from them.

In: strings from the config, the command line, an index or a manifest. Out: the same string, or a
``ConfigError`` naming the value and the rule. A model name becomes a folder (Triton export), an
OCI repository path component and part of an MLflow model name, so its rule is the strictest of
the three: OCI's path-component grammar (lower-case letters and digits, single ``.``, ``_`` or
``-`` between them). That grammar already excludes ``/``, ``\\`` and ``..``; they get their own
message because they are what an attack looks like. Whether a name exists is not checked here.
"""
from __future__ import annotations

import re

from pipeline.core.errors import ConfigError

ALIASES = ("candidate", "production")   # the only tags that move, and only through promote
NAME = re.compile(r"[a-z0-9]+(?:[._-][a-z0-9]+)*")
VERSION = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")  # an OCI tag
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def check_name(name: str, what: str = "model name") -> str:
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{what} {name!r}: must be a non-empty string")
    if "/" in name or "\\" in name or ".." in name:
        raise ConfigError(f"{what} {name!r}: path separators and '..' are not allowed")
    if len(name) > 128 or not NAME.fullmatch(name):
        raise ConfigError(f"{what} {name!r}: use lower-case letters and digits, joined by single "
                          "'.', '_' or '-' (at most 128 characters)")
    return name


def check_repository(repository: str) -> str:
    """An OCI namespace (``team/models``) or MLflow experiment: name components joined by '/'."""
    if not isinstance(repository, str) or not repository or repository.startswith("/") \
            or repository.endswith("/") or "//" in repository:
        raise ConfigError(f"registry.repository={repository!r}: expected components joined by "
                          "single '/', e.g. 'pipeline' or 'team/models'")
    for part in repository.split("/"):
        check_name(part, "registry.repository component")
    return repository


def check_version(version: str) -> str:
    if not isinstance(version, str) or ".." in version or not VERSION.fullmatch(version):
        raise ConfigError(f"version {version!r}: use letters, digits, '.', '_' and '-' (at most "
                          "128 characters, not starting with '.' or '-', no '..')")
    if version in ALIASES:
        raise ConfigError(f"version {version!r}: reserved for an alias ({', '.join(ALIASES)})")
    return version


def check_alias(alias: str) -> str:
    if alias not in ALIASES:
        raise ConfigError(f"alias {alias!r}: valid choices: {', '.join(ALIASES)}")
    return alias


def check_digest(digest: str, what: str = "digest") -> str:
    if not isinstance(digest, str) or not DIGEST.fullmatch(digest):
        raise ConfigError(f"{what} {digest!r}: expected 'sha256:' and 64 lower-case hex digits")
    return digest


def parse_ref(text: str) -> tuple[str, str | None]:
    """``name``, ``name:version``, ``name:alias`` or ``name[:tag]@sha256:...`` -> (name, ref or
    None); with a digest the tag is only checked, the digest decides (as in OCI references)."""
    if "@" in text:
        left, digest = text.split("@", 1)
        name, sep, tag = left.partition(":")
        if sep and tag not in ALIASES:
            check_version(tag)
        return check_name(name), check_digest(digest)
    name, sep, ref = text.partition(":")
    check_name(name)
    if not sep:
        return name, None
    return name, ref if ref in ALIASES else check_version(ref)
