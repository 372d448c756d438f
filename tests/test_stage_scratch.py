"""Every scratch file of a stage (a profile, an augmented model, a library's temporary file)
lives inside the stage's own temporary output folder, and is gone before the output is hashed:
nothing is written beside a parent's artifact, and a full disk never leaves a truncated file in
someone else's cache folder."""
from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pipeline.core.artifact import Artifact
from pipeline.config import HardwareConfig
from pipeline.engine.runner import Runner
from tests.conftest import session_run, tiny_args
from tests.faults import tmpfs


@dataclass(frozen=True)
class UsesTemp:
    name = "temp"
    version = 1
    hardware_dependent = False

    def run(self, parent, out_dir: Path) -> dict:
        with tempfile.NamedTemporaryFile(delete=False, suffix=".scratch") as f:
            f.write(b"scratch")
        (out_dir / "out.txt").write_text("result")
        return {"scratch": f.name, "out_dir": str(out_dir)}


def test_tempfiles_go_inside_the_stage_folder_and_are_removed(tmp_path):
    art = Runner(tmp_path, HardwareConfig(), log=lambda m: None).run(UsesTemp())
    scratch = Path(art.meta["scratch"])
    assert scratch.is_relative_to(art.meta["out_dir"])
    assert not scratch.exists() and art.files.keys() == {"out.txt"}
    assert sorted(p.name for p in (tmp_path / "cache" / "temp").iterdir()) == [art.key]


def test_explain_writes_nothing_beside_its_parent(tiny_run, tmp_path):
    """The parent artifacts lie on a read-only filesystem: a stage that writes next to them (as
    explain's profiler did, into the parent's cache folder) fails; one that keeps to its own
    folder runs."""
    from pipeline.engine.compose import compose
    from pipeline.models import task
    from pipeline.stages.explain import Explain

    workdir = tiny_run[0]
    cfg = compose(tiny_args(workdir))
    report = json.loads((session_run(tiny_run) / "report.json").read_text())
    lineage, stages = report["lineage"], report["stages"]
    quantized = Path(next(s["path"] for s in stages if s["label"] == "quantize"))
    with tmpfs(tmp_path / "ro", size="16m") as ro:
        parents = {}
        for role, src in (("quantize", quantized), ("fp32", Path(lineage["fp32"]["path"]))):
            (ro / role).mkdir()
            shutil.copytree(src, ro / role / src.name)
            parents[role] = Artifact.read(ro / role / src.name)
        subprocess.run(["mount", "-o", "remount,ro", str(ro)], check=True)
        split = task(cfg.model.source).split("evaluation", cfg.model.eval_samples, cfg.data_dir)
        stage = Explain(split, cfg.gate.speedup_batch_size, 2, cfg.hardware.target())
        art = Runner(tmp_path / "w", cfg.hardware.target(), log=lambda m: None).run(
            stage, parents["quantize"], fp32=parents["fp32"])
        assert art.meta["nodes"] and art.files.keys() == {"explain.json"}
