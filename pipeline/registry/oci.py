"""The OCI backend: the local store's manifest and blobs, pushed to a real registry with oras.

In: a ``Package`` and ``registry.url`` / ``registry.repository``. Out: the package's blobs and its
manifest, byte for byte, at ``<repository>/<model>:<version>`` (the same digest as in the local
store), aliases as tags that only ``promote`` moves, and each promotion as a small manifest whose
``subject`` is the version (tag ``promotion-<alias>-<time>``). oras-py does the HTTP work (blob
upload, auth challenges); the manifest is sent and fetched as raw bytes, because re-serialized
JSON would change its digest. A pull resolves the tag to a digest, fetches the manifest by that
digest and re-hashes it and every blob: the registry API does not verify on read, and a flipped
byte on its disk is served with status 200. oras' own retry loop (minutes of sleeps against a dead
server) is bypassed for one timeout per request. Credentials come from ``credentials.py``. Not
handled: tag immutability on the server (two pushers racing on one new version: the last manifest
wins; the content is the same model), chunked upload of multi-GB models, deleting versions.
"""
from __future__ import annotations

import functools
import ipaddress
import json
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

from pipeline.core.errors import ConfigError, RegistryError
from pipeline.registry import credentials, transfer
from pipeline.registry.backend import Entry, Published
from pipeline.registry.names import ALIASES, check_alias, check_name
from pipeline.registry.package import (MANIFEST_TYPE, INDEX_TYPE, P, Package,
                                       check_promotable, parse, promotion, sha256_bytes)

ACCEPT = f"{MANIFEST_TYPE}, {INDEX_TYPE}"


