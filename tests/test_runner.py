"""The runner: cache keys, reuse, atomic writes, corrupt entries, crash isolation."""
from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipeline.config import HardwareConfig
from pipeline.core.errors import StageError
from pipeline.engine.runner import Runner


@dataclass(frozen=True)
class Write:
    text: str
    name = "write"
    version = 1
    hardware_dependent = False

    def run(self, parent, out_dir: Path) -> dict:
        prefix = (parent.path / "out.txt").read_text() if parent else ""
        (out_dir / "out.txt").write_text(prefix + self.text)
        return {"length": len(prefix + self.text)}


@dataclass(frozen=True)
class Fail:
    how: str
    name = "fail"
    version = 1
    hardware_dependent = False

    def run(self, parent, out_dir: Path) -> dict:
        (out_dir / "half.txt").write_text("half")
        if self.how == "segfault":
            os.kill(os.getpid(), signal.SIGSEGV)
        raise ValueError("broken input")


def runner(tmp_path, logs=None):
    return Runner(tmp_path, HardwareConfig(), log=(logs.append if logs is not None else lambda m: None))


def test_second_run_reuses_and_change_reruns_only_downstream(tmp_path):
    r1 = runner(tmp_path)
    a = r1.run(Write("a"))
    b = r1.run(Write("b"), a)
    assert (b.path / "out.txt").read_text() == "ab" and b.meta == {"length": 2}
    assert len(a.key) == 64 and b.parent == a.digest

    r2 = runner(tmp_path)
    a2, b2 = r2.run(Write("a")), None
    b2 = r2.run(Write("b"), a2)
    assert [s["reused"] for s in r2.record] == [True, True] and b2.path == b.path

    r3 = runner(tmp_path)
    a3 = r3.run(Write("a"))
    c3 = r3.run(Write("c"), a3)
    assert [s["reused"] for s in r3.record] == [True, False]
    assert (c3.path / "out.txt").read_text() == "ac"


def test_failing_stage_leaves_nothing_behind(tmp_path):
    with pytest.raises(StageError, match="ValueError: broken input"):
        runner(tmp_path).run(Fail("raise"))
    assert list((tmp_path / "cache" / "fail").iterdir()) == []


def test_segfault_becomes_a_stage_error(tmp_path):
    with pytest.raises(StageError, match="SIGSEGV"):
        runner(tmp_path).run(Fail("segfault"))
    assert list((tmp_path / "cache" / "fail").iterdir()) == []


def test_corrupt_cache_entry_is_rebuilt_not_trusted(tmp_path):
    a = runner(tmp_path).run(Write("a"))
    (a.path / "out.txt").write_text("tampered")
    logs = []
    r = runner(tmp_path, logs)
    again = r.run(Write("a"))
    assert (again.path / "out.txt").read_text() == "a"
    assert r.record[0]["reused"] is False
    assert any("corrupt" in m for m in logs)


def test_hardware_enters_the_key_only_of_hardware_dependent_stages(tmp_path):
    @dataclass(frozen=True)
    class Measure(Write):
        hardware_dependent = True

    r1 = Runner(tmp_path, HardwareConfig(intra_op_threads=2), log=lambda m: None)
    r2 = Runner(tmp_path, HardwareConfig(intra_op_threads=1), log=lambda m: None)
    assert r1.key(Write("x"), None, {}) == r2.key(Write("x"), None, {})
    assert r1.key(Measure("x"), None, {}) != r2.key(Measure("x"), None, {})


@dataclass(frozen=True)
class Measure:
    """A stage whose whole result is metadata (like the benchmark): no files at all."""
    speedup: float
    name = "measure"
    version = 1
    hardware_dependent = False

    def run(self, parent, out_dir: Path) -> dict:
        return {"speedup": self.speedup, "by_batch": {8: [self.speedup]}}


def test_edited_metadata_is_corrupt_and_rebuilt_not_trusted(tmp_path):
    import json

    a = runner(tmp_path).run(Measure(0.9))
    manifest = json.loads((a.path / "artifact.json").read_text())
    manifest["meta"]["speedup"] = 100.0  # one cached number edited by hand
    (a.path / "artifact.json").write_text(json.dumps(manifest))
    logs = []
    r = runner(tmp_path, logs)
    again = r.run(Measure(0.9))
    assert again.meta["speedup"] == 0.9 and r.record[0]["reused"] is False
    assert any("corrupt" in m and "metadata" in m for m in logs), logs
    assert runner(tmp_path).run(Measure(0.9)).digest == a.digest  # and then reused as before


def test_an_artifact_without_files_has_a_digest_of_its_own_content(tmp_path):
    r = runner(tmp_path)
    slow, fast = r.run(Measure(0.9)), r.run(Measure(2.0))
    assert slow.files == fast.files == {}
    assert slow.digest != fast.digest
    # built and read back give the same digest (int keys become str keys in artifact.json)
    assert runner(tmp_path).run(Measure(0.9)).digest == slow.digest


@dataclass(frozen=True)
class Stamp:
    """Same bytes, other numbers: the model a stage writes does not depend on ``note``."""
    note: float
    name = "stamp"
    version = 1
    hardware_dependent = False

    def run(self, parent, out_dir: Path) -> dict:
        (out_dir / "model.onnx").write_bytes(b"the same model")
        return {"measured": self.note}


def test_a_published_version_is_named_by_the_files_not_the_numbers(tmp_path):
    from pipeline.config import RegistryConfig
    from pipeline.registry import publish

    r = runner(tmp_path)
    a, b = r.run(Stamp(1.0)), r.run(Stamp(2.0))
    assert a.digest != b.digest and a.files_digest == b.files_digest
    cfg = RegistryConfig(root=str(tmp_path / "registry"))
    first = publish(cfg, "ocr", "int8", a, {"verdict": {"passed": True}})
    second = publish(cfg, "ocr", "int8", b, {"verdict": {"passed": True}})
    assert first.version == second.version == f"int8-{a.files_digest[:16]}"
