"""The cache cannot be forged by recomputing a hash: every entry is sealed with the store's secret
key (pipeline.core.seal), and the gate refuses numbers no measurement can produce."""
from __future__ import annotations

import errno
import json
import multiprocessing
import os
import stat
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipeline.core import seal
from pipeline.core.artifact import content_digest, digest_files
from pipeline.config import HardwareConfig
from pipeline.core.errors import PipelineError
from pipeline.engine.runner import Runner


@dataclass(frozen=True)
class Bench:
    """A stage whose whole result is numbers, as the benchmark's."""
    speedup: float
    name = "measure"
    version = 1
    hardware_dependent = False

    def run(self, parent, out_dir: Path) -> dict:
        (out_dir / "latency.json").write_text("{}")
        return {"batches": {"8": {"speedup_vs_fastest_float": {
            "median": self.speedup, "ci95": [self.speedup - 0.03, self.speedup + 0.03]}}}}


def runner(workdir, logs=None):
    return Runner(workdir, HardwareConfig(), log=logs.append if logs is not None else print)


def forge(entry: Path, edit, keep_seal: bool = True) -> None:
    """What someone with write access to the cache does: edit the numbers, recompute the plain
    sha256 digest the entry is checked against, and write it back."""
    m = json.loads((entry / "artifact.json").read_text())
    edit(m["meta"])
    m["digest"] = content_digest(digest_files(entry), m["meta"])
    if not keep_seal:
        m.pop("hmac", None)  # as an entry made before entries were sealed
    (entry / "artifact.json").write_text(json.dumps(m))


def to_150(meta):
    meta["batches"]["8"]["speedup_vs_fastest_float"] = {"median": 150.0, "ci95": [150.0, 0.97]}


@pytest.mark.parametrize("keep_seal", [True, False], ids=["stale-seal", "no-seal"])
def test_a_forged_entry_with_a_recomputed_sha256_is_rebuilt_not_trusted(tmp_path, keep_seal):
    built = runner(tmp_path).run(Bench(0.9))
    forge(built.path, to_150, keep_seal)
    logs = []
    r = runner(tmp_path, logs)
    again = r.run(Bench(0.9))
    assert r.record[0]["reused"] is False, logs
    assert again.meta["batches"]["8"]["speedup_vs_fastest_float"]["median"] == 0.9
    said = [m for m in logs if "rebuilding" in m]
    assert len(said) == 1 and ("seal does not verify" if keep_seal else "not sealed") in said[0]
    # the forged entry is kept aside for inspection, never where a run would read it
    assert len(list((tmp_path / "cache" / "measure").glob(".corrupt-*"))) == 1
    assert runner(tmp_path).run(Bench(0.9)).digest == built.digest  # the rebuilt one is reused


def test_an_entry_sealed_with_another_cache_key_is_not_trusted(tmp_path):
    runner(tmp_path / "a").run(Bench(0.9))
    runner(tmp_path / "b").run(Bench(0.9))
    # b's entry, seal and all, copied over a's: its sha256s hold, its seal is b's
    entry = next((tmp_path / "a" / "cache" / "measure").iterdir())
    (entry / "artifact.json").write_bytes(
        (tmp_path / "b" / "cache" / "measure" / entry.name / "artifact.json").read_bytes())
    logs = []
    r = runner(tmp_path / "a", logs)
    r.run(Bench(0.9))
    assert r.record[0]["reused"] is False and any("seal does not verify" in m for m in logs)


def test_the_key_is_the_owners_alone_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        key = seal.store_key(tmp_path / "cache")
    finally:
        os.umask(old)
    path = tmp_path / "cache" / seal.KEY_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.stat().st_uid == os.getuid()
    assert len(key) == seal.KEY_BYTES and seal.store_key(tmp_path / "cache") == key
    assert not [p for p in path.parent.iterdir() if p.name != seal.KEY_FILE]  # no temp file left


@pytest.mark.parametrize("mode", [0o644, 0o620])
def test_a_key_others_can_read_or_change_is_refused(tmp_path, mode):
    seal.store_key(tmp_path)
    (tmp_path / seal.KEY_FILE).chmod(mode)
    with pytest.raises(PipelineError, match=f"mode {mode:04o}.*chmod 600"):
        seal.store_key(tmp_path)
    (tmp_path / seal.KEY_FILE).chmod(0o640)  # a group the owner chose to trust: accepted
    assert len(seal.store_key(tmp_path)) == seal.KEY_BYTES


def _race(folder, barrier, out, links):
    if not links:  # a filesystem without hard links: the key is written in place
        def no_link(*a, **k):
            raise OSError(errno.EPERM, "hard links not supported")
        os.link = no_link
    barrier.wait()
    out.put(seal.store_key(Path(folder)).hex())


