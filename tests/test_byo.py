"""Bring your own model: the three ways in, end to end, on a small classifier trained in seconds.

The same network (``tests.byo_net``) arrives as a torch factory plus a safetensors checkpoint, and
as an ONNX file only (opset 12: the pipeline upgrades it); its data is an image folder with
labels, or a flat folder without (a label-free run scored by agreement with the model as given).
Bad inputs end with one line naming the problem and exit 2 or 3. Every task meets the contract.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.conftest import ROOT, one_line, run_cli

FAST = ["registry=null", "bench.min_rounds=20", "bench.min_seconds=0", "bench.max_seconds=0.3",
        "bench.warmup_max_runs=20", "bench.size_buckets=2", "bench.cold_start_repeats=0",
        "bench.aa_tolerance=0.5", "gate.min_speedup=0", "gate.check_slo_p99=false",
        "gate.require_aa_check=false",  # timing verdicts off: tests/conftest.py tiny_args
        "quant.profile_runs=3", "quant.ranking_samples=20",
        "quant.region_trials=0"]  # regions: tests/test_auto.py
TORCH = ["model=torch", "model.factory=tests.byo_net:small_cnn",
         "model.inputs={image: [batch, 3, 16, 16]}", "model.outputs=[logits]"]
DATA = ["data=imagefolder", "data.calibration_samples=30", "data.evaluation_samples=60"]


@pytest.fixture(scope="module")
def byo(tmp_path_factory):
    """Generated images (labelled and flat), the trained checkpoint and its ONNX file."""
    from tests import byo_net

    root = tmp_path_factory.mktemp("byo")
    byo_net.write_folder(root / "data", 40)
    byo_net.write_folder(root / "flat", 14, seed=1, labelled=False)
    checkpoint = byo_net.train(root / "cnn.safetensors")
    byo_net.to_onnx(checkpoint, root / "cnn.onnx", opset=12)
    return root


def _run(root: Path, workdir: str, *args: str):
    return run_cli(*args, f"workdir={root / workdir}", f"data_dir={root / workdir / 'data'}",
                   *FAST)


def _report(root: Path, workdir: str) -> dict:
    return json.loads((root / workdir / "runs" / "latest" / "report.json").read_text())


def test_torch_factory_classifier_end_to_end(byo):
    proc = _run(byo, "torch", *TORCH, f"model.checkpoint={byo / 'cnn.safetensors'}", *DATA,
                f"data.path={byo / 'data'}", "metric=classification", "metric.top_k=2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rep = _report(byo, "torch")
    rows = {r["role"]: r for r in rep["rows"]}
    assert [m["name"] for m in rep["metrics"]] == ["top1", "top2"] and rep["metrics"][0]["primary"]
    # trained on the same generator: the float model classifies the held-out images
    assert rows["fp32"]["top1"] >= 90.0 and rows["fp32"]["top2"] >= rows["fp32"]["top1"]
    assert rows["candidate"]["top1"] >= rows["fp16"]["top1"] - 5.0
    assert rep["verdict"]["checks"][0]["check"] == "accuracy_drop"
    assert "top1" in rep["verdict"]["checks"][0]["detail"]
    stages = {s["label"]: s for s in rep["stages"]}
    assert {"load", "export", "optimize", "fp16", "calibrate[minmax]"} <= set(stages)
    contract = rep["timing"]["input_contract"]
    assert contract["input"] == "image" and contract["shape"][1:] == [
        {"min": 3, "max": 3}, {"min": 16, "max": 16}, {"min": 16, "max": 16}]


def test_torch_factory_pruned_end_to_end(byo):
    """prune=channels on a factory's network: the classifier layer kept (the model's default),
    the channels removed recorded as a history that export replays on the rebuilt network."""
    import onnx

    proc = _run(byo, "pruned", *TORCH, f"model.checkpoint={byo / 'cnn.safetensors'}", *DATA,
                f"data.path={byo / 'data'}", "metric=classification", "quant=none",
                "prune=channels", "prune.ratio=0.5", "prune.round_to=4", "prune.recover_steps=20",
                "prune.recover_batch_size=16", "prune.recover_lr=0.005", "prune.eval_samples=60")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rep = _report(byo, "pruned")
    section = rep["pruning"]
    assert section["config"]["ignored"] == ["7"]  # the last Linear: its outputs are the classes
    assert section["layers"] == [["0", 8, 4], ["3", 16, 8]]
    unpruned, pruned, recovered = section["rows"]
    assert pruned["parameters"] < unpruned["parameters"] and pruned["onnx_mb"] < unpruned["onnx_mb"]
    assert unpruned["top1"] >= 90.0 and 0.0 <= recovered["top1"] <= 100.0
    stages = {s["label"]: s for s in rep["stages"]}
    history = json.loads((Path(stages["prune"]["path"]) / "net.json").read_text())
    assert [h[0] for h in history["pruning_history"]] == ["3", "0"]
    graph = onnx.load(str(Path(rep["lineage"]["export"]["path"]) / "model.onnx")).graph
    assert sorted(i.dims[0] for i in graph.initializer if len(i.dims) == 4) == [4, 8]
    rows = {r["role"]: r for r in rep["rows"]}
    assert rows["fp32"]["top1"] == pytest.approx(recovered["top1"], abs=5.0)  # ORT vs torch
    assert "held-out top1 %" in (byo / "pruned" / "runs" / "latest" / "report.md").read_text()


# Loaded as sitecustomize into every Python process of the run (the CLI and the stages' child
# processes): it logs each time a file is opened from inside ``sha256_file``, if it is the model.
HASH_LOG_HOOK = """
import os, sys
_target, _log = os.environ["HASH_TARGET"], os.environ["HASH_LOG"]
def _hook(event, args):
    if event != "open" or not isinstance(args[0], (str, bytes, os.PathLike)):
        return
    if os.path.realpath(os.fsdecode(args[0])) != _target:
        return
    f = sys._getframe(1)
    while f is not None:
        if f.f_code.co_name == "sha256_file":
            with open(_log, "a") as out:
                out.write(f"{os.getpid()} {f.f_back.f_code.co_name if f.f_back else '?'}\\n")
            return
        f = f.f_back
