"""Peers for ``make bench``: the pipeline's chosen artifact and runtime against the tools' defaults.

In: a pipeline run's report (lineage, the runtime chosen per batch size, the FP16 reference
accuracy) and its config. Out: for each batch size, the latency of the pipeline's choice and of
three peers timed side by side in one process (blocks of ``BLOCK`` runs, since runtimes mix, with
an A/A check of the pipeline's model against a second copy of itself), and each one's accuracy on
the evaluation set under the settings it would be deployed with. The peers, as an engineer would
get them from each tool's defaults:
(a) ONNX Runtime's ``quantize_static`` with its default options on the optimized FP32 model,
    calibrated on the pipeline's calibration set, run on ONNX Runtime;
(b) NNCF's INT8 (``nncf.quantize``, default preset) of the FP32 model read by OpenVINO, compiled
    with OpenVINO's default inference precision (bf16 on CPUs with AVX512-BF16 or AMX);
(c) OpenVINO's default compile of the FP32 model.
Only threads and the latency hint are set for everyone, so the comparison is about the model and
precision, not the thread count. NNCF is imported only here, from the ``bench`` extra: it is a
peer, never a dependency of the pipeline. Each step runs in a child process (ONNX Runtime's
calibration sessions cannot share the process-global pool the timing uses).
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

BLOCK = 20
PEERS = {"a": "onnxruntime quantize_static (defaults)", "b": "nncf int8 (openvino defaults)",
         "c": "openvino default compile (fp32 model)"}
AA = "pipeline (A/A copy)"


def build(fp32_model: Path, out: Path, task_name: str, samples: int, batch: int,
          data_dir: str) -> dict:
    """(a) and (b) from the FP32 model, calibrated on the pipeline's calibration set."""
    import nncf
    import openvino as ov
    from onnxruntime.quantization import quantize_static

    from pipeline.models import module
    from pipeline.quant.calibration import Feeds

    t = module(task_name)
    ds, digest = t.dataset("calibration", samples, data_dir)
    feeds = Feeds({t.INPUT_NAME: x} for _, x, _ in t.batches(ds, batch, sort_by_width=False))
    t0 = time.time()
    quantize_static(str(fp32_model), str(out / "ort_static.onnx"), feeds)
    t1 = time.time()
    items = [x for _, x, _ in t.batches(ds, 1, sort_by_width=False)]
    quantized = nncf.quantize(ov.Core().read_model(str(fp32_model)), nncf.Dataset(items),
                              subset_size=len(items))
    ov.save_model(quantized, str(out / "nncf_int8.xml"))
    return {"calibration_set": digest, "ort_static_seconds": round(t1 - t0, 1),
            "nncf_seconds": round(time.time() - t1, 1), "nncf": nncf.__version__}


class _DefaultCompile:
    """OpenVINO as its users deploy it: no precision hint (the CPU's default)."""

    def __init__(self, model: Path, threads: int):
        from pipeline.runtimes.openvino import core

        self.compiled = core().compile_model(str(model), "CPU", {
            "INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY"})
        self.request = self.compiled.create_infer_request()

    def run(self, batch):
        return self.request.infer({0: batch}, share_inputs=True)[0]

    def describe(self, example=None) -> dict:
        from pipeline.runtimes.openvino import executed

        return {"runtime": "openvino", "precision": str(
            self.compiled.get_property("INFERENCE_PRECISION_HINT")),
            "executed": executed(self.compiled)}


def _accuracy(t, model, ds, batch: int, metric: str, reference: float) -> dict:
    predictions, labels = [None] * len(ds), [None] * len(ds)
    for idx, images, texts in t.batches(ds, batch):
        for i, pred, text in zip(idx, t.decode(model.run(images)), texts):
            predictions[i], labels[i] = pred, text
    scores = t.metrics(predictions, labels)
    return {**scores, "accuracy_drop": reference - scores[metric]}


