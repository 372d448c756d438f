"""``make bench``, section ``quantization``, sub-result ``own_model``: a mobile network on which
onnxruntime's default static INT8 is slower than FP32, and what the pipeline's ``quant=int8``
makes of it.

In: nothing but the project (``model=ocr_mobile``: depthwise convs, HardSwish/HardSigmoid and
squeeze-excite, trained checkpoint committed). Out: a dict for bench.json: the pipeline run's
exit code and accuracy rows (its INT8 drop against FP16, as the gate judges it), onnxruntime's
default ``quantize_static`` (QDQ, every option at its default) of the same FP32 model scored on the
same 2,000 lines, and FP32, the default INT8 and the pipeline's INT8 timed at batch 8 in one
process, interleaved round by round on real batches (``benchmarks.common.timed``): p50 of each
and the paired speedups over FP32 with their 95 % intervals, plus the pipeline's INT8 against the default.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ARGS = ["model=ocr_mobile", "quant=int8", "registry=null"]
BATCH = 8
TARGET = "own model: ORT default slower than FP32, pipeline int8 faster within budget"


def own_model(extra: list[str] | None = None, workdir: str = "artifacts") -> dict:
    from pipeline.core import isolate
    from benchmarks.common import default_quantize, evaluate, timed
    from pipeline.engine.compose import compose

    args = [*ARGS, f"workdir={workdir}", *(extra or [])]
    proc = subprocess.run([sys.executable, "-m", "pipeline", *args], capture_output=True, text=True)
    latest = Path(workdir) / "runs" / "latest" / "report.json"
    if not latest.exists():
        raise RuntimeError(f"python -m pipeline {' '.join(args)} wrote no report (exit "
                           f"{proc.returncode}): {proc.stderr.strip()[-300:]}")
    rep = json.loads(latest.read_text())
    rows = {r["role"]: r for r in rep["rows"]}
    cfg = compose(args)
    fp32 = Path(rep["lineage"]["fp32"]["path"]) / "model.onnx"
    ours = Path(rep["lineage"]["candidate"]["path"]) / "model.onnx"
    drop = next(c for c in rep["verdict"]["checks"] if c["check"] == "accuracy_drop")
    out: dict = {"command": "python -m pipeline " + " ".join(args), "exit_code": proc.returncode,
                 "gate": rep["verdict"]["summary"],
                 "pipeline_drop_vs_fp16_points": drop["value"], "budget_points": drop["limit"],
                 "latency_exclusions": rep.get("quantization", {}).get("latency_exclusions"),
                 "latency_trial": rep.get("quantization", {}).get("latency_trial")}
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        default = Path(tmp) / "ort_default.onnx"
        isolate.call("onnxruntime default quantize_static (own model)", default_quantize, fp32,
                     default, cfg.model.source, cfg.model.calibration_samples, cfg.data_dir)
        default_metrics = isolate.call("evaluate default (own model)", evaluate, default, cfg)
        models = {"fp32": fp32, "pipeline_int8": ours, "ort_default_int8": default}
        timing = isolate.call(f"own model timing b{BATCH}", timed, models, cfg, BATCH,
                              [("ort_default_int8", "pipeline_int8")])
    metric = "sequence_accuracy"
    out["accuracy"] = {"fp32": rows["fp32"][metric], "fp16": rows["fp16"][metric],
                       "ort_default_int8": default_metrics[metric],
                       "pipeline_int8": rows["candidate"][metric]}
    out["ort_default_drop_vs_fp16_points"] = rows["fp16"][metric] - default_metrics[metric]
    out["timing_b8"] = timing
    sp = timing["speedup_vs_fp32"]
    default_slower = sp["ort_default_int8"]["ci95"][1] < 1.0
    ours_faster = sp["pipeline_int8"]["ci95"][0] > 1.0
    within = drop["value"] <= drop["limit"] + 1e-9
    out["targets"] = {TARGET: [{"ort_default_vs_fp32": sp["ort_default_int8"]["median"],
                                "pipeline_vs_fp32": sp["pipeline_int8"]["median"],
                                "pipeline_drop_points": drop["value"]},
                               default_slower and ours_faster and within]}
    return out


if __name__ == "__main__":  # python -m benchmarks.own [overrides...]: this part alone
    print(json.dumps(own_model(sys.argv[1:]), indent=2, default=str))
