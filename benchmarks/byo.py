"""``make bench``, section ``byo``: a text recognizer handed to the pipeline as a user would hand
it over, only an ONNX file and a character-set file, with data in a folder and a labels file.

In: the bench's base overrides and its CLI runner. The recognizer (``benchmarks.byo_recognizer``:
3 x 48 x width input, depthwise-separable blocks with HardSwish and squeeze-excite, opset 12) is
trained here briefly on generated lines; the pipeline never sees its torch side. Out: for
``quant=int8`` and ``quant=mixed`` through the real command line (``model=onnx metric=ctc``): the
gate verdict, sequence accuracy and CER of FP32, FP16 and the candidate, and, timed side by side
in one process at batch 1 and 8 (interleaved round by round on real batches drawn from width
buckets of the evaluation set, as ``benchmarks/peers.py`` does, with an A/A check), the pipeline's
artifacts against its FP32 model, against the file as given, and against onnxruntime's default
``quantize_static`` (QDQ, every option at its default) of the same FP32 model calibrated on the
same calibration samples, whose accuracy is scored on the same evaluation set. Targets: each
artifact not slower than FP32 at batch 1 and 8 (upper CI bound of its speedup >= 1.0), and its
accuracy drop within the gate's budget.
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from types import SimpleNamespace

from pipeline.core import numbers

STEPS = 1500           # about 6 minutes on 2 cores; enough for a recognizer worth gating
CALIBRATION, EVALUATION = 128, 500
QUANTS = ("int8", "mixed")
BATCHES = (1, 8)
ORT_DEFAULT = "ort_default_int8"
AA = "int8 (A/A copy)"


def default_quantize(fp32_model: Path, out: Path, args: list[str]) -> dict:
    """onnxruntime's ``quantize_static`` with every option at its default, calibrated on the
    pipeline's calibration samples, batched as the pipeline's calibrate stage batches them."""
    import time

    from onnxruntime.quantization import quantize_static

    from pipeline.quant.calibration import Feeds

    cfg, t = _task(args)
    ds = t.dataset(t.split("calibration", cfg.data.calibration_samples, cfg.data_dir))
    feeds = Feeds(b.feeds for b in t.batches(ds, cfg.quant.calibration_batch_size, sort=False,
                                             bounded=True))
    t0 = time.time()
    quantize_static(str(fp32_model), str(out), feeds)
    return {"seconds": round(time.time() - t0, 1), "samples": len(ds)}


def evaluate(model: Path, args: list[str]) -> dict:
    """The pipeline's evaluate stage on a model it did not make: the same scoring as the rows."""
    from pipeline.stages.evaluate import Evaluate

    cfg, t = _task(args)
    split = t.split("evaluation", cfg.data.evaluation_samples, cfg.data_dir)
    with tempfile.TemporaryDirectory() as out:
        return Evaluate(data=split, batch_size=cfg.model.eval_batch_size,
                        hardware=cfg.hardware.target()).run(SimpleNamespace(model=model),
                                                            Path(out))["metrics"]


def _task(args: list[str]):
    from pipeline.engine.compose import compose
    from pipeline.models import task
    from pipeline.models.sources import task_key

    cfg = compose(args)
    return cfg, task(task_key(cfg.model, cfg.data, cfg.metric, cfg.data_dir))


def timed(models: dict, args: list[str], quants: tuple[str, ...] = QUANTS,
          batches: tuple[int, ...] = BATCHES) -> dict:
    """Every model at each of ``batches`` in this one process on the pipeline's runtime
    settings, interleaved round by round (a random rotation each round), after each one warmed
    up. ``quants``: the roles that are the pipeline's artifacts (each also against the ORT
    default; the first one has an A/A copy)."""
    import os

    import numpy as np

    from benchmarks.common import width_buckets
    from pipeline import runtimes
    from pipeline.measure import timing
    from pipeline.task.contract import size_of

    cfg, t = _task(args)
    hw, bench = cfg.hardware.target(), cfg.bench
    if hw.affinity:
        os.sched_setaffinity(0, hw.affinity)
    ds = t.dataset(t.split("evaluation", cfg.data.evaluation_samples, cfg.data_dir))
    sessions = {role: runtimes.load(path, hw) for role, path in models.items()}
    sessions[AA] = runtimes.load(models[quants[0]], hw)
    fns = {role: s.run for role, s in sessions.items()}
    mine = [r for r in models if r in quants]
    pairs = ([("fp32", r) for r in models if r != "fp32"] + [(ORT_DEFAULT, r) for r in mine if ORT_DEFAULT in models]
             + [(quants[0], AA)])
    buckets = width_buckets(t.sizes(ds), bench.size_buckets)
    rng = np.random.default_rng(0)
    out = {}
    for b in batches:
        inputs = [next(t.batches(ds.select([int(i) for i in rng.choice(
            idx, size=min(b, idx.size), replace=False)]), b)).feeds
            for idx in buckets for _ in range(bench.batches_per_bucket)]
        for fn in fns.values():
            timing.warm_up(fn, inputs, bench.warmup_window, bench.warmup_tolerance,
                           bench.warmup_max_runs)
        single: dict = {}
        times, info = timing.interleaved(fns, inputs, pairs, bench.min_rounds, bench.max_seconds,
                                         bench.rel_ci, runs=single)
        out[str(b)] = {
            "p50_ms": {r: float(np.median(v)) for r, v in single.items()},
            # > 1: the second model is faster than the first (median of per-round ratios)
            "speedup": {f"{y} vs {x}": timing.ratio_ci(times[x], times[y]) for x, y in pairs},
            "widths": [size_of(t, inp) for inp in inputs], **info}
    return out