def measure(paths: dict, choice: dict, hw, bench, model_cfg, data_dir: str, metric: str,
            reference: float) -> dict:
    """Accuracy and side-by-side latency of the pipeline's choice and the peers."""
    import os

    from pipeline import runtimes
    from pipeline.measure import timing
    from pipeline.models import module
    from benchmarks.common import width_buckets

    if hw.affinity:
        os.sched_setaffinity(0, hw.affinity)
    t = module(model_cfg.name)
    ds, _ = t.dataset("evaluation", model_cfg.eval_samples, data_dir)
    peers = {"a": runtimes.load(paths["a"], runtimes.settings_for(hw, runtimes.PRIMARY)),
             "b": _DefaultCompile(paths["b"], hw.intra_op_threads),
             "c": _DefaultCompile(paths["c"], hw.intra_op_threads)}
    example = t.example_input(1)
    out: dict = {"accuracy": {}, "executed": {}, "batches": {}, "reference_fp16": reference}
    for key, m in peers.items():
        out["accuracy"][PEERS[key]] = _accuracy(t, m, ds, model_cfg.eval_batch_size, metric,
                                                reference)
        out["executed"][PEERS[key]] = m.describe(example)
    mine: dict = {}
    for b, c in choice.items():  # the pipeline's choice may differ per batch size
        target = runtimes.Target(c["runtime"], c["precision"])
        if target not in mine:
            settings = runtimes.settings_for(hw, target)
            mine[target] = (runtimes.load(paths["pipeline"], settings),
                            runtimes.load(paths["pipeline"], settings))
            out["accuracy"][f"pipeline ({target})"] = _accuracy(
                t, mine[target][0], ds, model_cfg.eval_batch_size, metric, reference)
            out["executed"][f"pipeline ({target})"] = mine[target][0].describe(example)
    rng = np.random.default_rng(0)
    buckets = width_buckets(np.asarray(ds["width"]), bench.size_buckets)
    for b, c in choice.items():
        target = runtimes.Target(c["runtime"], c["precision"])
        fns = {"pipeline": mine[target][0].run, AA: mine[target][1].run,
               **{PEERS[k]: m.run for k, m in peers.items()}}
        inputs = [next(t.batches(ds.select([int(i) for i in rng.choice(
            idx, size=min(int(b), idx.size), replace=False)]), int(b)))[1]
            for idx in buckets for _ in range(bench.batches_per_bucket)]
        for fn in fns.values():
            timing.warm_up(fn, inputs, bench.warmup_window, bench.warmup_tolerance,
                           bench.warmup_max_runs)
        single: dict = {}
        pairs = [(p, "pipeline") for p in PEERS.values()] + [("pipeline", AA)]
        times, info = timing.interleaved(fns, inputs, pairs, 10, bench.max_seconds, bench.rel_ci,
                                         BLOCK, 10, runs=single)
        out["batches"][b] = {
            "pipeline_target": str(target),
            "latency_ms": {k: timing.percentiles(single[k], int(b)) for k in fns},
            # > 1: the pipeline's choice is faster than that peer (median of per-block ratios)
            "pipeline_speedup": {p: timing.ratio_ci(times[p], times["pipeline"])
                                 for p in PEERS.values()},
            "aa_check": timing.ratio_ci(times["pipeline"], times[AA]), **info, "block": BLOCK}
    return out


def compare(report: dict, cfg, workdir: Path) -> dict:
    """Build the peers, then measure everything; ``report`` is the pipeline run's report.json."""
    from pipeline.core import isolate
    from pipeline.core.artifact import Artifact

    from pipeline.runtimes.record import RuntimePlan

    lineage, plan = report["lineage"], RuntimePlan.of(report["runtimes"])
    fp32 = Artifact.read(Path(lineage["fp32"]["path"])).model
    cand = Artifact.read(Path(lineage["candidate"]["path"])).model
    workdir.mkdir(parents=True, exist_ok=True)
    m = cfg.model
    built = isolate.call("peers: build", build, fp32, workdir, m.name, m.calibration_samples,
                         cfg.quant.calibration_batch_size, cfg.data_dir)
    metric = "sequence_accuracy"
    reference = next(r for r in report["rows"] if r["role"] == "fp16")[metric]
    choice = {b: {"runtime": c.runtime, "precision": c.precision} for b, c in plan.choice.items()}
    paths = {"pipeline": cand, "a": workdir / "ort_static.onnx", "b": workdir / "nncf_int8.xml",
             "c": fp32}
    measured = isolate.call("peers: measure", measure, paths, choice, cfg.hardware.target(),
                            cfg.bench, m, cfg.data_dir, metric, reference)
    return {"built": built, "choice": choice, **measured}


def section(base: list[str], cli) -> dict:
    """``make bench``'s ``runtimes`` section: the pipeline with ``hardware.runtime=auto``, then
    its choice against the peers at batch 1 and 8. ``cli`` runs ``python -m pipeline``."""
    from pipeline.core.json_record import to_json
    from pipeline.engine.compose import compose
    from pipeline.runtimes.record import RuntimePlan

    args = [*base, "hardware.runtime=auto"]
    code, seconds, rep = cli(args)
    if not rep or rep.get("runtimes", {}).get("mode") != "auto":
        raise RuntimeError(f"the auto pipeline wrote no runtime choice (exit {code})")
    cfg = compose(args)
    plan = RuntimePlan.of(rep["runtimes"])
    out = {"command": "python -m pipeline " + " ".join(args), "exit_code": code,
           "seconds": round(seconds, 1), "pipeline_runtimes": {
               "targets": list(plan.targets), "unavailable": plan.unavailable,
               "failures": plan.failures, "deployed": to_json(plan.deployed)},
           "pipeline_choice": {b: to_json(c.picked()) for b, c in plan.choice.items()},
           **compare(rep, cfg, Path(cfg.workdir) / "bench-peers")}
    from pipeline.metrics import SPECS
    from pipeline.metrics.limits import limits

    metric = "sequence_accuracy"
    gate = limits(cfg.gate.max_accuracy_drop, SPECS[metric])[metric]  # in points
    acc = out["accuracy"]
    targets = {}
    for b, at in out["batches"].items():
        mine = acc[f"pipeline ({at['pipeline_target']})"]["accuracy_drop"]
        for key, peer in PEERS.items():
            sp = at["pipeline_speedup"][peer]
            targets[f"batch {b}: pipeline ({at['pipeline_target']}) faster than ({key}) {peer}"] = \
                [sp["median"], sp["ci95"][0] > 1.0]
            targets[f"batch {b}: pipeline drop <= ({key})'s and <= gate {gate}"] = \
                [[mine, acc[peer]["accuracy_drop"]], mine <= acc[peer]["accuracy_drop"] + 1e-9
                 and mine <= gate]
        aa = at["aa_check"]["median"]
        targets[f"batch {b}: A/A of the pipeline's model within 3 %"] = [aa, abs(aa - 1) <= 0.03]
    out["targets"] = targets
    out["metric"] = metric
    return out
