"""Runtimes inside the pipeline, on the tiny network: runtime=auto records a choice per batch size
with its numbers (report, manifest), and a runtime that cannot run a model fails alone."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from pipeline import runtimes
from pipeline.core.artifact import Artifact, content_digest, digest_files
from tests.conftest import run_cli, seeded, seeded_args, session_run

needs_openvino = pytest.mark.skipif(not runtimes.installed("openvino"),
                                    reason="openvino is not installed")


@needs_openvino
def test_auto_benchmarks_every_target_and_records_the_choice(tiny_run, tmp_path):
    # blocks of 4 runs (20 by default when runtimes mix: tests/measure/test_timing.py)
    proc = run_cli(*seeded_args(tiny_run, seeded(tiny_run, tmp_path), "hardware.runtime=auto",
                                "bench.block=4"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rep = json.loads((tmp_path / "runs" / "latest" / "report.json").read_text())
    rt = rep["runtimes"]
    found, _ = runtimes.targets()
    assert rt["mode"] == "auto" and rt["targets"] == [str(t) for t in found]
    assert "onnxruntime fp32" in rt["targets"] and "openvino fp32" in rt["targets"]
    for role in ("export", "fp32", "fp16", "candidate"):  # one cell per artifact and target
        for target in rt["targets"]:
            cell = rt["cells"][role][target]
            assert "error" in cell or ("sequence_accuracy" in cell and
                                       set(cell["latency_ms"]) == {"1", "8"}), (role, target)
    for b, choice in rt["choice"].items():
        considered = choice["considered"]
        assert {c["target"] for c in considered} == set(rt["targets"])
        passing = [c for c in considered if c["passes_accuracy"]]
        assert choice["p50"] == min(c["p50"] for c in passing)  # the fastest that passes
        # the report's candidate row is the chosen target's numbers
        cand = next(r for r in rep["rows"] if r["role"] == "candidate")
        assert cand["latency"][b]["p50"] == pytest.approx(choice["p50"])
    deployed = rt["choice"]["8"]  # the gate's batch size decides what ships
    assert (rt["deployed"]["runtime"], rt["deployed"]["precision"]) == (deployed["runtime"],
                                                                        deployed["precision"])
    assert rt["deployed"]["executed"]["ops"], "the executed precision was read back"
    md = (tmp_path / "runs" / "latest" / "report.md").read_text()
    assert "## Runtimes" in md and "| artifact | " + " | ".join(rt["targets"]) + " |" in md
    # the manifest published with the version carries the same choice
    from pipeline.registry.local import LocalStore
    from pipeline.registry.names import parse_ref

    name, ref = parse_ref(rep["published"].split()[0])
    _, pulled = LocalStore(tmp_path / "registry").pull(name, ref, tmp_path / "pulled")
    manifest = json.loads((pulled / "manifest.json").read_text())
    assert manifest["runtime"]["deployed"]["runtime"] == deployed["runtime"]
    assert set(manifest["runtime"]["choice"]) == {"1", "8"}
    assert manifest["config"]["hardware"]["runtime"] == "auto"
    # every evaluation a plain run makes was reused: auto adds targets, it changes nothing else
    built = {s["label"] for s in rep["stages"] if not s["reused"]}
    assert not built & {"load", "export", "optimize", "fp16", "evaluate[export]",
                        "evaluate[fp32]", "evaluate[fp16]"}


def _poisoned(src: Path, folder: Path) -> Artifact:
    """The tiny FP32 model plus a zero-weighted ONNX Det: ONNX Runtime runs (and folds) it,
    OpenVINO's ONNX frontend has no conversion rule for it."""
    model = onnx.load(str(src))
    out = model.graph.output[0].name
    for node in model.graph.node:
        node.output[:] = [f"{o}_raw" if o == out else o for o in node.output]
    model.graph.initializer.extend([numpy_helper.from_array(
        np.eye(2, dtype=np.float32), "eye"), numpy_helper.from_array(np.zeros((), np.float32), "zero")])
    model.graph.node.extend([helper.make_node("Det", ["eye"], ["det"]),
                             helper.make_node("Mul", ["det", "zero"], ["nothing"]),
                             helper.make_node("Add", [f"{out}_raw", "nothing"], [out])])
    folder.mkdir()
    onnx.save(model, str(folder / "model.onnx"))
    files = digest_files(folder)
    return Artifact(path=folder, stage="test", key="poisoned", digest=content_digest(files, {}),
                    files=files)


