"""``quant=auto`` and the float-region search on a network where INT8 pays little or nothing.

The tiny mobile network (random weights; depthwise convs, HardSwish, squeeze-excite) is where
Q/DQ around small depthwise convs costs what INT8 saves. Nothing here assumes this CPU: each
expectation is derived from what the run itself measured (the table, the gate's checks), so the
same tests hold where INT8 wins (VNNI, AMX) and where it loses (AVX2).
"""
from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from pipeline.recipes import regions
from tests.conftest import run_cli

FAST = ["bench.min_rounds=20", "bench.min_seconds=0", "bench.max_seconds=0.3",
        "bench.warmup_max_runs=20", "bench.size_buckets=2", "bench.batches_per_bucket=1",
        "bench.cold_start_repeats=0", "bench.batch_sizes=[8]",
        # wide: every candidate on every runtime is timed in one interleaved benchmark, whose
        # FP32 twin read 1.55 twice in a busy hour (the A/A check has tests of its own)
        "bench.aa_tolerance=0.9",
        # random weights decode noise: agreement with FP16 says nothing about quantization here
        "gate.min_output_agreement=0", "slo.p99_ms=100000",
        # the SLO is judged at its own batch size (1 by default), which this run does not time
        "slo.batch_size=8"]


def args(workdir: Path, *extra: str) -> list[str]:
    return ["model=ocr_mobile_tiny", f"workdir={workdir}", f"data_dir={workdir / 'data'}",
            f"registry.root={workdir / 'registry'}", *FAST, *extra]


def report(workdir: Path) -> dict:
    return json.loads((workdir / "runs" / "latest" / "report.json").read_text())


@pytest.fixture(scope="module")
def auto_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("auto")
    # every candidate on every runtime in blocks of 4 runs (20 by default when runtimes mix)
    proc = run_cli(*args(workdir, "quant=auto", "quant.region_trials=1", "bench.block=4"))
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    return workdir, proc


def test_auto_publishes_the_fastest_candidate_that_passes_and_says_why(auto_run):
    workdir, proc = auto_run
    rep = report(workdir)
    auto, table = rep["auto"], rep["auto"]["table"]
    assert {r["candidate"] for r in table} >= {"fp32", "int8", "dynamic"}
    assert {r["target"] for r in table} >= {"onnxruntime fp32"}
    passing = [r for r in table if r["passed"]]
    assert passing, "the FP32 model is the fastest float baseline or slower than it: one passes"
    winner = min(passing, key=lambda r: r["p50"])
    assert auto["winner"]["label"] == winner["label"] and proc.returncode == 0
    assert rep["verdict"]["passed"] and rep["published"].startswith(
        f"ocr_mobile:auto.{winner['candidate']}")
    # every failing row names the checks it failed, and the reasons are in "why"
    for r in table:
        assert r["passed"] == (not r["failed"])
        if not r["passed"]:
            assert any(line.startswith(f"{r['candidate']} on {r['target']}") and
                       ", ".join(r["failed"]) in line for line in auto["why"])
    model = onnx.load(str(Path(rep["lineage"]["candidate"]["path"]) / "model.onnx"))
    quantize_nodes = sum(n.op_type in ("QuantizeLinear", "DynamicQuantizeLSTM") for n in model.graph.node)
    if winner["role"] == "fp32":  # INT8 could not pay here: the float model ships, and why
        assert quantize_nodes == 0
        # the FP32 model on the baseline's own runtime is that baseline; on another runtime or
        # precision (OpenVINO at BF16 on a CPU with AMX) it may be faster than it, and says by how much
        assert "fastest float baseline itself" in auto["why"][0] or (
            winner["target"] != "onnxruntime fp32" and "the fastest float baseline" in auto["why"][0])
        assert any(line.startswith(("INT8 does not pay", "INT8 does not pass"))
                   for line in auto["why"]) or any(
            r["passed"] for r in table if r["role"] != "fp32")
    else:  # INT8 paid: proven faster than the fastest float baseline
        assert quantize_nodes > 0 and winner["speedup_vs_fastest_float"]["ci95"][0] >= 1.0
    md = (workdir / "runs" / "latest" / "report.md").read_text()
    assert "## quant=auto" in md and f"**Winner: {winner['candidate']} on {winner['target']}.**" in md


