"""zoo entry ``ddddocr_det``: the click-captcha character detector of ``ddddocr==1.6.1``, made by
others, run through the documented command line (``model=onnx metric=agreement
metric.detections=yolox``, docs/byo.md) as a user would.

In: the package, fetched at bench time (``benchmarks.zoo.fetch``): ``common_det.onnx``, what
``DdddOcr(det=True)`` loads, a YOLOX at 416 x 416 exported without its decoding, with a batch of
1 fixed in the graph (which at batch 2 folds both samples into one row: the pipeline finds that
out and runs it one sample at a time), and the package's own ``detection()``. Data: captcha-like
images made here: smooth random backgrounds with shapes and noise, 3 to 6 glyphs of digits and
capital letters in the machine's TrueType fonts, rotated and outlined, as PNG (lossless: OpenCV,
which the package decodes with, and Pillow read the same pixels).

Out: FP32 parity with the package's own code: on every image, whether the pipeline's
preprocessing (``DATA_ARGS``: its letterbox at the top-left corner, OpenCV's bilinear resize,
raw BGR pixels) makes the package's input exactly, and whether its decoding (``metric.detections=
yolox``: YOLOX's grids, objectness x class score from 0.1, suppression across classes at 0.45 in
whole pixels) of the same FP32 outputs, mapped back into the image as the server's
``image_box``, finds the package's boxes (identical after the package's integer truncation, and
within a pixel: the package maps back through the fit factor, the server through each side's own
scale). Then ``quant=int8`` and ``quant=auto``: the gate verdict with default settings, the
detection F1 against FP16 of FP32 and of each candidate, and the speedups each run timed side by
side (the auto table: every candidate on every runtime). Beside them, onnxruntime's default
``quantize_static`` of the same FP32 model on the same calibration images: its detection F1
against the same FP16 model, and it, the pipeline's INT8 and FP32 timed side by side at batch 1
in one process (``benchmarks.byo.timed``).
"""
from __future__ import annotations

import hashlib
import random
import time
from pathlib import Path

from benchmarks.zoo.ddddocr import AUTO_TIMEOUT_S, REQUIREMENT

CALIBRATION, EVALUATION = 32, 120
QUICK = (16, 48)
QUANTS = ("int8", "auto")
GLYPHS = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"
# What the package's own code does (core/detection_engine.py): cv2.imdecode (BGR), one factor
# that fits the image in 416 x 416, each side int()-truncated, cv2.resize INTER_LINEAR, pasted at
# the top-left of a 114 canvas, float32 0..255; the raw head decoded on strides 8/16/32, scores
# objectness x class from above 0.1, class-agnostic NMS at 0.45 with +1 pixel sides.
DATA_ARGS = ["data=imagefolder", "data.image.resize=letterbox", "data.image.height=416",
             "data.image.width=416", "data.image.letterbox_align=top_left",
             "data.image.letterbox_fill=114", "data.image.resampler=opencv",
             "data.image.interpolation=bilinear", "data.image.scale=1",
             "data.image.channel_order=bgr", "metric=agreement", "metric.detections=yolox",
             "metric.nms=all", "metric.score_threshold=0.1", "metric.iou_threshold=0.45"]
ROOT = Path("artifacts") / "bench-zoo" / "ddddocr_det"
SIZES = ((320, 160), (344, 384), (300, 200), (400, 240), (256, 256))