sys.addaudithook(_hook)
"""


def test_the_users_file_is_hashed_once_from_command_line_to_registry(byo, tmp_path):
    """model.path is hashed once per run (pipeline.models.run): the preflight, the recipe, the
    import stage, the report and the bill read the run's key instead of hashing it again.
    The run is quant=none with the default speed gate: it ships the optimized FP32 model, judged
    on being no slower than the file as given (not on a speedup over itself, which failed it)."""
    hook, log, model = tmp_path / "hook", tmp_path / "hashes.log", tmp_path / "model.onnx"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HASH_LOG_HOOK)
    shutil.copy(byo / "cnn.onnx", model)
    fast = [a for a in FAST if a not in ("registry=null", "gate.min_speedup=0")]
    proc = run_cli("model=onnx", f"model.path={model}", *DATA, f"data.path={byo / 'data'}",
                   "metric=classification", "quant=none", f"workdir={tmp_path / 'w'}",
                   f"data_dir={tmp_path / 'w' / 'data'}", f"registry.root={tmp_path / 'reg'}",
                   *fast, env={"PYTHONPATH": f"{hook}{os.pathsep}{ROOT}",
                               "HASH_TARGET": str(model.resolve()), "HASH_LOG": str(log)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "w" / "runs" / "latest" / "report.json").read_text())
    assert report["publish"]["status"] == "published", report["publish"]
    checks = {c["check"]: c for c in report["verdict"]["checks"]}
    assert "speedup_ci_low" not in checks and checks["no_slower_than_given"]["passed"]
    assert "no slower than the file as given" in (tmp_path / "w" / "runs" / "latest" /
                                                  "report.md").read_text()
    imported = next(s for s in report["stages"] if s["stage"] == "import")
    assert not imported["reused"]  # built, so the import stage's check on the file ran
    hashed = log.read_text().splitlines()
    assert len(hashed) == 1, hashed


def test_the_same_network_as_an_onnx_file_only(byo):
    proc = _run(byo, "onnx", "model=onnx", f"model.path={byo / 'cnn.onnx'}", *DATA,
                f"data.path={byo / 'data'}", "metric=classification", "metric.top_k=2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rep = _report(byo, "onnx")
    stages = {s["label"]: s for s in rep["stages"]}
    assert "load" not in stages and "export" not in stages  # nothing to load or export
    imported = json.loads((Path(stages["import"]["path"]) / "artifact.json").read_text())["meta"]
    assert (imported["opset_given"], imported["opset"]) == (12, 13)
    assert imported["parity_vs_file"]["decoded_agreement"] == 1.0
    rows = {r["role"]: r for r in rep["rows"]}
    assert rows["fp32"]["top1"] >= 90.0
    assert rows["export"]["step"] == "import (the file as given)"  # no torch export ran
    # the same weights and data as the torch run: the same float accuracy
    torch_rows = {r["role"]: r for r in _report(byo, "torch")["rows"]} if (
        byo / "torch" / "runs" / "latest").exists() else None
    if torch_rows:
        assert rows["fp32"]["top1"] == pytest.approx(torch_rows["fp32"]["top1"], abs=1e-6)


def test_editing_the_data_in_place_reruns_the_evaluation(byo):
    """A second run reuses every stage; after one image changes in place, the data's digest
    changes and every stage that reads the data runs again."""
    data = byo / "data-edit"
    shutil.copytree(byo / "data", data)
    args = ["model=onnx", f"model.path={byo / 'cnn.onnx'}", *DATA, f"data.path={data}",
            "metric=classification", "quant=fp16"]
    assert _run(byo, "edit", *args).returncode == 0
    second = _run(byo, "edit", *args)
    assert second.returncode == 0 and "stages: " in second.stdout
    reused = {s["label"]: s["reused"] for s in _report(byo, "edit")["stages"]}
    assert all(reused.values()), reused
    victim = sorted((data / "class1").iterdir())[0]
    shutil.copy(sorted((data / "class0").iterdir())[0], victim)  # same name, other content
    assert _run(byo, "edit", *args).returncode == 0
    reused = {s["label"]: s["reused"] for s in _report(byo, "edit")["stages"]}
    # (evaluate[candidate] is the FP16 model's evaluation again in quant=fp16: reused in-run)
    assert not any(reused[k] for k in ("import", "evaluate[fp32]", "evaluate[fp16]")), reused


def test_label_free_run_with_an_onnx_file_and_an_unlabelled_folder(byo):
    proc = _run(byo, "free", "model=onnx", f"model.path={byo / 'cnn.onnx'}", "data=imagefolder",
                f"data.path={byo / 'flat'}", "data.calibration_samples=12",
                "data.evaluation_samples=30", "metric=agreement")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rep = _report(byo, "free")
    assert rep["metrics"][0]["name"] == "argmax_agreement"
    assert rep["metrics"][0]["against"] == "fp16_outputs"
    rows = {r["role"]: r for r in rep["rows"]}
    # every row is scored against the FP16 baseline's outputs: its own row agrees by construction
    assert rows["fp16"]["argmax_agreement"] == 100.0 and rows["fp16"]["max_abs_diff"] == 0.0
    assert rows["fp16"]["cosine_mean"] == pytest.approx(1.0, abs=1e-12)
    # FP32 differs from FP16 by rounding only (nonzero: it is not compared with itself)
    assert rows["fp32"]["argmax_agreement"] >= 90.0 and 0.0 < rows["fp32"]["max_abs_diff"] < 0.1
    assert rows["candidate"]["cosine_mean"] <= rows["fp16"]["cosine_mean"] + 1e-12
    check = rep["verdict"]["checks"][0]
    assert check["check"] == "accuracy_drop" and check["value"] == pytest.approx(
        100.0 - rows["candidate"]["argmax_agreement"])


@pytest.mark.slow
def test_every_task_meets_the_contract(byo):
    from pipeline.engine.compose import compose
    from pipeline.models import TASKS, task
    from pipeline.task.contract import check
    from pipeline.models.sources import task_key

    for name in TASKS:
        assert check(task(name)) == [], name
    for args in (["model=onnx", f"model.path={byo / 'cnn.onnx'}", "metric=classification"],
                 [*TORCH, "metric=classification"],
                 ["model=onnx", f"model.path={byo / 'cnn.onnx'}", "metric=agreement"]):
        cfg = compose([*args, "data=imagefolder", f"data.path={byo / 'data'}",
                       "data.calibration_samples=30", "data.evaluation_samples=60"])
        t = task(task_key(cfg.model, cfg.data, cfg.metric, str(byo / "ctr")))
        assert check(t) == [], args
        batch = next(t.batches(t.dataset(t.split("evaluation", 8, "")), 4))
        assert set(batch.feeds) == {i.name for i in t.inputs} and len(batch.indices) == 4


def test_bad_inputs_end_with_one_line(byo, tmp_path):
    not_onnx = tmp_path / "model.onnx"
    not_onnx.write_text("this is not a model")
    empty = tmp_path / "empty"
    empty.mkdir()
    bad_ck = tmp_path / "other.safetensors"
    from safetensors.torch import save_file

    from tests import byo_net

    save_file({k: v.contiguous() for k, v in byo_net.small_cnn(width=4).state_dict().items()},
              str(bad_ck))
    onnx = ["model=onnx", f"model.path={byo / 'cnn.onnx'}"]
    # enough samples for the counts asked, so each case fails on its own problem
    labelled = ["data=imagefolder", f"data.path={byo / 'data'}", "data.calibration_samples=30",
                "data.evaluation_samples=60"]
    cases = [
        (["model=onnx", f"model.path={not_onnx}", *labelled, "metric=classification"], 2,
         ("not an ONNX model",)),
        ([*TORCH[:1], "model.factory=no_such_pkg.mod:fn", *TORCH[2:], *labelled,
          "metric=classification"], 2, ("cannot import no_such_pkg.mod",)),
        ([*TORCH[:1], "model.factory=tests.byo_net:exits", *TORCH[2:], *labelled,
          "metric=classification"], 2, ("model.factory=tests.byo_net:exits", "SystemExit",
                                        "usage: train.py")),  # it exited: not exit 1, a gate's
        ([*TORCH, f"model.checkpoint={bad_ck}", *labelled, "metric=classification"], 2,
         ("does not fit",)),
        ([*onnx, "data=imagefolder", f"data.path={empty}", "metric=classification"], 3,
         ("no samples",)),
        ([*onnx, "data=imagefolder", f"data.path={byo / 'flat'}", "data.calibration_samples=12",
          "data.evaluation_samples=30", "metric=classification"], 2,
         ("needs labels", "metric=agreement")),
        ([*onnx, *labelled, "metric=ctc", f"metric.charset={not_onnx}"], 2,
         ("metric=ctc needs an output [batch, time, classes]",)),
        ([*onnx, *labelled, "metric=classification", "prune=channels"], 2,
         ("prune=channels", "no network to prune")),
        ([*TORCH, "+model.params.classes=2", *labelled, "metric=classification"], 2,
         ("labels 0..2", "has 2 classes")),  # a 2-class model on 3 classes' labels
    ]
    for args, code, words in cases:
        proc = _run(tmp_path, "bad", *args)
        one_line(proc, code, *words)
        assert not (tmp_path / "bad" / "runs").exists()  # nothing half-written