@needs_openvino
def test_a_failing_runtime_is_recorded_while_the_others_run(tiny_run, tmp_path):
    from pipeline.engine.compose import compose
    from pipeline.models import task
    from pipeline.engine.runner import Runner
    from pipeline.runtimes.plan import Plan
    from pipeline.stages.benchmark import Benchmark
    from pipeline.stages.evaluate import Evaluate

    cfg = compose(seeded_args(tiny_run, tmp_path, "hardware.runtime=auto"))
    lineage = json.loads((session_run(tiny_run) / "report.json").read_text())["lineage"]
    fp32 = Artifact.read(Path(lineage["fp32"]["path"]))
    bad = _poisoned(fp32.model, tmp_path / "poisoned")
    hw = cfg.hardware.target()
    plan = Plan(hw, "none")
    plan.options = [runtimes.PRIMARY, runtimes.Target("openvino", "fp32")]  # fp32 only: faster
    runner = Runner(tmp_path, hw, log=lambda *_: None)
    m = cfg.model
    split = task(m.name).split("evaluation", m.eval_samples, cfg.data_dir)
    evaluate = Evaluate(split, m.eval_batch_size, hw)
    plan.evaluate_others(runner, evaluate, {"candidate": bad, "fp32": fp32})
    assert set(plan.failures) == {"candidate @ openvino fp32"}
    assert "Det" in plan.failures["candidate @ openvino fp32"]
    assert ("fp32", runtimes.Target("openvino", "fp32")) in plan.extra  # the other one ran

    bench_cfg = dataclasses.replace(cfg.bench, min_rounds=10, max_seconds=0.5, block=4,
                                    cold_start_repeats=0, batch_sizes=[1])
    bench = runner.run(Benchmark(split, bench_cfg, hw, plan.bench_options()), bad, fp32=fp32)
    assert list(bench.meta["failures"]) == ["candidate @ openvino fp32"]
    timed = bench.meta["batches"]["1"]["latency_ms"]
    assert {"candidate", "fp32", "fp32 @ openvino fp32"} <= set(timed)
    assert bench.meta["batches"]["1"]["block"] == 4  # runtimes mixed: alternated in blocks


@needs_openvino
def test_the_latency_aware_comparison_runs_on_the_target_runtime(tiny_run, tmp_path):
    """compare (which confirms keeping nodes float) times the models on the target's runtime:
    OpenVINO in bf16 runs where the CPU has bf16, ONNX Runtime, which has no bf16 precision,
    refuses everywhere."""
    from pipeline.engine.compose import compose
    from pipeline.models import task
    from pipeline.runtimes import RuntimeFailure, cpu_supports
    from pipeline.stages.compare import Compare

    cfg = compose(seeded_args(tiny_run, tmp_path))
    lineage = json.loads((session_run(tiny_run) / "report.json").read_text())["lineage"]
    fp32, cand = (Artifact.read(Path(lineage[r]["path"])) for r in ("fp32", "candidate"))
    m = cfg.model
    split = task(m.name).split("evaluation", m.eval_samples, cfg.data_dir)
    # OpenVINO's bf16 only where the CPU (less a cap) has AVX512-BF16/AMX: elsewhere the
    # pipeline refuses bf16 before building anything (runtimes.check), a real AVX2 machine's
    # OpenVINO has no bf16 kernels to time, and under the AVX2 cap its plugin still offers bf16
    # (read from cpuid) but fails at the first inference (docs/cpus.md).
    both = (("openvino", True),) if cpu_supports("bf16") else ()
    for runtime, works in (*both, ("onnxruntime", False)):
        hw = dataclasses.replace(cfg.hardware.target(), runtime=runtime, precision="bf16")
        stage = Compare(split, 2, hw, min_rounds=5, max_seconds=0.5)
        if works:
            out = stage.run(cand, tmp_path, other=fp32)
            assert out["a_over_b_speedup"]["median"] > 0
        else:
            with pytest.raises(RuntimeFailure, match="bf16"):
                stage.run(cand, tmp_path, other=fp32)