def write_captchas(folder: Path, count: int, seed: int = 0) -> Path:
    """``count`` PNGs in ``folder`` (a flat folder: no labels), made once per (count, seed)."""
    import numpy as np
    from PIL import Image, ImageDraw, ImageFilter, ImageFont

    from benchmarks.zoo import truetype_fonts

    stamp = folder / ".complete"
    if stamp.exists() and stamp.read_text() == f"{count} {seed}\n":
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    fonts = truetype_fonts()
    rnd, rng = random.Random(seed), np.random.default_rng(seed)
    for k in range(count):
        w, h = rnd.choice(SIZES)
        # a smooth background: a coarse random colour field blown up, shapes, then noise
        field = rng.integers(0, 256, (4, 6, 3), dtype=np.uint8)
        img = Image.fromarray(field).resize((w, h), Image.Resampling.BICUBIC)
        draw = ImageDraw.Draw(img)
        for _ in range(rnd.randint(3, 8)):
            x0, y0 = rnd.randint(-40, w), rnd.randint(-40, h)
            box = (x0, y0, x0 + rnd.randint(20, 160), y0 + rnd.randint(20, 120))
            fill = tuple(rnd.randint(0, 255) for _ in range(3))
            (draw.ellipse if rnd.random() < 0.5 else draw.rectangle)(box, fill=fill)
        img = img.filter(ImageFilter.GaussianBlur(rnd.uniform(0.5, 2.5)))
        noisy = np.asarray(img, np.int16) + rng.integers(-12, 13, (h, w, 3))
        img = Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8))
        for _ in range(rnd.randint(3, 6)):
            size = rnd.randint(28, 56)
            font = ImageFont.truetype(str(rnd.choice(fonts)), size)
            layer = Image.new("RGBA", (size * 2, size * 2), (0, 0, 0, 0))
            colour = tuple(rnd.randint(0, 255) for _ in range(3))
            ImageDraw.Draw(layer).text(
                (size // 2, size // 3), rnd.choice(GLYPHS), font=font, fill=(*colour, 255),
                stroke_width=rnd.choice((0, 1, 2)),
                stroke_fill=(*(255 - c for c in colour), 255))
            layer = layer.rotate(rnd.uniform(-35, 35), resample=Image.Resampling.BICUBIC)
            img.paste(layer, (rnd.randint(-size // 3, w - size), rnd.randint(-size // 3, h - size)),
                      layer)
        img.save(folder / f"{k:04d}.png")
    stamp.write_text(f"{count} {seed}\n")
    return folder


def reference(package: Path, files: list[Path]) -> dict:
    """In a child process: the package's own ``DdddOcr(det=True).detection`` of every file's
    bytes, and a digest of the input its own preprocessing makes of each."""
    import sys

    import cv2
    import numpy as np

    sys.path.insert(0, str(package))
    import ddddocr

    det = ddddocr.DdddOcr(det=True, ocr=False, show_ad=False)
    engine = det.detection_engine  # 1.6.1: the engine that holds the original preproc
    boxes, inputs = [], []
    for f in files:
        data = f.read_bytes()
        boxes.append(det.detection(data))
        image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
        made, _ = engine.preproc(image, (416, 416))
        inputs.append(hashlib.sha256(np.ascontiguousarray(made, np.float32).tobytes()).hexdigest())
    return {"boxes": boxes, "inputs": inputs}


def served(model: Path, args: list[str], files: list[Path], size: tuple[int, int]):
    """For each file, the input the pipeline's own preprocessing (the composed ``data.image``)
    makes of it and its detections as the task decodes them (``detection_head``) from the FP32
    file on onnxruntime, each box mapped back into the image as the server maps it
    (``image_box``)."""
    import onnxruntime as ort
    from PIL import Image

    from benchmarks.byo import _task
    from pipeline.data import images
    from pipeline.serve.readers import ImageSteps, in_image

    cfg, t = _task(args)
    read, prep = t.detection_head(), cfg.data.image
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    steps = ImageSteps(name, "float32", (1, 3, *size), prep)
    for f in files:
        with Image.open(f) as img:
            made = images.to_array(img.convert("RGB"), prep)
            geometry = steps.geometry(img)
        found = read.decode(session.run(None, {name: made[None]})[0][0])
        yield made, in_image({"detections": found}, geometry)["detections"]


def pipeline_detections(model: Path, args: list[str], files: list[Path]) -> dict:
    """``served``'s inputs (their digests) and boxes, truncated as the package truncates."""
    import numpy as np

    boxes, inputs = [], []
    for made, mapped in served(model, args, files, (416, 416)):
        inputs.append(hashlib.sha256(np.ascontiguousarray(made, np.float32).tobytes()).hexdigest())
        boxes.append([[int(v) for v in d["image_box"]] for d in mapped])
    return {"boxes": boxes, "inputs": inputs}


def parity(mine: dict, ref: dict) -> dict:
    """Images whose input is the package's exactly, whose boxes are, and whose boxes are within a
    pixel (the same detections, in the same order)."""
    def within(a, b):
        return len(a) == len(b) and all(abs(x - y) <= 1 for p, q in zip(a, b)
                                        for x, y in zip(p, q))

    n = len(ref["boxes"])
    same = [a == b for a, b in zip(mine["boxes"], ref["boxes"])]
    near = [within(a, b) for a, b in zip(mine["boxes"], ref["boxes"])]
    return {"images": n, "package_detections": sum(map(len, ref["boxes"])),
            "identical_inputs": sum(a == b for a, b in zip(mine["inputs"], ref["inputs"])),
            "identical_boxes": sum(same), "boxes_within_1px": sum(near),
            "agree_percent": 100.0 * sum(near) / n,
            "differ": [{"image": k, "pipeline": a, "package": b} for k, (a, b, ok) in
                       enumerate(zip(mine["boxes"], ref["boxes"], near)) if not ok][:10]}


def peer_f1(models: dict, args: list[str]) -> dict:
    """Detection F1 against the pipeline's FP16 model of each of ``models`` (role -> file) on
    the evaluation images, one at a time, preprocessed and decoded as the runs do: for a model
    the runs did not make (onnxruntime's default ``quantize_static``)."""
    import onnxruntime as ort

    from benchmarks.byo import _task
    from pipeline.metrics import detection

    cfg, t = _task(args)
    read = t.detection_head()
    ds = t.dataset(t.split("evaluation", cfg.data.evaluation_samples, cfg.data_dir))
    sessions = {role: ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
                for role, path in models.items()}
    found: dict = {role: [] for role in sessions}
    for batch in t.batches(ds, 1, sort=False):
        for role, s in sessions.items():
            found[role] += [read.decode(row) for row in s.run(None, batch.feeds)[0]]
    return {role: {"detection_f1": detection.f1(found["fp16"], f),
                   "detections_found": sum(map(len, f))}
            for role, f in found.items() if role != "fp16"}


def peer(out: dict, args: list[str], root: Path = ROOT, entry: str = "ddddocr_det") -> dict:
    """onnxruntime's ``quantize_static`` with every option at its default, of the int8 run's
    FP32 model and calibrated on its calibration images: its detection F1 against FP16, and it,
    the pipeline's INT8 and FP32 timed side by side at batch 1 (the graph's one batch size)."""
    from benchmarks import byo
    from pipeline.core import isolate

    lineage = out["runs"]["int8"]["lineage"]
    fp32, fp16 = (Path(lineage[k]) / "model.onnx" for k in ("fp32", "fp16"))
    default = root / "ort_default.onnx"
    built = isolate.call(f"zoo {entry}: onnxruntime default quantize_static",
                         byo.default_quantize, fp32, default, args)
    accuracy = isolate.call(f"zoo {entry}: the default INT8's detections", peer_f1,
                            {"fp16": fp16, byo.ORT_DEFAULT: default}, args)[byo.ORT_DEFAULT]
    models = {"fp32": fp32, byo.ORT_DEFAULT: default,
              "int8": Path(lineage["candidate"]) / "model.onnx"}
    timing = isolate.call(f"zoo {entry}: timing side by side", byo.timed, models, args,
                          ("int8",), (1,))
    return {"built": built, "accuracy": accuracy, "timing": timing}


def run_record(cli, args: list[str], timeout: float | None = None) -> dict:
    """One command line's record (``benchmarks.byo._run``, detection metrics), with the auto
    table's rows where the run chose among candidates."""
    from benchmarks import byo

    code, seconds, rep = cli(args, timeout=timeout)
    if code == 124 and not rep:
        return {"command": "python -m pipeline " + " ".join(args), "exit_code": code,
                "timed_out_after_s": timeout}
    out = byo._run(lambda a: (code, seconds, rep), args,
                   metrics=("detection_f1", "detections_found"))
    speed = next((r["latency"]["1"] for r in rep["rows"] if r["role"] == "candidate"
                  and "speedup_ci95" in r["latency"].get("1", {})), None)
    if speed:
        out["speedup_b1"] = {"median": speed["speedup_vs_fastest_float"],
                             "ci95": speed["speedup_ci95"]}
    if rep.get("auto"):
        out["auto"] = {"winner": rep["auto"]["winner"]["label"], "why": rep["auto"]["why"],
                       "table": [{k: r.get(k) for k in ("label", "candidate", "target", "p50",
                                                         "detection_f1", "accuracy_drop",
                                                         "speedup_vs_fastest_float", "passed",
                                                         "failed")}
                                 for r in rep["auto"]["table"]]}
    return out


def measure(cli, quick: bool = False) -> dict:
    from benchmarks.zoo.fetch import fetch
    from pipeline.core import isolate

    package = fetch(REQUIREMENT)
    given = package / "ddddocr" / "common_det.onnx"  # as the package ships it
    calibration, evaluation = QUICK if quick else (CALIBRATION, EVALUATION)
    folder = write_captchas(ROOT / "images", calibration + evaluation)
    files = sorted(folder.glob("*.png"))
    common = ["model=onnx", f"model.path={given}", *DATA_ARGS, f"data.path={folder}",
              f"data.calibration_samples={calibration}", f"data.evaluation_samples={evaluation}",
              "registry=null",
              # timed afresh each bench run (cached timings may come from a busier moment)
              f"bench.nonce=zoo-{time.strftime('%Y%m%dT%H%M%S')}"]
    out: dict = {"requirement": REQUIREMENT, "file": str(given), "images": len(files),
                 "data_args": DATA_ARGS, "runs": {}}
    ref = isolate.call("zoo ddddocr_det: the package's own detection", reference, package, files)
    mine = isolate.call("zoo ddddocr_det: the pipeline's preprocessing and decoding",
                        pipeline_detections, given, common, files)
    out["parity"] = parity(mine, ref)
    for q in QUANTS:
        try:
            out["runs"][q] = run_record(cli, [*common, f"quant={q}"],
                                        AUTO_TIMEOUT_S if q == "auto" else None)
        except RuntimeError as e:
            out["runs"][q] = {"error": str(e)}
    if "lineage" in out["runs"].get("int8", {}):
        out["ort_default"] = peer(out, [*common, "quant=int8"])
    out["summary"] = [summary(out)]
    out["targets"] = targets(out)
    return out


def summary(out: dict, model: str = "ddddocr common_det.onnx (YOLOX)") -> dict:
    """The results page's row (``benchmarks.zoo`` describes the keys)."""
    from benchmarks.zoo import run_rows

    runs, acc, verdict = run_rows(out["runs"], "detection_f1")
    # each run's speedup over its fastest float baseline: FP32 on onnxruntime for int8, the
    # fastest float model on any runtime for auto (named as the results table reads it)
    speedup = {f"{q} vs {'FP32' if q == 'int8' else 'fastest float'} b1": r["speedup_b1"]
               for q, r in runs.items() if "speedup_b1" in r}
    peer = out.get("ort_default")
    if peer:
        acc["onnxruntime quantize_static"] = peer["accuracy"]["detection_f1"]
        speedup["int8 vs quantize_static b1"] = peer["timing"]["1"]["speedup"][
            "int8 vs ort_default_int8"]
    return {"model": model, "metric": "detection F1 % vs FP16",
            "parity_percent": out["parity"]["agree_percent"], "verdict": verdict,
            "accuracy": acc, "speedup": speedup}


def targets(out: dict, reference: str = "DdddOcr(det=True).detection",
            inputs: str = "inputs identical to the package's preprocessing (images)") -> dict:
    p = out["parity"]
    t: dict = {
        f"FP32 parity with {reference}: images whose boxes are within 1 px (%)":
            [p["agree_percent"], p["agree_percent"] >= 99.0],
        inputs: [p["identical_inputs"], p["identical_inputs"] == p["images"]]}
    peer = out.get("ort_default")
    if peer:
        t["onnxruntime default quantize_static: detection F1 vs FP16 (%)"] = [
            peer["accuracy"]["detection_f1"], None]
        for key, sp in peer["timing"]["1"]["speedup"].items():
            t[f"batch 1, side by side: {key} (speedup, CI)"] = [sp, None]
    for q, r in out["runs"].items():
        if "verdict" not in r:
            t[f"{q}: ran"] = [r.get("error") or r.get("timed_out_after_s"), False]
            continue
        t[f"{q}: gate (default settings)"] = [r["verdict"], None]
        t[f"{q}: candidate detection F1 vs FP16 (%)"] = [
            r["accuracy"]["candidate"]["detection_f1"], None]
        if "speedup_b1" in r:
            t[f"{q}: speedup at batch 1 vs the fastest float baseline (CI)"] = [r["speedup_b1"],
                                                                                 None]
    return t