@pytest.mark.parametrize("links", [True, False], ids=["link", "no-hard-links"])
def test_runs_racing_to_make_the_key_agree_on_one(tmp_path, links):
    ctx = multiprocessing.get_context("fork")
    n, rounds = 6, 5
    for i in range(rounds):
        barrier, out = ctx.Barrier(n), ctx.Queue()
        procs = [ctx.Process(target=_race, args=(tmp_path / str(i), barrier, out, links))
                 for _ in range(n)]
        for p in procs:
            p.start()
        keys = {out.get(timeout=60) for _ in procs}
        for p in procs:
            p.join()
        assert len(keys) == 1 and all(p.exitcode == 0 for p in procs), keys
        assert keys == {seal.store_key(tmp_path / str(i)).hex()}


def test_a_forged_benchmark_is_measured_again_and_never_published(tiny_run, tmp_path):
    """The reported hole, end to end: a cached benchmark's numbers edited, its sha256 recomputed,
    was reused and published. Here the forged p99 (0.5 us) would pass an SLO the real one fails,
    and every forged number is possible (only the seal can tell)."""
    from tests.conftest import run_cli
    from tests.faults import copy_of_tiny_run

    registry = tmp_path / "registry"
    # slo.p99_ms and the gate enter no cache key: every stage is reused but the forged one (the
    # tiny run judges no SLO, so that a busy machine cannot fail it: this run does)
    args = copy_of_tiny_run(tiny_run, tmp_path / "w", registry_root=str(registry),
                            **{"slo.p99_ms": "0.001", "gate.check_slo_p99": "true"})
    # the tiny run's own benchmark (other tests add entries to its cache)
    first = json.loads(Path(tiny_run[1].stdout.split("report: ")[-1].split()[0])
                       .with_name("report.json").read_text())
    built = next(Path(s["path"]) for s in first["stages"] if s["stage"] == "benchmark")
    entry = tmp_path / "w" / "cache" / "benchmark" / built.name

    def fast(meta):
        for at in meta["batches"].values():
            at["speedup_vs_fastest_float"] = {"median": 150.0, "ci95": [149.0, 151.0]}
            at["core_state"] = {}
            at["latency_ms"]["candidate"].update(p50=0.0005, p90=0.0005, p99=0.0005, p999=0.0005)

    forge(entry, fast)
    proc = run_cli(*args)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr  # measured again: too slow
    assert "seal does not verify" in proc.stdout, proc.stdout
    report = json.loads((tmp_path / "w" / "runs" / "latest" / "report.json").read_text())
    assert [s["reused"] for s in report["stages"] if s["stage"] == "benchmark"] == [False]
    assert sum(not s["reused"] for s in report["stages"]) == 1
    assert not report.get("published") and not (registry.exists() and any(registry.iterdir()))


@pytest.mark.parametrize("target", ["a key elsewhere", "nothing"])
def test_a_key_that_is_a_symbolic_link_is_refused_naming_it(tmp_path, target):
    """O_NOFOLLOW refused it with a bare ELOOP ("Too many levels of symbolic links")."""
    other = tmp_path / "other"
    if target != "nothing":
        seal.store_key(other)
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / seal.KEY_FILE).symlink_to(other / seal.KEY_FILE)
    with pytest.raises(PipelineError) as e:
        seal.store_key(tmp_path / "cache")
    assert str(e.value).startswith(f"cache key {tmp_path / 'cache' / seal.KEY_FILE} is a "
                                   f"symbolic link (to {other / seal.KEY_FILE})")
    assert "rm " in str(e.value) and "\n" not in str(e.value)


def test_a_deleted_key_is_said_once_and_its_entries_rebuilt_not_kept_aside_as_corrupt(tmp_path):
    """Deleting the key (docs/stages.md: every entry is then rebuilt) called each entry corrupt
    and kept each aside for a week."""
    runner(tmp_path).run(Bench(0.9))
    runner(tmp_path).run(Bench(0.8))
    (tmp_path / "cache" / seal.KEY_FILE).unlink()
    logs = []
    r = runner(tmp_path, logs)
    r.run(Bench(0.9))
    r.run(Bench(0.8))
    assert [s["reused"] for s in r.record] == [False, False]
    said = [m for m in logs if "!" in m]
    assert len(said) == 1 and "was made by this run (the old one was deleted or replaced)" in \
        said[0], logs
    assert not any("corrupt" in m for m in logs)
    assert not list((tmp_path / "cache" / "measure").glob(".corrupt-*"))
    again = runner(tmp_path)
    again.run(Bench(0.9))
    assert again.record[0]["reused"] is True  # sealed with the new key: trusted


def test_the_cache_folders_are_not_writable_by_every_user_whatever_the_umask(tmp_path):
    """Under umask 000 the cache, its stage folders and entries were 0777 (anyone could put a
    key of their own there) while the key's own mode was checked."""
    old = os.umask(0)
    try:
        built = runner(tmp_path / "w").run(Bench(0.9))
    finally:
        os.umask(old)
    made = [tmp_path / "w", tmp_path / "w" / "cache", built.path.parent, built.path]
    assert [oct(stat.S_IMODE(p.stat().st_mode) & 0o002) for p in made] == ["0o0"] * 4
    assert stat.S_IMODE(built.path.stat().st_mode) == 0o775  # the group keeps what umask gave