class OciRegistry:
    kind = "oci"

    def __init__(self, cfg):
        parts = urlsplit(cfg.url)
        if parts.path.strip("/"):
            raise ConfigError(f"registry.url={cfg.url!r}: an OCI registry URL has no path; put "
                              f"it in registry.repository")
        self.scheme, self.host = parts.scheme, parts.netloc
        self.where = f"{self.scheme}://{self.host}"
        self.prefix = cfg.repository
        self.timeout = cfg.timeout_s
        self.creds = credentials.lookup(parts.hostname, parts.port)
        if self.creds and self.scheme == "http" and not _loopback(parts.hostname):
            raise ConfigError(f"registry.url={cfg.url!r}: credentials are never sent over plain "
                              "http to another machine; use https")
        self._reg = None
        self._manifests: dict[str, bytes] = {}  # digest -> bytes already re-hashed

    # --- writing -------------------------------------------------------------------------------
    def push(self, pkg: Package) -> Published:
        repo = self._repo(pkg.name)
        existing = self._head(repo, pkg.version)
        if existing is not None:  # a version is never rewritten: check the stored one instead
            problems = self._verify_digest(repo, pkg.version, existing)
            if problems:
                raise RegistryError(problems[0])
            return Published(self.kind, pkg.name, pkg.version, existing, f"{self.where}/{repo}",
                             existed=True)
        self._upload_blobs(repo, pkg)
        got = self._put_manifest(repo, pkg.version, pkg.manifest_bytes)
        return Published(self.kind, pkg.name, pkg.version, got, f"{self.where}/{repo}")

    def promote(self, name: str, ref: str, alias: str, force: bool = False,
                reason: str = "") -> Entry:
        check_alias(alias)
        entry = self.resolve(name, ref)
        manifest, _ = self.manifest(entry)
        check_promotable(manifest, name, entry.version, alias, force)
        repo = self._repo(name)
        previous = self._head(repo, alias)
        prev_version = self._version_of(repo, previous) if previous else None
        record = promotion(name, entry.version, {"digest": entry.digest, "size": entry.size},
                           alias, force, prev_version, reason)
        self._upload_blobs(repo, record)
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        self._put_manifest(repo, f"promotion-{alias}-{stamp}-{record.digest[7:15]}",
                           record.manifest_bytes)
        self._put_manifest(repo, alias, self._fetch_manifest(repo, entry.digest))
        return self.resolve(name, alias)

    def gc(self) -> dict:
        raise RegistryError("gc works on the local store; an OCI registry collects its own "
                            "garbage (docker-registry garbage-collect <config>)")

    # --- reading -------------------------------------------------------------------------------
    def versions(self, name: str | None = None) -> list[Entry]:
        out = []
        for repo_name in ([check_name(name)] if name else self._model_names()):
            repo = self._repo(repo_name)
            tags = self._tags(repo)
            aliases = {a: self._head(repo, a) for a in ALIASES if a in tags}
            for tag in tags:
                if tag in ALIASES or tag.startswith("promotion-"):
                    continue
                digest = self._head(repo, tag)
                if digest is not None:
                    out.append(self._entry(repo, repo_name, digest, aliases))
        return out

    def resolve(self, name: str, ref: str | None) -> Entry:
        check_name(name)
        repo = self._repo(name)
        if ref is None:
            versions = [e.version for e in self.versions(name)]
            raise RegistryError(f"{name}: give a version, an alias ({', '.join(ALIASES)}) or "
                                f"@sha256:...; versions: {', '.join(versions) or 'none'}")
        digest = ref if ref.startswith("sha256:") else self._head(repo, ref)
        if digest is None:
            raise RegistryError(f"{name}:{ref}: not found in {self.where}/{repo}")
        aliases = {a: self._head(repo, a) for a in ALIASES}
        return self._entry(repo, name, digest, aliases)

    def manifest(self, entry: Entry) -> tuple[dict, bytes]:
        data = self._fetch_manifest(self._repo(entry.name), entry.digest)
        return parse(data, entry.digest, f"{entry.name}:{entry.version}"), data

    def pull(self, name: str, ref: str | None, dest: Path, force: bool = False
             ) -> tuple[Entry, Path]:
        entry = self.resolve(name, ref)
        manifest, data = self.manifest(entry)
        where = f"{self.where}/{self._repo(name)}:{entry.version}"
        return entry, transfer.pull_into(dest, where, manifest, data,
                                         self._opener(self._repo(name), where), force=force)

    def verify(self, name: str | None = None) -> tuple[int, list[str]]:
        count, problems = 0, []
        for repo_name in ([check_name(name)] if name else self._model_names()):
            repo, seen = self._repo(repo_name), set()
            tags = self._tags(repo)
            versions = [t for t in tags if t not in ALIASES and not t.startswith("promotion-")]
            for tag in versions + [t for t in tags if t not in versions]:
                digest = self._head(repo, tag)
                if digest is None or digest in seen:  # an alias shares its version's bytes
                    continue
                seen.add(digest)
                count += tag in versions
                problems += self._verify_digest(repo, tag, digest)
        return count, problems

    # --- internals -----------------------------------------------------------------------------
    def _repo(self, name: str) -> str:
        return f"{self.prefix}/{check_name(name)}"

    def _client(self):
        """oras' Registry, with the auth scheme the registry asks for (Basic or Bearer token)."""
        if self._reg is None:
            import requests

            try:
                probe = requests.get(f"{self.where}/v2/", timeout=self.timeout)
            except requests.RequestException as e:
                raise RegistryError(f"OCI registry {self.where} unreachable "
                                    f"({type(e).__name__})") from None
            challenge = probe.headers.get("Www-Authenticate", "").split(" ")[0].lower()
            if probe.status_code == 401 and not self.creds:
                raise RegistryError(f"OCI registry {self.where} wants credentials: set "
                                    f"{credentials.USER_ENV} and {credentials.PASSWORD_ENV} or a "
                                    "netrc entry")
            reg = _registry_class()(hostname=self.host, insecure=self.scheme == "http",
                                    auth_backend="basic" if challenge == "basic" else "token",
                                    timeout=self.timeout)
            if self.creds:
                reg.auth.set_basic_auth(*self.creds)
            self._reg = reg
        return self._reg

    def _req(self, method: str, path: str, **kw):
        import requests

        url = path if path.startswith("http") else f"{self.where}/v2/{path}"
        try:
            return self._client().do_request(url, method, **kw)
        except (requests.RequestException, ValueError) as e:  # oras raises ValueError on auth
            raise RegistryError(f"OCI registry {self.where}: {method} {url.split('?')[0]} failed "
                                f"({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None

    def _head(self, repo: str, ref: str) -> str | None:
        r = self._req("HEAD", f"{repo}/manifests/{ref}", headers={"Accept": ACCEPT})
        if r.status_code == 404:
            return None
        _ok(r, f"{repo}:{ref}")
        digest = r.headers.get("Docker-Content-Digest")
        return digest or sha256_bytes(self._get(repo, ref))

    def _get(self, repo: str, ref: str) -> bytes:
        r = self._req("GET", f"{repo}/manifests/{ref}", headers={"Accept": ACCEPT})
        _ok(r, f"{repo}:{ref}")
        return r.content

    def _fetch_manifest(self, repo: str, digest: str) -> bytes:
        """The manifest by digest, re-hashed (raises ``CorruptBlob`` on a mismatch)."""
        if digest not in self._manifests:
            data = self._get(repo, digest)
            parse(data, digest, f"{self.where}/{repo}")
            self._manifests[digest] = data
        return self._manifests[digest]

    def _entry(self, repo: str, name: str, digest: str, aliases: dict) -> Entry:
        data = self._fetch_manifest(repo, digest)
        notes = json.loads(data).get("annotations", {})
        return Entry(name, notes.get(f"{P}version", "?"), digest, len(data),
                     notes.get(f"{P}gate.passed") == "true",
                     notes.get("org.opencontainers.image.created", ""),
                     {a: False for a, d in aliases.items() if d == digest})

    def _version_of(self, repo: str, digest: str) -> str | None:
        return json.loads(self._fetch_manifest(repo, digest)).get("annotations", {}).get(
            f"{P}version")

    def _verify_digest(self, repo: str, tag: str, digest: str) -> list[str]:
        where = f"{self.where}/{repo}:{tag}"
        try:
            manifest = parse(self._get(repo, digest), digest, where)
        except RegistryError as e:
            return [str(e)]
        return transfer.verify_blobs(where, manifest, self._opener(repo, where))

    def _tags(self, repo: str) -> list[str]:
        r = self._req("GET", f"{repo}/tags/list")
        if r.status_code == 404:
            return []
        _ok(r, repo)
        return sorted(r.json().get("tags") or [])

    def _model_names(self) -> list[str]:
        repos, path = [], "_catalog?n=1000"  # Distribution refuses pages above 1000
        while path:
            r = self._req("GET", path)
            if r.status_code in (401, 403, 404):
                raise RegistryError(f"OCI registry {self.where} does not list its repositories "
                                    f"(HTTP {r.status_code}); give a model name")
            _ok(r, "_catalog")
            repos += r.json().get("repositories") or []
            link = r.headers.get("Link", "")  # '</v2/_catalog?last=x&n=1000>; rel="next"'
            path = link[link.find("<") + 1:link.find(">")].split("/v2/", 1)[-1] if link else ""
        head = self.prefix + "/"
        return sorted(repo[len(head):] for repo in repos
                      if repo.startswith(head) and "/" not in repo[len(head):])

    def _upload_blobs(self, repo: str, pkg: Package) -> None:
        import oras.container

        container = oras.container.Container(f"{repo}:{pkg.version}", registry=self.host)
        with tempfile.TemporaryDirectory(prefix="oci-push-") as tmp:
            for blob in pkg.blobs:
                path = blob.path
                if path is None:  # oras uploads from a file
                    path = Path(tmp) / blob.digest.replace(":", "-")
                    path.write_bytes(blob.data)
                try:
                    r = self._client().upload_blob(str(path), container, blob.descriptor())
                except Exception as e:  # requests' and oras' errors, named below
                    raise RegistryError(f"OCI registry {self.where}: upload of blob "
                                        f"{blob.digest} ({blob.title or blob.media_type}) failed "
                                        f"({type(e).__name__}: {str(e).splitlines()[0][:200]})"
                                        ) from None
                _ok(r, f"{repo} blob {blob.digest}")

    def _put_manifest(self, repo: str, tag: str, data: bytes) -> str:
        r = self._req("PUT", f"{repo}/manifests/{tag}", data=data,
                      headers={"Content-Type": MANIFEST_TYPE})
        _ok(r, f"{repo}:{tag}")
        digest = sha256_bytes(data)
        got = r.headers.get("Docker-Content-Digest")
        if got and got != digest:
            raise RegistryError(f"OCI registry {self.where} stored {repo}:{tag} as {got}, not "
                                f"{digest}: it rewrote the manifest")
        return digest

    def _opener(self, repo: str, where: str):
        def open_blob(blob):
            r = self._req("GET", f"{repo}/blobs/{blob.digest}", stream=True)
            if r.status_code != 200:
                r.close()
                raise RegistryError(f"blob {blob.digest} ({blob.title or blob.media_type}) of "
                                    f"{where}: HTTP {r.status_code}")
            return _Chunks(r)
        return open_blob


class _Chunks:
    """A streamed response as an iterable of chunks that can be closed."""

    def __init__(self, response):
        self.response = response

    def __iter__(self):
        return self.response.iter_content(chunk_size=1 << 20)

    def close(self):
        self.response.close()


def _ok(r, what: str) -> None:
    if r.status_code in (200, 201, 202):
        return
    try:
        errors = r.json().get("errors") or []
        detail = "; ".join(f"{e.get('code')}: {e.get('message')}" for e in errors)[:300]
    except ValueError:
        detail = (r.text or r.reason or "")[:200].replace("\n", " ")
    raise RegistryError(f"OCI registry refused {what}: HTTP {r.status_code} {detail}".rstrip())


def _loopback(host: str | None) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@functools.lru_cache(maxsize=1)
def _registry_class():
    import oras.provider

    class Registry(oras.provider.Registry):
        """oras' client with a timeout on every request and without its retry loop."""

        def __init__(self, *args, timeout: float, **kwargs):
            super().__init__(*args, **kwargs)
            self.session.request = functools.partial(self.session.request, timeout=timeout)

        def do_request(self, *args, **kwargs):
            return oras.provider.Registry.do_request.__wrapped__(self, *args, **kwargs)

    return Registry
