"""``make bench`` section for quantization: ours against onnxruntime's defaults, side by side.

In: the lineage of a finished ``model=ocr quant=int8`` run (its optimized FP32 model, its
candidate, its prepared model). Out: a dict for bench.json:
- the pipeline's INT8 against onnxruntime's default ``quantize_static`` (QDQ, per-tensor, signed
  8-bit activations, MinMax, no pre-processing) on the same FP32 model and calibration lines: both
  accuracies, and their speed against FP32 timed in one process, interleaved (``timing``);
- ``quant=mixed`` with a 0.05-point budget: full evaluations used against the 2·log2(N)+3 limit,
  and its speed;
- calibration peak memory with 64 and with 1,024 lines (streamed: should not grow);
- ``own_model``: FP32, onnxruntime's default and the pipeline's INT8 of ``model=ocr_mobile`` (a
  MobileNetV3-style network) at batch 8 (``benchmarks/own.py``).
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

from benchmarks.common import default_quantize, evaluate, timed


def _calibration_rss(prepared: Path, cfg, samples: int) -> float:
    from pipeline.core import isolate
    from pipeline.stages.calibrate import Calibrate

    from pipeline.models import task

    split = task(cfg.model.source).split("calibration", samples, cfg.data_dir)
    stage = Calibrate(split, "percentile", 32)
    with tempfile.TemporaryDirectory(dir="artifacts") as out:
        meta = isolate.call(f"calibrate {samples}", stage.run, SimpleNamespace(model=prepared), Path(out))
    return meta["observed"]["peak_rss_mb"]


def quantization(lineage: dict, stages: list[dict]) -> dict:
    from pipeline.core import isolate
    from pipeline.engine.compose import compose

    cfg = compose(["model=ocr", "quant=int8"])
    fp32 = Path(lineage["fp32"]["path"]) / "model.onnx"
    ours = Path(lineage["candidate"]["path"]) / "model.onnx"
    prepared = Path(next(s["path"] for s in stages if s["label"] == "prepare")) / "model.onnx"
    out: dict = {}
    with tempfile.TemporaryDirectory(dir="artifacts") as tmp:
        default = Path(tmp) / "ort_default.onnx"
        isolate.call("onnxruntime default quantize_static", default_quantize, fp32, default,
                     cfg.model.source, cfg.model.calibration_samples, cfg.data_dir)
        out["accuracy"] = {"pipeline_int8": isolate.call("evaluate ours", evaluate, ours, cfg),
                           "ort_default_int8": isolate.call("evaluate default", evaluate, default, cfg),
                           "fp32": isolate.call("evaluate fp32", evaluate, fp32, cfg)}
        models = {"fp32": fp32, "pipeline_int8": ours, "ort_default_int8": default}
        out["timing"] = {str(b): isolate.call(f"timing b{b}", timed, models, cfg, b) for b in (1, 8)}
    proc = subprocess.run([sys.executable, "-m", "pipeline", "model=ocr", "quant=mixed",
                           "quant.max_accuracy_drop=0.05", "registry=null"], capture_output=True, text=True)
    import json

    rep = json.loads((Path("artifacts") / "runs" / "latest" / "report.json").read_text())
    search = rep.get("quantization", {}).get("search") or {}
    cand = next(r for r in rep["rows"] if r["role"] == "candidate")
    out["mixed"] = {"exit_code": proc.returncode, "verdict": search.get("verdict"),
                    "speedup_vs_fastest_float_b8": cand["latency"]["8"]["speedup_vs_fastest_float"]}
    rss64 = _calibration_rss(prepared, cfg, 64)
    rss1024 = _calibration_rss(prepared, cfg, 1024)
    out["calibration_peak_rss_mb"] = {"64": rss64, "1024": rss1024, "ratio": rss1024 / rss64}
    acc = out["accuracy"]
    sp8 = out["timing"]["8"]["speedup_vs_fp32"]
    v = search.get("verdict") or {}
    drop = acc["fp32"]["sequence_accuracy"] - acc["pipeline_int8"]["sequence_accuracy"]
    out["targets"] = {
        "int8 >= 2.5x faster than fp32 at batch 8": [sp8["pipeline_int8"]["median"],
                                                     sp8["pipeline_int8"]["median"] >= 2.5],
        "int8 drop <= 0.2 points (vs fp32 here; the gate uses fp16)": [drop, drop <= 0.2],
        "faster than onnxruntime's default quantize_static": [
            [sp8["pipeline_int8"]["median"], sp8["ort_default_int8"]["median"]],
            sp8["pipeline_int8"]["ci95"][0] > sp8["ort_default_int8"]["ci95"][1]],
        "mixed 0.05 budget met within 2 log2 N + 3 full evaluations": [
            [v.get("full_evaluations"), v.get("evaluation_limit")], bool(v.get("met") and v.get("within_limit"))],
        "mixed faster than fp32": [out["mixed"]["speedup_vs_fastest_float_b8"],
                                   out["mixed"]["speedup_vs_fastest_float_b8"] > 1.0],
        "calibration RSS with 1024 lines within 10 % of 64": [rss1024 / rss64, rss1024 <= 1.1 * rss64],
    }
    # A mobile network of our own (depthwise convs, HardSwish, squeeze-excite) on which
    # onnxruntime's default INT8 is slower than FP32 (benchmarks/own.py); last, because it
    # runs the CLI and so moves artifacts/runs/latest.
    from benchmarks.own import TARGET, own_model

    try:
        out["own_model"] = own_model()
        out["targets"][TARGET] = out["own_model"]["targets"][TARGET]
    except Exception as e:  # noqa: BLE001 - recorded; the numbers above still count
        out["own_model"] = {"error": f"{type(e).__name__}: {e}"}
        out["targets"][TARGET] = [None, False]
    return out