def _run(cli, args: list[str], metrics: tuple[str, ...] = ("sequence_accuracy", "cer")) -> dict:
    """One command line's record: its verdict and checks, ``metrics`` of every row, its
    latencies, quantization and lineage."""
    code, seconds, rep = cli(args)
    if not rep or "rows" not in rep:
        raise RuntimeError(f"python -m pipeline {' '.join(args)} wrote no report (exit {code})")
    rows = {r["role"]: r for r in rep["rows"]}
    checks = {c["check"]: c for c in rep["verdict"]["checks"]}
    q = rep.get("quantization") or {}
    return {"command": "python -m pipeline " + " ".join(args), "exit_code": code,
            "seconds": round(seconds, 1), "verdict": rep["verdict"]["summary"],
            "checks": {k: {f: c.get(f) for f in ("passed", "value", "limit", "detail")}
                       for k, c in checks.items()},
            "accuracy": {role: {m: r.get(m) for m in metrics} for role, r in rows.items()},
            "latency_ms_in_run": {role: {b: v["p50"] for b, v in r["latency"].items()}
                                  for role, r in rows.items()},
            "quantization": quantization_record(q),
            "lineage": {k: v["path"] for k, v in rep["lineage"].items()},
            "environment": rep.get("environment")}


def quantization_record(q: dict) -> dict:
    """The report's quantization section as bench.json keeps it: the mixed search's trace
    counts each step's float nodes instead of naming them (thousands of names on a detector;
    the run's own report.json, named by the lineage, has them)."""
    out = {k: q.get(k) for k in ("settings", "latency_exclusions", "latency_trial",
                                 "float_outputs", "search", "versus_fp32") if k in q}
    trace = (out.get("search") or {}).get("trace")
    if isinstance(trace, list):
        out["search"] = {**out["search"], "trace": [
            {**step, "float_nodes": len(step["float_nodes"])}
            if isinstance(step, dict) and isinstance(step.get("float_nodes"), list) else step
            for step in trace]}
    return out


def section(base: list[str], cli, steps: int = STEPS) -> dict:
    from benchmarks.byo_recognizer import DATA_ARGS, build, write_lines
    from pipeline.core import isolate

    root = Path("artifacts") / "bench-byo"
    card = isolate.call("byo: train and export the recognizer", build, root / "model", steps)
    labels = write_lines(root / "lines", CALIBRATION + EVALUATION)
    given = root / "model" / "recognizer.onnx"
    common = ["model=onnx", f"model.path={given}", *DATA_ARGS, f"data.path={root / 'lines'}",
              f"data.labels={labels}", f"data.calibration_samples={CALIBRATION}",
              f"data.evaluation_samples={EVALUATION}", "metric=ctc",
              f"metric.charset={root / 'model' / 'charset.txt'}", "registry=null"]
    keep = [a for a in base if not a.startswith(("model=", "quant="))]
    runs = {q: _run(cli, [*common, *keep, f"quant={q}"]) for q in QUANTS}
    args = [*common, *keep, "quant=int8"]
    fp32 = Path(runs["int8"]["lineage"]["fp32"]) / "model.onnx"
    out: dict = {"recognizer": card, "runs": runs}
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        default = Path(tmp) / "ort_default.onnx"
        out["ort_default"] = {
            "built": isolate.call("byo: onnxruntime default quantize_static", default_quantize,
                                  fp32, default, args),
            "accuracy": isolate.call("byo: evaluate the default INT8", evaluate, default, args)}
        models = {"fp32": fp32, "file as given": given, ORT_DEFAULT: default,
                  **{q: Path(runs[q]["lineage"]["candidate"]) / "model.onnx" for q in QUANTS}}
        out["timing"] = isolate.call("byo: timing side by side", timed, models, args)
    fp16 = runs["int8"]["accuracy"]["fp16"]["sequence_accuracy"]
    out["ort_default"]["drop_vs_fp16_points"] = fp16 - out["ort_default"]["accuracy"][
        "sequence_accuracy"]
    out["targets"] = targets(out)
    return out