def test_every_timing_comes_from_one_benchmark_and_a_second_run_rebuilds_nothing(auto_run):
    workdir, _ = auto_run
    rep = report(workdir)
    benches = [s for s in rep["stages"] if s["stage"] == "benchmark"]
    assert len(benches) == 1  # every candidate on every runtime timed side by side, once
    # every candidate on every runtime in blocks of 4 runs (20 by default when runtimes mix)
    proc = run_cli(*args(workdir, "quant=auto", "quant.region_trials=1", "bench.block=4"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    again = report(workdir)
    assert all(s["reused"] for s in again["stages"])
    assert again["auto"]["winner"]["label"] == rep["auto"]["winner"]["label"]


def test_region_search_times_whole_blocks_and_names_them(auto_run):
    rep = report(auto_run[0])
    reg = rep["auto"]["int8"]["regions"]
    assert reg and reg["regions"] and reg["summary"]
    names = [r["name"] for r in reg["regions"]]
    assert any(n.startswith("blocks.") for n in names) and "head" in names
    trials = [t for t in reg["trials"] if t["regions"]]
    assert len(trials) == 1  # bounded by quant.region_trials
    for t in reg["trials"]:
        for key in ("speedup_over_all_int8", "speedup_over_fp32"):
            lo, hi = t[key]["ci95"]
            assert lo <= t[key]["median"] <= hi
    if reg["kept"]:
        kept = next(t for t in reg["trials"] if t["name"] == reg["kept"])
        assert kept["speedup_over_all_int8"]["ci95"][0] > 1.0
        assert set(kept["float_nodes"]) <= set(rep["auto"]["int8"]["latency_exclusions"])
    else:
        assert all(t["speedup_over_all_int8"]["ci95"][0] <= 1.0 for t in reg["trials"])
    md = (auto_run[0] / "runs" / "latest" / "report.md").read_text()
    assert "### Float regions" in md


def test_int8_that_cannot_pay_fails_with_the_float_hint(auto_run):
    workdir, _ = auto_run
    # the same INT8 model as quant=auto's (same region search): only its benchmark is new
    proc = run_cli(*args(workdir, "quant=int8", "quant.region_trials=1"))
    rep = report(workdir)
    speed = next(c for c in rep["verdict"]["checks"] if c["check"] == "speedup_ci_low")
    if speed["passed"]:  # INT8 paid on this CPU: nothing to hint
        assert proc.returncode == 0 and "hint" not in rep["verdict"]
        return
    assert proc.returncode == 1  # never ship a model slower than its float baseline
    hint = rep["verdict"]["hint"]
    assert "the optimized FP32 model on onnxruntime fp32 would pass" in hint
    assert "quant=auto" in hint and "hint:" in proc.stdout


def test_regions_follow_module_paths_and_join_weightless_runs(tmp_path):
    from onnx import TensorProto, helper

    def node(op, name, i, o):
        return helper.make_node(op, i, [o], name=name)

    nodes = [node("Conv", "stem.0", ["x", "w"], "a"), node("Relu", "stem.2", ["a"], "b"),
             node("Conv", "blocks.0.dw.0", ["b", "w"], "c"), node("Relu", "node_Relu_7", ["c"], "d"),
             node("MaxPool", "pool", ["d"], "e"), node("Conv", "blocks.1.expand.0", ["e", "w"], "f"),
             node("MatMul", "head", ["f", "w"], "y")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [helper.make_tensor("w", TensorProto.FLOAT, [1], [1.0])])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph), path)
    regs = regions.regions(path)
    assert [r.name for r in regs] == ["stem.0..stem.2", "blocks.0..pool", "blocks.1", "head"]
    assert regs[1].nodes == ("blocks.0.dw.0", "node_Relu_7", "pool")
    gains = {"stem.0": -1.0, "blocks.0.dw.0": -0.5, "blocks.1.expand.0": 0.3, "head": 0.1}
    trials = regions.plan(regs, gains, set(gains), limit=4)
    assert trials[0] == ("every region slower in INT8", ["stem.0..stem.2", "blocks.0..pool"])
    assert trials[1][1] == ["stem.0..stem.2", "blocks.0..pool", "blocks.1"]  # the trunk
    assert len(trials) == 4 and all(len(m) < len(regs) for _, m in trials)


def test_why_blames_the_timing_not_int8_when_every_candidate_fails_the_a_a_check():
    """all-mpnet-base-v2 under quant=auto: every row failed the benchmark's A/A check (10 rounds
    of blocks across three runtimes), and the explanation said "INT8 does not pay on this
    machine ... so a float artifact ships" about a run that shipped nothing."""
    from pipeline.measure.results import Speedup
    from pipeline.recipes.auto_table import Row, why

    def row(name, role, target, p50, failed, sp=None):
        runtime, precision = target.split()
        return Row(name, role, target, f"{name}@{target}", runtime, precision, not failed,
                   failed, [], p50=p50, accuracy_drop=0.0, fastest_float="fp32",
                   speedup_vs_fastest_float=Speedup(sp or 1.0, sp or 1.0, sp or 1.0))

    table = [row("fp32", "fp32", "openvino bf16", 45.8, ["aa_check"], 3.5),
             row("dynamic", "dynamic", "onnxruntime fp32", 52.5, ["aa_check"], 3.1),
             row("int8", "candidate", "onnxruntime fp32", 61.0, ["accuracy_drop", "aa_check"], 2.6)]
    lines = why(table[0], table)
    assert any("timing itself failed its check (aa_check)" in line for line in lines)
    assert not any("does not pay" in line for line in lines)
    # quantized rows that fail on speed alone, a float winner that passes: INT8 does not pay
    table = [row("fp32", "fp32", "onnxruntime fp32", 10.0, []),
             row("int8", "candidate", "onnxruntime fp32", 11.0, ["speedup_ci_low"], 0.9)]
    lines = why(table[0], table)
    assert any(line.startswith("INT8 does not pay") and line.endswith("a float artifact ships.")
               for line in lines)
    # faster but inaccurate (nudenet's INT8: 1.28x, its scores lost): not "does not pay"
    table[1] = row("int8", "candidate", "onnxruntime fp32", 8.0, ["cosine_parts_drop"], 1.28)
    lines = why(table[0], table)
    assert not any("does not pay" in line for line in lines)
    assert any(line.startswith("INT8 does not pass here") and "1.28x" in line
               and line.endswith("but failed cosine_parts_drop, so a float artifact ships.")
               for line in lines), lines
