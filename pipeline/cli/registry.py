"""``python -m pipeline.registry COMMAND [args] [overrides]``: list, show, pull, verify, promote,
gc and export-triton, on the registry that ``conf/registry`` and overrides select.

    list [NAME] [--json]                      versions, their gate verdict and aliases
    show NAME[:REF|@sha256:...] [--json]      one version's manifest and evidence (all: no REF)
    pull NAME:REF [--out DIR] [--force]       files re-hashed, then renamed into DIR (a folder
                                              that is not an earlier pull of NAME is refused;
                                              --force moves its contents aside, never deletes)
    verify [NAME]                             re-hash every manifest and blob
    promote NAME:REF ALIAS [--force] [--reason TEXT]   move candidate/production
    gc                                        local store: drop unreferenced blobs and temp files
    export-triton NAME:REF [--out DIR] [--max-batch-size N] [--instances N] [--kind KIND]
                  [--triton-version N] [--force]     Triton model repository entry

REF is a version (``int8-0123abcd...``), an alias (``candidate``, ``production``) or a digest.
Overrides are Hydra's (``registry=oci registry.url=http://127.0.0.1:5000``). Exit codes: 0 done,
1 promotion refused (gate failed), 2 bad arguments or config, 3 registry error or corrupt blob.
Errors are one line on stderr, without a traceback.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pipeline.cli.args import Parser
from pipeline.core.errors import ConfigError, cli


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    overrides = [a for a in argv if _is_override(a)]
    args = [a for a in argv if a not in overrides]
    if not args:
        print(__doc__)
        return 0

    def run(args):
        ns = _parser().parse_args(args)
        return ns.run(ns, _backend(overrides))
    # the shared shell: one line for our errors and for OS errors (a store we may not write)
    return cli(run, args, __doc__)


def _is_override(arg: str) -> bool:
    """``registry=oci``, ``registry.url=...``: a Hydra override of a top-level config key."""
    from pipeline.config import Config

    key = arg.split("=", 1)[0].lstrip("~+") if "=" in arg and not arg.startswith("-") else ""
    return key.split(".")[0] in Config.__dataclass_fields__


def _backend(overrides: list[str]):
    from pipeline.engine.compose import compose
    from pipeline.registry import open_backend

    cfg = compose(overrides).registry
    if cfg is None:
        raise ConfigError("registry=null: there is no registry to talk to")
    return open_backend(cfg)


def _list(ns, backend) -> int:
    entries = backend.versions(ns.name)
    if ns.json:
        print(json.dumps([e.to_json() for e in entries], indent=2))
    else:
        for e in entries:
            print(e.line())
        if not entries:
            print("no versions")
    return 0


def _show(ns, backend) -> int:
    from pipeline.registry.names import parse_ref
    from pipeline.registry.package import evidence_from_annotations

    name, ref = parse_ref(ns.ref)
    if ref is None:
        return _list(argparse.Namespace(name=name, json=ns.json), backend)
    entry = backend.resolve(name, ref)
    manifest, _ = backend.manifest(entry)  # re-hashed against the digest
    body = {**entry.to_json(), "manifest": manifest,
            "evidence": evidence_from_annotations(manifest)}
    if ns.json:
        print(json.dumps(body, indent=2, sort_keys=True))
    else:
        print(entry.line())
        ev = body["evidence"]
        for key in ("gate.summary", "metrics", "calibration_set", "evaluation_set", "tools"):
            if key in ev:
                print(f"  {key}: {json.dumps(ev[key], sort_keys=True)}")
        for blob in [manifest["config"], *manifest["layers"]]:
            title = (blob.get("annotations") or {}).get("org.opencontainers.image.title", "")
            print(f"  blob {blob['digest']} {blob['size']:>10} {title or blob['mediaType']}")
    return 0


def _pull(ns, backend) -> int:
    from pipeline.registry.names import parse_ref

    name, ref = parse_ref(ns.ref)
    out = Path(ns.out) if ns.out else Path("artifacts/pulled") / f"{name}-{ref or ''}".replace(
        ":", "-")
    entry, path = backend.pull(name, ref, out, force=ns.force)
    print(f"pulled {entry.name}:{entry.version}@{entry.digest} into {path} (every blob re-hashed)")
    return 0


def _verify(ns, backend) -> int:
    from pipeline.core.errors import CorruptBlob

    count, problems = backend.verify(ns.name)
    for p in problems:
        print(p)
    if problems:
        raise CorruptBlob(f"verify: {len(problems)} problem(s) in {count} version(s); the first: "
                          f"{problems[0]}")
    print(f"verified {count} version(s): every manifest and blob matches its digest")
    return 0


def _promote(ns, backend) -> int:
    from pipeline.registry.names import parse_ref

    name, ref = parse_ref(ns.ref)
    if ref is None:
        raise ConfigError("promote: give NAME:VERSION (or NAME@sha256:...)")
    entry = backend.promote(name, ref, ns.alias, force=ns.force, reason=ns.reason)
    forced = " (forced: its gate did not pass)" if ns.force and not entry.passed else ""
    print(f"{name}:{ns.alias} -> {entry.version}@{entry.digest}{forced}")
    return 0


def _gc(ns, backend) -> int:
    stats = backend.gc()
    print(f"gc: removed {stats['removed_blobs']} blob(s) ({stats['freed_bytes']} bytes) and "
          f"{stats['removed_temp']} temporary file(s); {stats['kept_blobs']} blob(s) kept")
    return 0


def _export_triton(ns, backend) -> int:
    import tempfile

    from pipeline.core.errors import PromotionRefused
    from pipeline.registry import triton
    from pipeline.registry.names import parse_ref

    name, ref = parse_ref(ns.ref)
    if ref is None:
        raise ConfigError("export-triton: give NAME:REF, e.g. ocr:production")
    entry = backend.resolve(name, ref)
    if not entry.passed and not ns.force:  # deploying is promoting: the same rule holds
        raise PromotionRefused(f"{name}:{entry.version}: its gate did not pass; not exported "
                               "(--force overrides)")
    with tempfile.TemporaryDirectory(prefix="triton-pull-") as tmp:
        entry, pulled = backend.pull(name, entry.digest, Path(tmp) / "pulled")
        path = triton.export(pulled, name, Path(ns.out), entry.version, entry.digest,
                             max_batch_size=ns.max_batch_size, instances=ns.instances,
                             kind=ns.kind, version=ns.triton_version)
    print(f"exported {name}:{entry.version}@{entry.digest} to {path}")
    return 0


def _parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m pipeline.registry", add_help=False)
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    c = sub.add_parser("list")
    c.add_argument("name", nargs="?")
    c.add_argument("--json", action="store_true")
    c.set_defaults(run=_list)
    c = sub.add_parser("show")
    c.add_argument("ref")
    c.add_argument("--json", action="store_true")
    c.set_defaults(run=_show)
    c = sub.add_parser("pull")
    c.add_argument("ref")
    c.add_argument("--out")
    c.add_argument("--force", action="store_true")  # a non-empty folder is moved aside, not lost
    c.set_defaults(run=_pull)
    c = sub.add_parser("verify")
    c.add_argument("name", nargs="?")
    c.set_defaults(run=_verify)
    c = sub.add_parser("promote")
    c.add_argument("ref")
    c.add_argument("alias")
    c.add_argument("--force", action="store_true")
    c.add_argument("--reason", default="")
    c.set_defaults(run=_promote)
    c = sub.add_parser("gc")
    c.set_defaults(run=_gc)
    c = sub.add_parser("export-triton")
    c.add_argument("ref")
    c.add_argument("--out", default="model_repository")
    c.add_argument("--max-batch-size", type=int, default=None)
    c.add_argument("--instances", type=int, default=1)
    c.add_argument("--kind", default="KIND_CPU")
    c.add_argument("--triton-version", type=int, default=None)
    c.add_argument("--force", action="store_true")
    c.set_defaults(run=_export_triton)
    return p


if __name__ == "__main__":
    raise SystemExit(main())
