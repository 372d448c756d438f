"""Pruning through the real command line on the tiny network, sharing the session run's cache:
the pruned network goes through export and every later stage, ``prune=none`` changes no stage
key, and a bad ``prune.*`` value ends with one line before anything is built."""
from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from pipeline.core.env import training_precision
from tests.conftest import run_cli, tiny_args

FAST = ["prune=channels", "prune.ratio=0.5", "prune.round_to=4", "prune.recover_steps=3",
        "prune.recover_batch_size=4", "prune.eval_samples=8"]


def sharing_cache(fixture_workdir: Path, workdir: Path, *extra: str) -> list[str]:
    """The session run's arguments with its cache (and data) but reports of our own, so the
    session's ``runs/latest`` stays what the other tests read."""
    workdir.mkdir(exist_ok=True)
    (workdir / "cache").symlink_to(fixture_workdir / "cache")
    own = (f"workdir={workdir}", f"registry.root={workdir / 'registry'}")
    return [a for a in tiny_args(fixture_workdir) if not a.startswith(("workdir=", "registry.root="))
            ] + list(own) + list(extra)


def report(workdir: Path) -> dict:
    return json.loads((workdir / "runs" / "latest" / "report.json").read_text())


def test_prune_none_keeps_every_stage_key(tiny_run, tmp_path):
    fixture, _ = tiny_run
    proc = run_cli(*sharing_cache(fixture, tmp_path / "none", "prune=none"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    stages = report(tmp_path / "none")["stages"]
    assert stages and all(s["reused"] for s in stages), [s for s in stages if not s["reused"]]
    assert "prune" not in {s["stage"] for s in stages}


def test_pruned_network_flows_through_export_and_every_later_stage(tiny_run, tmp_path):
    fixture, _ = tiny_run
    workdir = tmp_path / "pruned"
    proc = run_cli(*sharing_cache(fixture, workdir, *FAST, "quant=none"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "recovery [" in proc.stdout
    rep = report(workdir)
    by_label = {s["label"]: s for s in rep["stages"]}
    assert by_label["load"]["reused"] and by_label["export[unpruned]"]["reused"]
    assert not by_label["prune"]["reused"] and not by_label["export"]["reused"]
    assert rep["lineage"]["source"]["stage"] == "prune"
    assert rep["lineage"]["export"]["parent"] == by_label["prune"]["digest"]
    assert rep["lineage"]["unpruned"]["digest"] == by_label["load"]["digest"]

    net = json.loads((Path(by_label["prune"]["path"]) / "net.json").read_text())["params"]
    assert net["widths"] == [8, 4, 8, 8, 8, 8]
    model = onnx.load(str(Path(rep["lineage"]["export"]["path"]) / "model.onnx"))
    conv_out = sorted(i.dims[0] for i in model.graph.initializer if len(i.dims) == 4)
    assert conv_out == sorted(net["widths"])  # the ONNX graph carries the smaller convs
    export_meta = json.loads((Path(rep["lineage"]["export"]["path"]) / "artifact.json").read_text())
    assert export_meta["meta"]["parity_vs_torch"]["decoded_agreement"] == 1.0

    section = rep["pruning"]
    assert [r["step"].split(" ")[0] for r in section["rows"]] == ["load", "prune", "recovery"]
    unpruned, pruned, recovered = section["rows"]
    assert pruned["parameters"] < unpruned["parameters"] and pruned["macs"] < unpruned["macs"]
    assert pruned["onnx_mb"] < unpruned["onnx_mb"]
    assert recovered["parameters"] == pruned["parameters"]
    assert section["recover"]["steps"] == 3 and section["recover"]["seconds"] > 0
    assert section["recover"]["precision"] == training_precision()["dtype"]
    assert section["recover"]["steps_per_second"] > 0
    # the section is a typed record written key for key: it reads back whole, and the manifest
    # that ships with the model carries the same one
    from pipeline.core.json_record import from_json, to_json
    from pipeline.prune.report import PruningSection

    typed = from_json(PruningSection, section)
    assert to_json(typed) == section and typed.rows[2].metrics == recovered_metrics(section)
    manifest = next(m for m in map(_json, (workdir / "registry" / "blobs").glob("*/*"))
                    if isinstance(m, dict) and "lineage" in m)  # the evidence blob
    assert manifest["pruning"] == section
    md = (workdir / "runs" / "latest" / "report.md").read_text()
    assert "## Pruning" in md and "before recovery" in md


def _json(path: Path):
    try:
        return json.loads(path.read_bytes())
    except (UnicodeDecodeError, ValueError):
        return None


def recovered_metrics(section: dict) -> dict:
    """The recovered row's held-out metrics: every key beside the row's own four."""
    return {k: v for k, v in section["rows"][2].items()
            if k not in ("step", "parameters", "macs", "onnx_mb")}


@pytest.mark.parametrize("extra,needle", [
    (["prune=channels"], "would remove every channel of cnn.4 (8 -> 0), cnn.8 (16 -> 0)"),
    (["prune=channels", "prune.ignored=[cnn.0,conv9]"], "valid names: cnn.0, cnn.4"),
])
def test_bad_prune_values_end_with_one_line_before_any_stage(tmp_path, extra, needle):
    proc = run_cli(*tiny_args(tmp_path, *extra))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], proc.stderr
    assert not (tmp_path / "cache").exists(), "nothing may run before the refusal"
