"""The MLflow backend: one run per published version, registered in MLflow's model registry.

In: a ``Package`` and ``registry.url`` (a tracking server) / ``registry.repository`` (the
experiment). Out: a run holding ``model/model.onnx``, ``model/manifest.json`` (the evidence) and
``model/oci-manifest.json`` (the same manifest bytes as the other backends), the flattened config
as params, accuracy and latency as metrics and the gate verdict as tags; then a model version of
``<repository>.<model>`` whose tags keep what MLflow does not: ``sha256`` of the model,
``manifest_digest`` and our version name. MLflow's own version numbers (1, 2, ...) are refs too.
Aliases (``candidate``, ``production``) are MLflow aliases, set only by ``promote``; a forced
promotion is recorded as a version tag. A pull downloads the version's files and re-hashes them
against the manifest, and the manifest against the digest the registry holds: the artifact store is
not trusted. ``mlflow`` is imported here only. Credentials: MLflow's own ``MLFLOW_TRACKING_*``
variables, else ``credentials.py`` (environment or netrc). Not handled: Databricks/Unity Catalog
names, deleting versions, gc (MLflow's ``mlflow gc`` does it).
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

from pipeline.core.errors import RegistryError
from pipeline.registry import credentials, transfer
from pipeline.registry.backend import Entry, Published
from pipeline.registry.names import ALIASES, check_alias, check_name
from pipeline.registry.package import (EVIDENCE_FILE, MODEL_FILE, P, Package, canonical,
                                       check_promotable, parse)

OCI_MANIFEST = "oci-manifest.json"
VERSION_TAG, DIGEST_TAG, SHA_TAG, GATE_TAG = "pipeline_version", "manifest_digest", "sha256", \
    "gate_passed"


class MlflowRegistry:
    kind = "mlflow"

    def __init__(self, cfg):
        self.url = cfg.url.rstrip("/")
        self.experiment = cfg.repository
        self.prefix = cfg.repository.replace("/", ".")
        self.timeout = cfg.timeout_s
        parts = urlsplit(self.url)
        if not any(os.environ.get(f"MLFLOW_TRACKING_{k}") for k in ("USERNAME", "TOKEN")):
            creds = credentials.lookup(parts.hostname, parts.port)
            if creds:  # MLflow reads its credentials from these variables, in this process only
                os.environ["MLFLOW_TRACKING_USERNAME"], os.environ["MLFLOW_TRACKING_PASSWORD"] = \
                    creds
        # MLflow's default is 7 retries with exponential backoff: minutes against a dead server.
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(int(self.timeout)))
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        logging.getLogger("mlflow").setLevel(logging.WARNING)  # keep our one-line output readable
        self._client = None

    # --- writing -------------------------------------------------------------------------------
    def push(self, pkg: Package) -> Published:
        client, model = self._c(), self._model(pkg.name)
        existing = self._find(model, VERSION_TAG, pkg.version)
        if existing is not None:  # never rewritten: re-hash the stored one instead
            problems = self._verify_version(pkg.name, existing)
            if problems:
                raise RegistryError(problems[0])
            return Published(self.kind, pkg.name, pkg.version, existing.tags[DIGEST_TAG],
                             f"{self.url} model {model} v{existing.version}", existed=True)
        run_id = self._log_run(pkg)
        source = f"{client.get_run(run_id).info.artifact_uri}/model"
        self._call(client.create_registered_model, model, _exists_ok=True)
        mv = self._call(client.create_model_version, model, source, run_id=run_id,
                        tags={VERSION_TAG: pkg.version, DIGEST_TAG: pkg.digest,
                              SHA_TAG: pkg.blobs[1].digest.split(":", 1)[1],
                              GATE_TAG: "true" if pkg.passed else "false"},
                        description=pkg.manifest["annotations"].get(f"{P}gate.summary", ""))
        return Published(self.kind, pkg.name, pkg.version, pkg.digest,
                         f"{self.url} model {model} v{mv.version}")

    def promote(self, name: str, ref: str, alias: str, force: bool = False,
                reason: str = "") -> Entry:
        check_alias(alias)
        client, model = self._c(), self._model(name)
        mv = self._version(name, ref)
        entry = self._entry(name, mv)
        manifest, _ = self.manifest(entry)
        check_promotable(manifest, name, entry.version, alias, force)
        previous = self._call(client.get_registered_model, model).aliases.get(alias)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        for key, value in {"forced": "true" if force else "false", "at": stamp,
                           "previous": previous or "", "reason": reason}.items():
            self._call(client.set_model_version_tag, model, mv.version,
                       f"promotion.{alias}.{key}", value)
        self._call(client.set_registered_model_alias, model, alias, mv.version)
        return self.resolve(name, alias)

    def gc(self) -> dict:
        raise RegistryError("gc works on the local store; MLflow removes deleted runs with "
                            "`mlflow gc`")

    # --- reading -------------------------------------------------------------------------------
    def versions(self, name: str | None = None) -> list[Entry]:
        client = self._c()
        if name:
            names = [check_name(name)]
        else:
            found = self._call(client.search_registered_models,
                               filter_string=f"name LIKE '{self.prefix}.%'")
            names = [m.name[len(self.prefix) + 1:] for m in found]
        out = []
        for n in names:
            aliases = self._call(client.get_registered_model, self._model(n)).aliases or {}
            for mv in self._search(self._model(n)):
                if VERSION_TAG in mv.tags:
                    out.append(self._entry(n, mv, aliases))
        return sorted(out, key=lambda e: (e.name, e.created))

    def resolve(self, name: str, ref: str | None) -> Entry:
        return self._entry(name, self._version(name, ref))

    def manifest(self, entry: Entry) -> tuple[dict, bytes]:
        with tempfile.TemporaryDirectory(prefix="mlflow-manifest-") as tmp:
            mv = self._version(entry.name, entry.digest)
            path = self._download(mv, f"model/{OCI_MANIFEST}", Path(tmp))
            data = path.read_bytes()
        return parse(data, entry.digest, f"{self.url} {self._model(entry.name)} "
                                         f"v{mv.version}"), data

    def pull(self, name: str, ref: str | None, dest: Path, force: bool = False
             ) -> tuple[Entry, Path]:
        mv = self._version(name, ref)
        entry = self._entry(name, mv)
        with tempfile.TemporaryDirectory(prefix="mlflow-pull-") as tmp:
            folder = self._download(mv, "model", Path(tmp))
            where = f"{self.url} {self._model(name)} v{mv.version}"
            if not (folder / OCI_MANIFEST).is_file():
                raise RegistryError(f"{where}: {OCI_MANIFEST} is missing from its artifacts")
            data = (folder / OCI_MANIFEST).read_bytes()
            manifest = parse(data, entry.digest, where)
            return entry, transfer.pull_into(dest, where, manifest, data, _opener(folder, where),
                                             force=force)

    def verify(self, name: str | None = None) -> tuple[int, list[str]]:
        entries = self.versions(name)
        problems = []
        for e in entries:
            problems += self._verify_version(e.name, self._version(e.name, e.digest))
        return len(entries), problems

    # --- internals -----------------------------------------------------------------------------
    def _c(self):
        if self._client is None:
            import requests

            try:
                requests.get(f"{self.url}/health", timeout=self.timeout).raise_for_status()
            except requests.RequestException as e:
                raise RegistryError(f"MLflow server {self.url} unreachable "
                                    f"({type(e).__name__})") from None
            from mlflow import MlflowClient

            self._client = MlflowClient(tracking_uri=self.url, registry_uri=self.url)
        return self._client

    def _call(self, fn, *args, _exists_ok: bool = False, **kwargs):
        """One MLflow call, its errors as one line (``_exists_ok``: 'already exists' is fine)."""
        from mlflow.exceptions import MlflowException

        try:
            return fn(*args, **kwargs)
        except MlflowException as e:
            if _exists_ok and e.error_code == "RESOURCE_ALREADY_EXISTS":
                return None
            raise RegistryError(f"MLflow server {self.url}: {fn.__name__} failed ({e.error_code}: "
                                f"{str(e.message).splitlines()[0][:200]})") from None

    def _model(self, name: str) -> str:
        return f"{self.prefix}.{check_name(name)}"

    def _search(self, model: str, extra: str = ""):
        return self._call(self._c().search_model_versions, f"name = '{model}'{extra}",
                          max_results=10000)

    def _find(self, model: str, tag: str, value: str):
        hits = self._search(model, f" and tags.{tag} = '{value}'")
        return hits[0] if hits else None

    def _version(self, name: str, ref: str | None):
        client, model = self._c(), self._model(name)
        if ref is None:
            versions = [e.version for e in self.versions(name)]
            raise RegistryError(f"{name}: give a version, an alias ({', '.join(ALIASES)}) or "
                                f"@sha256:...; versions: {', '.join(versions) or 'none'}")
        if ref in ALIASES:
            from mlflow.exceptions import MlflowException

            try:
                return client.get_model_version_by_alias(model, ref)
            except MlflowException:
                raise RegistryError(f"{name}:{ref}: no version of {model} has been promoted to "
                                    f"{ref} on {self.url}") from None
        if ref.isdigit():  # MLflow's own version number
            return self._call(client.get_model_version, model, ref)
        mv = self._find(model, DIGEST_TAG if ref.startswith("sha256:") else VERSION_TAG, ref)
        if mv is None:
            raise RegistryError(f"{name}:{ref}: not found in {model} on {self.url}")
        return mv

    def _entry(self, name: str, mv, aliases: dict | None = None) -> Entry:
        """``aliases``: the registered model's alias -> version map (fetched when not given)."""
        tags = mv.tags or {}
        if aliases is None:
            aliases = self._call(self._c().get_registered_model, self._model(name)).aliases or {}
        aliases = {a: tags.get(f"promotion.{a}.forced") == "true"
                   for a, v in aliases.items() if str(v) == str(mv.version)}
        created = time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                time.gmtime((mv.creation_timestamp or 0) / 1000))
        return Entry(name, tags.get(VERSION_TAG, f"v{mv.version}"), tags.get(DIGEST_TAG, ""), 0,
                     tags.get(GATE_TAG) == "true", created, aliases)

    def _download(self, mv, path: str, dest: Path) -> Path:
        import mlflow.artifacts
        from mlflow.exceptions import MlflowException

        uri = mv.source if path == "model" else f"{mv.source}/{path.split('/', 1)[1]}"
        try:
            return Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(dest),
                                                            tracking_uri=self.url))
        except (MlflowException, OSError) as e:
            raise RegistryError(f"MLflow server {self.url}: cannot download {path} of "
                                f"{mv.name} v{mv.version} ({str(e).splitlines()[0][:200]})"
                                ) from None

    def _verify_version(self, name: str, mv) -> list[str]:
        entry = self._entry(name, mv)
        with tempfile.TemporaryDirectory(prefix="mlflow-verify-") as tmp:
            try:
                self.pull(name, entry.digest, Path(tmp) / "pulled")
            except RegistryError as e:
                return [str(e)]
        return []

    def _log_run(self, pkg: Package) -> str:
        from mlflow.entities import Metric, Param, RunTag

        client = self._c()
        exp = self._call(client.get_experiment_by_name, self.experiment)
        exp_id = exp.experiment_id if exp else self._call(
            client.create_experiment, self.experiment, _exists_ok=True)
        if exp_id is None:  # created by a concurrent publisher in between
            exp_id = self._call(client.get_experiment_by_name, self.experiment).experiment_id
        evidence = pkg.blobs[0].data
        body = json.loads(evidence)
        verdict = body.get("verdict") or {}
        run = self._call(client.create_run, exp_id, run_name=f"{pkg.name}-{pkg.version}")
        run_id = run.info.run_id
        try:
            with tempfile.TemporaryDirectory(prefix="mlflow-push-") as tmp:
                folder = Path(tmp) / "model"
                folder.mkdir()
                shutil.copyfile(pkg.blobs[1].path, folder / MODEL_FILE)
                (folder / EVIDENCE_FILE).write_bytes(evidence)
                (folder / OCI_MANIFEST).write_bytes(pkg.manifest_bytes)
                self._call(client.log_artifacts, run_id, str(folder), "model")
            now = int(time.time() * 1000)
            params = [Param(k[:250], str(v)[:6000])  # MLflow's key and value limits
                      for k, v in _flat(body.get("config") or {}).items()]
            metrics = [Metric(k[:250], float(v), now, 0) for k, v in
                       _flat({"metrics": body.get("metrics") or {},
                              "latency": body.get("latency") or {}}).items()
                       if _number(v)]
            tags = {"pipeline.name": pkg.name, "pipeline.version": pkg.version,
                    "pipeline.manifest_digest": pkg.digest,
                    "gate.passed": "true" if pkg.passed else "false",
                    "gate.summary": str(verdict.get("summary", "no verdict"))[:5000],
                    **{f"tools.{k}": str(v) for k, v in
                       ((body.get("environment") or {}).get("tools") or {}).items()},
                    **{f"{k}.digest": _digest(body.get(k))
                       for k in ("calibration_set", "evaluation_set") if body.get(k)}}
            for i in range(0, len(params), 100):
                self._call(client.log_batch, run_id, params=params[i:i + 100])
            self._call(client.log_batch, run_id, metrics=metrics[:1000],
                       tags=[RunTag(k, v) for k, v in tags.items()])
        except BaseException:
            client.set_terminated(run_id, "FAILED")
            raise
        with contextlib.redirect_stdout(sys.stderr):  # MLflow prints the run's URL here
            client.set_terminated(run_id, "FINISHED")
        return run_id


def _opener(folder: Path, where: str):
    def open_blob(blob):
        path = folder / (blob.title or "")
        if not blob.title or not path.is_file():
            raise RegistryError(f"blob {blob.digest} ({blob.title or blob.media_type}) of "
                                f"{where} is missing from its artifacts")
        return open(path, "rb")
    return open_blob


def _flat(tree, prefix: str = "") -> dict[str, str]:
    """Nested dicts as ``a.b.c`` keys; MLflow allows letters, digits and ``_-. /:`` in names."""
    out = {}
    for key, value in (tree.items() if isinstance(tree, dict) else []):
        name = "".join(c if c.isalnum() or c in "_-. /:" else "_" for c in f"{prefix}{key}")
        if isinstance(value, dict):
            out.update(_flat(value, f"{name}."))
        elif _number(value):
            out[name] = value
        else:
            out[name] = value if isinstance(value, str) else canonical(value).decode()
    return out


def _digest(value) -> str:
    """A data set's digest: the evidence holds it as a string, or as a dict with a digest."""
    return str(value.get("digest", "")) if isinstance(value, dict) else str(value)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