def targets(out: dict) -> dict:
    t = {}
    for q in QUANTS:
        run = out["runs"][q]
        acc = run["accuracy"]
        drop = run["checks"].get("accuracy_drop", {})
        t[f"{q}: gate verdict (exit code)"] = [run["verdict"], run["exit_code"] == 0]
        t[f"{q}: sequence accuracy / CER of fp32, fp16, candidate"] = [
            [[acc[r]["sequence_accuracy"], acc[r]["cer"]] for r in ("fp32", "fp16", "candidate")],
            None]
        t[f"{q}: accuracy drop within the gate's budget (points)"] = [
            [drop.get("value"), drop.get("limit")], bool(drop.get("passed"))]
        for b, tb in out["timing"].items():
            sp = tb["speedup"][f"{q} vs fp32"]
            t[f"{q} batch {b}: not slower than FP32 (speedup, CI)"] = [sp, sp["ci95"][1] >= 1.0]
            d = tb["speedup"][f"{q} vs {ORT_DEFAULT}"]
            t[f"{q} batch {b}: speedup vs onnxruntime default quantize_static"] = [d, None]
    ort = out["ort_default"]
    t["onnxruntime default quantize_static: sequence accuracy / CER, drop vs fp16"] = [
        [ort["accuracy"]["sequence_accuracy"], ort["accuracy"]["cer"], ort["drop_vs_fp16_points"]],
        None]
    for b, tb in out["timing"].items():
        t[f"batch {b}: onnxruntime default quantize_static vs FP32"] = [
            tb["speedup"][f"{ORT_DEFAULT} vs fp32"], None]
        aa = tb["speedup"][f"{AA} vs int8"]["median"]
        t[f"batch {b}: A/A of the int8 artifact within 3 %"] = [aa, abs(aa - 1) <= 0.03]
    return t


def table(out: dict) -> list[str]:
    """The results page's side-by-side table: accuracy and speedups of every model of the section
    (Markdown lines; empty when the section has no timing)."""
    if "timing" not in out or "runs" not in out:
        return []
    acc = out["runs"]["int8"]["accuracy"]
    rows = {"FP32 (the pipeline's optimized file)": ("fp32", acc["fp32"]),
            "FP16": (None, acc["fp16"]), "the file as given": ("file as given", None),
            "onnxruntime default quantize_static": (ORT_DEFAULT, out["ort_default"]["accuracy"]),
            **{f"pipeline quant={q} (gate {out['runs'][q]['verdict'].split(':')[0]})":
               (q, out["runs"][q]["accuracy"]["candidate"]) for q in QUANTS}}
    batches = list(out["timing"])

    def speedup(role, b, over):
        if role is None or role == over:
            return numbers.ratio(1.0) if role == over else numbers.NONE
        key = f"{role} vs {over}"
        sp = out["timing"][b]["speedup"].get(key)
        return numbers.ratio(sp["median"], sp["ci95"]) if sp else numbers.NONE

    lines = ["| model | sequence accuracy | CER | "
             + " | ".join(f"p50 b{b}" for b in batches) + " | "
             + " | ".join(f"speedup vs FP32 b{b}" for b in batches) + " | "
             + " | ".join(f"vs ORT default b{b}" for b in batches) + " |",
             "|---" * (3 + 3 * len(batches)) + "|"]
    for name, (role, a) in rows.items():
        p50 = [numbers.ms(out['timing'][b]['p50_ms'][role]) if role else "—" for b in batches]
        lines.append(f"| {name} | {numbers.percent(a['sequence_accuracy'])} | "
                     f"{numbers.percent(a['cer'])} | " if a else
                     f"| {name} | (as FP32) | | ")
        lines[-1] += " | ".join(p50) + " | " + " | ".join(
            speedup(role, b, "fp32") for b in batches) + " | " + " | ".join(
            speedup(role, b, ORT_DEFAULT) if role in QUANTS else "—" for b in batches) + " |"
    return lines + [""]


if __name__ == "__main__":  # python -m benchmarks.byo [overrides...]: this section alone
    import json
    import sys

    from benchmarks.common import cli as _cli

    print(json.dumps(section(sys.argv[1:], _cli), indent=2, default=str))
